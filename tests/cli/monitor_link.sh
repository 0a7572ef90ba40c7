#!/usr/bin/env bash
# The all-reduce bandwidth alert end to end (issue #16): 2-rank data-parallel
# training across two emulated hosts (scripts/cluster.sh, network namespaces,
# links shaped to 200 Mbit/s by tc), twice:
#  - "throttled": log.link_gbps = 2, ten times the shaped rate, so the
#    achieved all-reduce bus bandwidth is far below half the stated link;
#  - "matched":   log.link_gbps = 0.2, the shaped rate itself.
# Each run's metrics file carries the achieved busbw, the link speed and the
# bytes sent and received; `tessera dashboard --alert-busbw 0.5
# --alert-samples 3` fires the allreduce_busbw alert for the throttled run
# only, in /api/state, in its /metrics (which promtool accepts) and on the
# page as headless Chromium draws it.
set -uo pipefail
tessera=$1; tests=$2
source "$tests/cli/netns_common.inc"  # $root, $cluster; SKIP without namespaces

tmp=$(mktemp -d)
p=mon  # this test's namespaces: mon1, mon2 (and mon's switch)
source "$tests/cli/serve_common.inc"  # _start_server; its EXIT trap kills the servers
cleanup() { serve_cleanup; bash "$cluster" down --prefix $p >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1
status=0
t0=$(date +%s)
pass() { echo "ok   $1 [$(( $(date +%s) - t0 )) s]"; }
flunk() { echo "FAIL $1"; status=1; }

bash "$cluster" down --prefix $p >/dev/null 2>&1  # a previous run's leftovers
bash "$cluster" up 2 --rate 200mbit --prefix $p >/dev/null || { echo "FAIL: cluster up"; exit 1; }
"$tessera" prepare --input /usr/share/common-licenses/{GPL-3,GPL-2,Apache-2.0} --tokenizer byte --out "$tmp/data" \
  --val-fraction 0.2 >/dev/null || { echo "FAIL: prepare"; exit 1; }
# ~0.45M parameters: a 1.8 MB gradient all-reduce per step, ~70 ms at
# 200 Mbit/s, against a few ms of compute: the link is the bottleneck.
cat >"$tmp/cfg.toml" <<TOML
[model]
layers = 2
heads = 4
dim = 128
vocab = 256
context = 64
[data]
train = "$tmp/data/train_*.bin"
[train]
micro_batch = 2
seq = 32
steps = 12
eval_every = 0
[parallel]
dp = 2
timeout = 120
[checkpoint]
dir = "$tmp/run"
TOML
train() {  # train NAME LINK_GBPS
  mkdir -p "$tmp/$1"
  "$tessera" launch --netns --tcp-if 10.99.0.0/24 -n 2 --hosts "${p}1:1,${p}2:1" -- train --config "$tmp/cfg.toml" \
    --set log.link_gbps="$2" --set log.metrics="$tmp/$1/metrics.jsonl" --set checkpoint.dir="$tmp/$1/run" \
    >"$tmp/$1.log" 2>&1 || { flunk "$1: training failed:"; tail -5 "$tmp/$1.log"; return 1; }
}
train throttled 2 && train matched 0.2 || exit 1
grep -q "^link: 2 Gbit/s (log.link_gbps)" "$tmp/throttled.log" && pass "the job names its link: $(grep '^link:' "$tmp/throttled.log")" ||
  flunk "no 'link:' line in the throttled run's output"

# The metrics files: every step has the achieved busbw, the link and bytes.
python3 - "$tmp" <<'PY' || status=1
import json, sys
tmp = sys.argv[1]
for name, link in (("throttled", 2.0), ("matched", 0.2)):
    steps = [json.loads(l) for l in open(f"{tmp}/{name}/metrics.jsonl") if '"loss"' in l]
    assert len(steps) == 12, f"{name}: {len(steps)} steps"
    bw = [s["busbw_all_reduce_gbps"] for s in steps]
    assert all(abs(s["link_gbps"] - link) < 1e-6 for s in steps), f"{name}: link_gbps {steps[-1].get('link_gbps')}"
    assert all(s["comm_sent_bytes"] > 1e6 and s["comm_received_bytes"] > 1e6 for s in steps), \
        f"{name}: bytes per step {[(s['comm_sent_bytes'], s['comm_received_bytes']) for s in steps]}"
    # Shaped at 0.2 Gbit/s: the achieved figure can never be above it (a
    # little slack for clock granularity).
    assert max(bw) < 0.2 * 1.05, f"{name}: busbw above the shaped rate: {bw}"
    mean = sum(bw[2:]) / len(bw[2:])
    print(f"ok   {name}: all-reduce busbw {mean:.3f} Gbit/s (mean of steps 3-12) = {100 * mean / link:.0f}% of "
          f"the stated {link} Gbit/s link; {steps[-1]['comm_sent_bytes'] / 1e6:.2f} MB sent per step")
PY

_start_server dashboard dash --run "$tmp/throttled" --run "$tmp/matched" --alert-busbw 0.5 --alert-samples 3 ||
  { echo "FAIL: dashboard"; exit 1; }
curl -sf "$dash_url/api/state" >"$tmp/state.json"
python3 - "$tmp" <<'PY' || status=1
import json, sys
tmp = sys.argv[1]
alerts = {(a["alert"], a["target"]): a for a in json.load(open(f"{tmp}/state.json"))["alerts"]}
bad, good = alerts[("allreduce_busbw", f"{tmp}/throttled")], alerts[("allreduce_busbw", f"{tmp}/matched")]
assert bad["state"] == "firing", bad
assert good["state"] == "ok", good
assert alerts[("device_utilization", f"{tmp}/matched")]["state"] == "unknown"  # a CPU run
print(f"ok   /api/state: throttled fires ({bad['detail']}); matched does not ({good['detail']})")
PY
curl -sf "$dash_url/metrics" >"$tmp/dash.prom"
promtool check metrics <"$tmp/dash.prom" || flunk "promtool check metrics on the dashboard's /metrics"
if grep -q "^tessera_dashboard_alert{alert=\"allreduce_busbw\",target=\"$tmp/throttled\"} 1" "$tmp/dash.prom" &&
   grep -q "^tessera_dashboard_alert{alert=\"allreduce_busbw\",target=\"$tmp/matched\"} 0" "$tmp/dash.prom"; then
  pass "dashboard /metrics: allreduce_busbw 1 for the throttled run, 0 for the matched one"
else flunk "dashboard /metrics:"; grep allreduce "$tmp/dash.prom"; fi

# The page in headless Chromium, every host but loopback unresolvable.
if command -v chromium >/dev/null; then
  timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
    --host-resolver-rules="MAP * ~NOTFOUND , EXCLUDE 127.0.0.1" --user-data-dir="$tmp/chrome" \
    --virtual-time-budget=5000 --dump-dom "$dash_url/" >"$tmp/dom.html" 2>"$tmp/chrome.log" ||
    flunk "chromium failed: $(tail -2 "$tmp/chrome.log")"
  python3 - "$tmp" <<'PY' || status=1
import re, sys
tmp = sys.argv[1]
dom = open(f"{tmp}/dom.html").read()
assert 'data-ready="1"' in dom, "the page never rendered"
assert f'<li class="firing" data-alert="allreduce_busbw" data-target="{tmp}/throttled"' in dom, "no firing alert"
assert f'<li class="ok" data-alert="allreduce_busbw" data-target="{tmp}/matched"' in dom, "matched not ok"
for i in (0, 1):
    el = re.search(r'<div[^>]*id="run%d-busbw"[^>]*>' % i, dom)
    assert el, f"no busbw chart for run {i}"
    points = re.search(r'data-points="(\d+)"', el.group(0))
    assert points and int(points.group(1)) > 0, f"run {i}'s busbw chart is empty: {el.group(0)}"
print("ok   chromium: the page shows the alert firing for the throttled run only, and both busbw charts")
PY
else
  flunk "chromium is not installed (scripts/setup.sh installs it)"
fi
echo "took $(( $(date +%s) - t0 )) s"
exit $status
