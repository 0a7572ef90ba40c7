#!/usr/bin/env bash
# `tessera dashboard` with real parts: three real training runs (a healthy
# one, one whose checkpoints at every step stall training, and one still
# running, also scraped live through its /metrics), the dashboard server, and
# headless Chromium loading the page with every other host unresolvable. The
# checkpoint alert fires for the run with slow checkpoints only (in
# /api/state, in the page and in the dashboard's /metrics, which passes
# promtool); the live run grows between polls; the page draws its charts with
# data; a screenshot is saved. `tessera report` writes one self-contained
# file that Chromium draws from file://.
set -euo pipefail
tessera=$1; tests=$2
tmp=$(mktemp -d)
source "$tests/cli/serve_common.inc"
export OMP_NUM_THREADS=1
command -v chromium >/dev/null || { echo "chromium is not installed (scripts/setup.sh installs it)"; exit 1; }

"$tessera" prepare --input /usr/share/common-licenses/{GPL-3,GPL-2,LGPL-2.1,Apache-2.0,MPL-2.0} --tokenizer byte \
  --out "$tmp/data" --val-fraction 0.2 >/dev/null
config() {  # config NAME MICRO_BATCH SEQ STEPS [EXTRA TOML]
  mkdir -p "$tmp/$1"
  cat >"$tmp/$1/cfg.toml" <<TOML
[model]
layers = 2
heads = 4
dim = 64
vocab = 256
context = 128
[data]
train = "$tmp/data/train_*.bin"
val = "$tmp/data/val_*.bin"
[train]
micro_batch = $2
seq = $3
steps = $4
eval_every = 10
eval_batches = 2
[log]
metrics = "$tmp/$1/metrics.jsonl"
[checkpoint]
dir = "$tmp/$1/run"
$5
TOML
}
config healthy 4 64 30 ""
config ckpt 1 16 30 "every = 1"
config live 8 128 100000 ""
"$tessera" train --config "$tmp/healthy/cfg.toml" >"$tmp/healthy.log" 2>&1 || { cat "$tmp/healthy.log"; exit 1; }
"$tessera" train --config "$tmp/ckpt/cfg.toml" >"$tmp/ckpt.log" 2>&1 || { cat "$tmp/ckpt.log"; exit 1; }
source "$tests/cli/ports.inc"
mport=$(free_port)
"$tessera" train --config "$tmp/live/cfg.toml" --metrics-port "$mport" >"$tmp/live.log" 2>&1 &
live_pid=$!
serve_pids+=("$live_pid")
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null 2>&1 && break; sleep 0.1; done

_start_server dashboard dash --run "$tmp/healthy" --run "$tmp/ckpt" --run "$tmp/live/metrics.jsonl" \
  --scrape "http://127.0.0.1:$mport/metrics"
# The live run's first steps, then two seconds more.
for _ in $(seq 1 100); do
  [ -s "$tmp/live/metrics.jsonl" ] && grep -q '"loss"' "$tmp/live/metrics.jsonl" && break
  sleep 0.1
done
curl -sf "$dash_url/api/state" >"$tmp/s1.json"
sleep 2
curl -sf "$dash_url/api/state" >"$tmp/s2.json"
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
s1, s2 = (json.load(open(f"{tmp}/s{i}.json")) for i in (1, 2))
alerts = {(a["alert"], a["target"]): a for a in s2["alerts"]}
ck = alerts[("checkpoint_share", f"{tmp}/ckpt")]
ok = alerts[("checkpoint_share", f"{tmp}/healthy")]
assert ck["state"] == "firing", ck
assert ok["state"] == "ok", ok
runs = {r["name"]: r for r in s2["runs"]}
assert len(runs[f"{tmp}/healthy"]["steps"]) == 30 and runs[f"{tmp}/healthy"]["evals"], "healthy run records"
n1 = len({r["name"]: r for r in s1["runs"]}[f"{tmp}/live/metrics.jsonl"]["steps"])
n2 = len(runs[f"{tmp}/live/metrics.jsonl"]["steps"])
assert n2 > n1 > 0, f"the live run did not grow between polls: {n1} -> {n2}"
t = s2["targets"][0]
assert "error" not in t and t["values"].get("tessera_train_tokens_per_second", 0) > 0, t
print(f"alerts: checkpoint share {ck['value']:.1%} fires, the healthy run's does not; live run {n1} -> {n2} steps; "
      f"scraped {len(t['values'])} series")
PY
curl -sf "$dash_url/metrics" >"$tmp/metrics"
promtool check metrics <"$tmp/metrics" || { echo "promtool check metrics failed"; exit 1; }
grep -q "^tessera_dashboard_alert{alert=\"checkpoint_share\",target=\"$tmp/ckpt\"} 1" "$tmp/metrics" ||
  { echo "/metrics lacks the firing checkpoint alert"; grep dashboard_alert "$tmp/metrics"; exit 1; }
grep -q "^tessera_dashboard_alert{alert=\"checkpoint_share\",target=\"$tmp/healthy\"} 0" "$tmp/metrics" ||
  { echo "/metrics: the healthy run's alert is not 0"; exit 1; }
echo "the dashboard's /metrics passes promtool and carries the alerts"

# The page in a real browser; every host but loopback unresolvable.
browser=(chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
         --host-resolver-rules="MAP * ~NOTFOUND , EXCLUDE 127.0.0.1" --user-data-dir="$tmp/chrome"
         --virtual-time-budget=6000)
timeout 60 "${browser[@]}" --dump-dom "$dash_url/" >"$tmp/dom.html" 2>"$tmp/chrome.log" ||
  { echo "chromium failed:"; tail -5 "$tmp/chrome.log"; exit 1; }
python3 - "$tmp/dom.html" "$tmp" <<'PY'
import re, sys
dom = open(sys.argv[1]).read()
tmp = sys.argv[2]
assert 'data-ready="1"' in dom, "the page never rendered a state: " + dom[:500]
drawn = [int(n) for n in re.findall(r'class="chart"[^>]*data-points="(\d+)"', dom) +
         re.findall(r'data-points="(\d+)"[^>]*class="chart"', dom)]
canvases = dom.count("<canvas")
assert sum(1 for n in drawn if n > 0) >= 12, f"charts with data: {drawn}"
assert canvases >= 12, f"{canvases} canvases"
assert re.search(r'<li class="firing" data-alert="checkpoint_share" data-target="' + re.escape(tmp) + '/ckpt"', dom), \
    "the page does not show the checkpoint alert firing"
print(f"chromium: {canvases} charts drawn, {sum(1 for n in drawn if n > 0)} with data; the alert shows")
PY
timeout 60 "${browser[@]}" --window-size=1500,2200 --screenshot="$tmp/dashboard.png" "$dash_url/" >/dev/null 2>&1 || true
[ -s "$tmp/dashboard.png" ] || { echo "no screenshot"; exit 1; }
mkdir -p "${TESSERA_ARTIFACTS:-$tmp/artifacts}"
cp "$tmp/dashboard.png" "${TESSERA_ARTIFACTS:-$tmp/artifacts}/dashboard.png"
echo "screenshot: ${TESSERA_ARTIFACTS:-$tmp/artifacts}/dashboard.png ($(stat -c %s "$tmp/dashboard.png") bytes)"
kill "$live_pid" 2>/dev/null || true

# ---- tessera report: one self-contained file, drawn from file:// -------------------------
"$tessera" report "$tmp/ckpt" "$tmp/healthy" --out "$tmp/report.html" >"$tmp/report.out"
grep -q "self-contained" "$tmp/report.out"
if grep -Eq '(src|href)="[^"#]' "$tmp/report.html"; then
  echo "the report loads something from outside itself:"; grep -Eo '(src|href)="[^"]*"' "$tmp/report.html" | head; exit 1
fi
timeout 60 "${browser[@]}" --dump-dom "file://$tmp/report.html" >"$tmp/report-dom.html" 2>>"$tmp/chrome.log" ||
  { echo "chromium failed on the report"; exit 1; }
python3 - "$tmp/report-dom.html" "$tmp" <<'PY'
import re, sys
dom = open(sys.argv[1]).read()
tmp = sys.argv[2]
assert 'data-ready="1"' in dom, "the report never rendered"
drawn = [int(n) for n in re.findall(r'data-points="(\d+)"', dom)]
assert sum(1 for n in drawn if n > 0) >= 8, f"report charts with data: {drawn}"
assert 'data-alert="checkpoint_share" data-target="' + tmp + '/ckpt"' in dom, "the report lacks the alert"
print(f"report: self-contained, {sum(1 for n in drawn if n > 0)} charts drawn from file://")
PY
set +e
"$tessera" report "$tmp/nothing" --out "$tmp/r2.html" 2>"$tmp/err"; rc=$?
set -e
[ $rc = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "$tmp/nothing" "$tmp/err" ||
  { echo "report of a missing run: exit $rc:"; cat "$tmp/err"; exit 1; }
echo "report of a missing run: one line naming the file"
