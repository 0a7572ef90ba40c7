#!/usr/bin/env bash
# `tessera registry` (docs/formats/registry.md, docs/serving.md "Model
# registry"): add from a checkpoint folder and from a safetensors file (with
# --quantize int8), list, show, promote, rm; bad input gets one error line;
# kill -9 during add never leaves a listed half version and the next add
# works; a corrupt byte is refused by show and by serve naming the file; a
# hot promote while clients keep asking drops no request, and later answers
# come from the new version.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"
export OMP_NUM_THREADS=1
unset TESSERA_REGISTRY

serve_model "$tmp/m"
# A checkpoint folder too (serve_model keeps only the exported weights).
"$tessera" train --config "$tmp/m/cfg.toml" --set train.steps=2 --set train.warmup=1 --set checkpoint.every=2 \
  --set "checkpoint.dir=$tmp/ck" >/dev/null
ckpt=$tmp/ck
weights=$tmp/m/run/model.safetensors
reg=$tmp/reg
R=(--registry "$reg")

# expect_error WHAT PATTERN CMD...: exit 1 and exactly one stderr line
# "tessera: error: ..." that matches PATTERN.
expect_error() {
  local what=$1 pattern=$2; shift 2
  local rc=0
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" = 1 ] || { echo "$what: exit $rc, want 1"; cat "$tmp/err"; exit 1; }
  [ "$(wc -l <"$tmp/err")" = 1 ] || { echo "$what: want one stderr line:"; cat "$tmp/err"; exit 1; }
  grep -q "^tessera: error: .*$pattern" "$tmp/err" || { echo "$what: '$pattern' not in:"; cat "$tmp/err"; exit 1; }
}

# ---- add, list, show, promote, rm ------------------------------------------------
"$tessera" registry add tiny --from "$ckpt" "${R[@]}" >"$tmp/out"
grep -q '^added tiny:1 (fp32; ' "$tmp/out" || { cat "$tmp/out"; exit 1; }
grep -q '^promoted tiny:1$' "$tmp/out" || { echo "the first version is promoted:"; cat "$tmp/out"; exit 1; }
TESSERA_REGISTRY=$reg "$tessera" registry add tiny --from "$weights" --quantize int8 >"$tmp/out"
grep -q '^added tiny:2 (fp32, int8; ' "$tmp/out" || { cat "$tmp/out"; exit 1; }
grep -q promoted "$tmp/out" && { echo "a later version is not promoted by itself"; exit 1; }
[ -f "$reg/tiny/2/model.int8.safetensors" ] && [ -f "$reg/tiny/2/config.json" ] && [ -f "$reg/tiny/2/manifest.json" ]

"$tessera" registry list "${R[@]}" >"$tmp/list"
grep -q '^tiny:1  fp32 .*(promoted)$' "$tmp/list" || { cat "$tmp/list"; exit 1; }
grep -q '^tiny:2  fp32,int8 ' "$tmp/list" || { cat "$tmp/list"; exit 1; }
[ "$(wc -l <"$tmp/list")" = 2 ]

"$tessera" registry show tiny:2 "${R[@]}" >"$tmp/show"
grep -q '"format": "tessera-registry-version"' "$tmp/show"
grep -q '"path": "model.int8.safetensors"' "$tmp/show"
grep -q '^tiny:2: 3 files, .* every checksum matches$' "$tmp/show" || { cat "$tmp/show"; exit 1; }
"$tessera" registry show tiny "${R[@]}" | grep -q '"version": 1'

"$tessera" registry promote tiny 2 "${R[@]}" | grep -q '^promoted tiny:2$'
"$tessera" registry list tiny "${R[@]}" | grep -q '^tiny:2 .*(promoted)$'
expect_error "rm of the promoted version" "tiny:2 is the promoted version" "$tessera" registry rm tiny 2 "${R[@]}"
"$tessera" registry rm tiny:1 "${R[@]}" | grep -q '^removed tiny:1$'
[ "$("$tessera" registry list "${R[@]}" | cut -d' ' -f1)" = "tiny:2" ]
echo "add, list, show, promote, rm"

# ---- bad input: one line each ------------------------------------------------------
expect_error "no registry" "no registry given" "$tessera" registry list
expect_error "missing registry" "registry $tmp/none: no such folder" "$tessera" registry list --registry "$tmp/none"
expect_error "unknown name" "no model 'nope'" "$tessera" registry show nope "${R[@]}"
expect_error "unknown version" "model 'tiny' has no version 9" "$tessera" registry show tiny 9 "${R[@]}"
expect_error "promote unknown" "model 'tiny' has no version 9" "$tessera" registry promote tiny:9 "${R[@]}"
expect_error "rm unknown" "model 'tiny' has no version 1" "$tessera" registry rm tiny 1 "${R[@]}"
expect_error "bad name" "model name 'a/b'" "$tessera" registry add a/b --from "$weights" "${R[@]}"
expect_error "missing source" "no such file or folder" "$tessera" registry add tiny --from "$tmp/nothing" "${R[@]}"
expect_error "no version" "give the version" "$tessera" registry promote tiny "${R[@]}"
mkdir "$reg/tiny/5"
expect_error "incomplete version" "tiny/5: incomplete version (no manifest.json)" "$tessera" registry show tiny 5 "${R[@]}"
"$tessera" registry list "${R[@]}" >"$tmp/list" 2>"$tmp/err"
[ "$(cut -d' ' -f1 "$tmp/list")" = "tiny:2" ] || { echo "an incomplete version is not listed:"; cat "$tmp/list"; exit 1; }
grep -q "warning: .*tiny/5: incomplete version" "$tmp/err"
rmdir "$reg/tiny/5"
echo "bad input refused in one line"

# ---- kill -9 during add: never a half version ------------------------------------------
serve_slow_model "$tmp/big"
big=$tmp/big/run/model.safetensors
for delay in 0.05 0.3 0.6 0.9 1.2; do
  "$tessera" registry add big --from "$big" --quantize int8 "${R[@]}" >/dev/null 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # Every listed version is whole: its checksums match.
  for v in $({ "$tessera" registry list big "${R[@]}" 2>/dev/null || true; } | cut -d' ' -f1); do
    "$tessera" registry show "$v" "${R[@]}" >/dev/null 2>"$tmp/err" || { echo "after kill at $delay s, $v:"; cat "$tmp/err"; exit 1; }
  done
  for d in "$reg"/big/[0-9]*; do
    [ -e "$d" ] || continue
    [ -f "$d/manifest.json" ] || { echo "after kill at $delay s: $d has no manifest"; exit 1; }
  done
done
# (No version at all when every kill landed mid-add: list then fails.)
before=$({ "$tessera" registry list big "${R[@]}" 2>/dev/null || true; } | wc -l)
"$tessera" registry add big --from "$big" "${R[@]}" >"$tmp/out"
after=$("$tessera" registry list big "${R[@]}" | wc -l)
[ "$after" = $((before + 1)) ] || { echo "add after kills: $before -> $after versions"; exit 1; }
if ls -d "$reg"/big/.tmp-* >/dev/null 2>&1; then echo "stale temporary folders left:"; ls -a "$reg/big"; exit 1; fi
echo "kill -9 during add: $before whole versions survived 5 kills, no half version, the next add works"

# ---- a corrupt byte: refused by show and by serve, naming the file -----------------------
"$tessera" registry add bad --from "$weights" "${R[@]}" >/dev/null
python3 - "$reg/bad/1/model.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x01
open(p, "wb").write(bytes(b))
PY
expect_error "show corrupt" "bad/1/model.safetensors: xxh64 is [0-9a-f]*, manifest says [0-9a-f]* (corrupted)" \
  "$tessera" registry show bad "${R[@]}"
# serve prints its address first, then the one error line.
rc=0
"$tessera" serve --registry "$reg" --model bad --port 0 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && [ "$(grep -c '^tessera: error: ' "$tmp/err")" = 1 ] &&
  grep -q '^tessera: error: .*bad/1/model.safetensors: xxh64 is .* (corrupted)$' "$tmp/err" ||
  { echo "serve of a corrupt version: exit $rc"; cat "$tmp/err"; exit 1; }
echo "a corrupt byte is refused by show and serve"

# ---- hot promote under load ------------------------------------------------------------
"$tessera" registry add hot --from "$ckpt" "${R[@]}" >/dev/null
"$tessera" registry add hot --from "$weights" "${R[@]}" >/dev/null
serve_start srv --registry "$reg" --model hot --max-seqs 4
url=$srv_url
curl -sf "$url/v1/models" | grep -q '"id":"hot:1"'
# Four clients ask until told to stop; each records "HTTP-code model".
client() {
  local i=0
  while [ ! -e "$tmp/stop" ]; do
    curl -s -o "$tmp/c$1.body" -w '%{http_code}' -H 'Content-Type: application/json' \
      --data-binary '{"model":"hot","prompt":"the ","max_tokens":24,"ignore_eos":true}' "$url/v1/completions" \
      >"$tmp/c$1.code" || echo 000 >"$tmp/c$1.code"
    model=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("model","?"))' "$tmp/c$1.body" 2>/dev/null || echo "?")
    echo "$(cat "$tmp/c$1.code") $model" >>"$tmp/c$1.log"
    i=$((i + 1))
  done
}
for c in 1 2 3 4; do client $c & done
clients=$(jobs -p | tail -4)
sleep 1.5
# A long stream running across the swap finishes on the version it started on.
curl -sN -H 'Content-Type: application/json' \
  --data-binary '{"model":"hot","prompt":"the ","max_tokens":200,"ignore_eos":true,"stream":true}' \
  "$url/v1/completions" >"$tmp/stream" &
stream_pid=$!
for _ in $(seq 1 100); do grep -q '^data: {' "$tmp/stream" 2>/dev/null && break; sleep 0.05; done
"$tessera" registry promote hot 2 "${R[@]}" >/dev/null
for i in $(seq 1 100); do grep -q 'hot:2 now serves new requests' "$tmp/srv.log" && break; sleep 0.1; done
grep -q 'hot:2 now serves new requests' "$tmp/srv.log" || { echo "no swap:"; cat "$tmp/srv.log"; exit 1; }
# Until every client has had two more answers (the second was asked after
# the swap), at most 60 s: a loaded machine answers slowly, and a fixed
# sleep left a client with none after the swap.
declare -A seen
for c in 1 2 3 4; do seen[$c]=$(wc -l <"$tmp/c$c.log" 2>/dev/null || echo 0); done
for _ in $(seq 600); do
  behind=0
  for c in 1 2 3 4; do [ "$(wc -l <"$tmp/c$c.log" 2>/dev/null || echo 0)" -ge $((seen[$c] + 2)) ] || behind=1; done
  [ $behind = 0 ] && break
  sleep 0.1
done
touch "$tmp/stop"
wait $clients
wait $stream_pid
[ "$(tail -n 2 "$tmp/stream" | head -n 1)" = "data: [DONE]" ] && grep -q '"finish_reason":"length"' "$tmp/stream" &&
  grep -q '"model":"hot:1"' "$tmp/stream" && ! grep -q '"model":"hot:2"' "$tmp/stream" ||
  { echo "the stream across the swap did not finish on hot:1:"; tail -c 400 "$tmp/stream"; exit 1; }
cat "$tmp"/c?.log >"$tmp/all.log"
total=$(wc -l <"$tmp/all.log")
failed=$(grep -vc '^200 ' "$tmp/all.log" || true)
[ "$failed" = 0 ] || { echo "$failed of $total requests failed during the hot promote:"; grep -v '^200 ' "$tmp/all.log" | head; cat "$tmp/srv.log"; exit 1; }
grep -q '^200 hot:1$' "$tmp/all.log" || { echo "no answer from hot:1 before the promote"; exit 1; }
for c in 1 2 3 4; do
  [ "$(tail -1 "$tmp/c$c.log")" = "200 hot:2" ] || { echo "client $c's last answer is not from hot:2:"; tail -3 "$tmp/c$c.log"; exit 1; }
done
for i in $(seq 1 50); do grep -q 'serve: hot:1 unloaded' "$tmp/srv.log" && break; sleep 0.1; done
grep -q 'serve: hot:1 unloaded' "$tmp/srv.log" || { echo "hot:1 was not unloaded:"; cat "$tmp/srv.log"; exit 1; }
curl -sf "$url/v1/models" | grep -q '"id":"hot:2"'
code=$(curl -s -o "$tmp/body" -w '%{http_code}' -H 'Content-Type: application/json' \
  --data-binary '{"model":"hot:1","prompt":"a","max_tokens":2}' "$url/v1/completions")
[ "$code" = 404 ] || { echo "hot:1 after the swap: HTTP $code"; exit 1; }
serve_stop srv
echo "hot promote under load: $total requests and a stream across the swap, none failed; later ones from hot:2; hot:1 unloaded"
