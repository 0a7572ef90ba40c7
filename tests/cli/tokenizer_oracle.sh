#!/usr/bin/env bash
# Issue #29: `tessera tokenize` against Hugging Face's own tokenizers
# (@huggingface/tokenizers, tests/clients/tokenizer_oracle.mjs) on the real
# tokenizer.json files of Llama 2, Llama 3, Llama 3.1, Llama 3.2 and Qwen3
# (data/raw/tokenizers, from scripts/fetch-data.sh). For each, over the
# committed corpus (tests/data/tokenizer_corpus.jsonl: non-Latin scripts,
# emoji and other 4-byte characters, code with tabs and runs of spaces and
# newlines, digits, special-token text, empty input) and 40 Brown corpus
# texts: the ids with and without the post-processor's special tokens, and
# the text of those ids with and without special tokens, exactly. Then
# invalid UTF-8 on standard input, as the oracle reads it (U+FFFD), and
# bad input: one line, exit 1.
set -euo pipefail
tessera=$1; tests=$2
root=$(cd "$tests/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
toks="$root/data/raw/tokenizers"
oracle="$tests/clients/tokenizer_oracle.mjs"
[ -f "$toks/llama3/tokenizer.json" ] || { echo "no $toks: run scripts/fetch-data.sh"; exit 1; }
[ -d "$tests/clients/node_modules/@huggingface/tokenizers" ] || { echo "no oracle: run scripts/setup.sh"; exit 1; }

# The corpus: the committed cases, then 40 Brown texts (every 12th file).
cp "$tests/data/tokenizer_corpus.jsonl" "$tmp/corpus.jsonl"
python3 - "$root/data/raw/brown" >>"$tmp/corpus.jsonl" <<'PY'
import json, os, sys
d = sys.argv[1]
names = sorted(n for n in os.listdir(d) if len(n) == 4 and n[0] == "c")[::12][:40]
for n in names:
    print(json.dumps(open(os.path.join(d, n), encoding="utf-8").read(), ensure_ascii=False))
PY
cases=$(wc -l <"$tmp/corpus.jsonl")

# compare ORACLE OURS FIELD: equal line for line, or the first difference.
compare() {
  python3 - "$@" <<'PY'
import json, sys
want = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
got = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
field, name = sys.argv[3], sys.argv[4]
if len(want) != len(got):
    sys.exit(f"{name} {field}: {len(got)} results for {len(want)} cases")
for i, (w, g) in enumerate(zip(want, got)):
    if w[field] != g:
        sys.exit(f"{name} {field}: case {i + 1} differs\n  oracle: {str(w[field])[:400]}\n  ours:   {str(g)[:400]}")
PY
}

for name in llama2 llama3 llama3_1 llama3_2 qwen3; do
  dir="$toks/$name"
  (cd "$tests/clients" && node "$oracle" "$dir") <"$tmp/corpus.jsonl" >"$tmp/want.jsonl"
  python3 -c 'import json,sys
for l in open(sys.argv[1]): print(json.dumps(json.loads(l)["ids"]))' "$tmp/want.jsonl" >"$tmp/ids.jsonl"
  "$tessera" tokenize --tokenizer "$dir" --jsonl <"$tmp/corpus.jsonl" >"$tmp/ids_ours.jsonl"
  compare "$tmp/want.jsonl" "$tmp/ids_ours.jsonl" ids "$name"
  "$tessera" tokenize --tokenizer "$dir" --jsonl --no-add-special <"$tmp/corpus.jsonl" >"$tmp/plain_ours.jsonl"
  compare "$tmp/want.jsonl" "$tmp/plain_ours.jsonl" plain "$name"
  "$tessera" tokenize --tokenizer "$dir" --jsonl --decode <"$tmp/ids.jsonl" >"$tmp/text_ours.jsonl"
  compare "$tmp/want.jsonl" "$tmp/text_ours.jsonl" text "$name"
  "$tessera" tokenize --tokenizer "$dir" --jsonl --decode --skip-special <"$tmp/ids.jsonl" >"$tmp/skip_ours.jsonl"
  compare "$tmp/want.jsonl" "$tmp/skip_ours.jsonl" skip "$name"
  # Invalid UTF-8 (a lone continuation byte, a truncated 3-byte sequence, an
  # overlong form, a surrogate, bytes past U+10FFFF) read as the oracle reads it.
  printf 'ok \x80 \xe6\x97 x\xc0\xaf y\xed\xa0\x80 z\xf5\x80 end' >"$tmp/bad.txt"
  (cd "$tests/clients" && node "$oracle" "$dir" --raw) <"$tmp/bad.txt" >"$tmp/bad_want.jsonl"
  "$tessera" tokenize --tokenizer "$dir" <"$tmp/bad.txt" >"$tmp/bad_ours.jsonl"
  compare "$tmp/bad_want.jsonl" "$tmp/bad_ours.jsonl" ids "$name (invalid UTF-8)"
  echo "$name: $cases cases equal to the oracle (ids with and without special tokens, text of the ids), and invalid UTF-8"
done

# The whole text on standard input gives the same ids as its JSONL line.
printf 'Hello  world!\n\n\tcode' | "$tessera" tokenize --tokenizer "$toks/llama3_1" >"$tmp/one.json"
[ "$(cat "$tmp/one.json")" = "[128000,9906,220,1917,2268,44443]" ] || { cat "$tmp/one.json"; exit 1; }
printf '[128000,9906,220,1917]' | "$tessera" tokenize --tokenizer "$toks/llama3_1" --decode >"$tmp/one.txt"
[ "$(cat "$tmp/one.txt")" = "<|begin_of_text|>Hello  world" ] || { cat "$tmp/one.txt"; exit 1; }
# Special-token text stays text with --split-special.
a=$(printf '<|im_start|>' | "$tessera" tokenize --tokenizer "$toks/qwen3")
b=$(printf '<|im_start|>' | "$tessera" tokenize --tokenizer "$toks/qwen3" --split-special)
[ "$a" = "[151644]" ] && [ "$b" != "$a" ] || { echo "special: $a / $b"; exit 1; }

# --chat: the template rendered as python3-jinja2 renders it under Hugging
# Face's settings (tests/reference/chat_templates.py's environment), on
# standard error; the ids are the oracle's encoding of that text without
# added special tokens (apply_chat_template(tokenize=True)).
cat >"$tmp/chat.json" <<'JSON'
{"messages": [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "Weather in Paris? ☀️"},
              {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
              {"role": "tool", "content": "{\"temp\": 21}"},
              {"role": "user", "content": "Thanks <|eot_id|> <|im_end|>"}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}],
 "date_string": "01 Dec 2026", "enable_thinking": false}
JSON
for name in llama3_2 qwen3 llama3_1; do
  "$tessera" tokenize --tokenizer "$toks/$name" --chat "$tmp/chat.json" --add-generation-prompt \
    >"$tmp/chat_ids.json" 2>"$tmp/chat_text.txt"
  python3 - "$tests/reference" "$name" "$tmp/chat.json" >"$tmp/chat_want.txt" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import chat_templates
source, special = chat_templates.load_config(sys.argv[2])
case = json.load(open(sys.argv[3], encoding="utf-8"))
extra = {k: v for k, v in case.items() if k not in ("messages", "tools", "documents")}
t = chat_templates.make_environment().from_string(source)
sys.stdout.write(t.render(messages=case["messages"], tools=case.get("tools"), documents=None,
                          add_generation_prompt=True, **{**special, **extra}))
PY
  cmp "$tmp/chat_want.txt" "$tmp/chat_text.txt" || { echo "$name: chat text differs"; diff "$tmp/chat_want.txt" "$tmp/chat_text.txt" | head; exit 1; }
  python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1], encoding="utf-8").read(), ensure_ascii=False))' \
    "$tmp/chat_want.txt" >"$tmp/chat_line.jsonl"
  (cd "$tests/clients" && node "$oracle" "$toks/$name") <"$tmp/chat_line.jsonl" >"$tmp/chat_oracle.jsonl"
  python3 -c 'import json,sys; print(json.dumps(json.loads(open(sys.argv[1]).read())))' "$tmp/chat_ids.json" \
    >"$tmp/chat_ids.jsonl"
  compare "$tmp/chat_oracle.jsonl" "$tmp/chat_ids.jsonl" plain "$name (chat)"
  echo "$name: --chat renders as jinja2 does and encodes as the oracle does ($(wc -c <"$tmp/chat_want.txt") bytes)"
done
# Bad input: one line naming what is wrong, exit 1.
expect_error() {  # PATTERN COMMAND...: fails with one line matching PATTERN
  local pattern=$1; shift
  local rc=0
  "$@" >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
  [ "$rc" = 1 ] || { echo "exit $rc, not 1: $*"; cat "$tmp/err"; exit 1; }
  [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "$pattern" "$tmp/err" || { echo "want one line /$pattern/:"; cat "$tmp/err"; exit 1; }
}
expect_error "no such file" "$tessera" tokenize --tokenizer "$tmp/missing/tokenizer.json"
expect_error "chat_template" "$tessera" tokenize --tokenizer "$toks/llama2" --chat "$tmp/chat.json"
printf '{%% for m in messages %%}[{{ m.role }}] {{ m.content }}\n{%% endfor %%}' >"$tmp/plain.jinja"
"$tessera" tokenize --tokenizer "$toks/llama2" --chat "$tmp/chat.json" --chat-template "$tmp/plain.jinja" \
  2>"$tmp/plain.txt" >/dev/null
head -1 "$tmp/plain.txt" | grep -qx "\[system\] You are terse." || { cat "$tmp/plain.txt"; exit 1; }
printf '{%% for m in messages %%}{{ m.content | wordwrap }}{%% endfor %%}' >"$tmp/bad.jinja"
expect_error "wordwrap" "$tessera" tokenize --tokenizer "$toks/qwen3" --chat "$tmp/chat.json" --chat-template "$tmp/bad.jinja"
echo '{"model": {"type": "WordPiece", "vocab": {}}}' >"$tmp/wp.json"
expect_error 'model "WordPiece" is not supported' "$tessera" tokenize --tokenizer "$tmp/wp.json"
printf '[1, 2, 999999999]' >"$tmp/ids.json"
expect_error "item 2 (999999999) is not a token id" sh -c "\"$tessera\" tokenize --tokenizer \"$toks/llama3\" --decode <\"$tmp/ids.json\""
echo "tokenizer oracle: all equal"
