// The dashboard page (and, with the state inline, `tessera report`'s page):
// polls /api/state every 2 s and draws, with uPlot, each
// run's metrics file (loss, validation loss, tokens/s, MFU, the step-time
// breakdown, all-reduce bus bandwidth against the link, device utilisation,
// checkpoint stall share) and each scraped endpoint's series over
// the time the page has been open. Each chart's element carries
// data-points (the points drawn), which the tests read.
"use strict";

const POLL_MS = 2000;
const charts = new Map();  // id -> {plot, el}
const history = new Map(); // target url -> {t: [], series: {key: []}}

function chart(parent, id, title, labels, data, opts = {}) {
  let c = charts.get(id);
  const points = data.length > 1 ? data[0].length * (data.length - 1) : 0;
  if (!c) {
    const el = document.createElement("div");
    el.className = "chart";
    el.id = id;
    const h = document.createElement("h3");
    h.textContent = title;
    el.appendChild(h);
    parent.appendChild(el);
    const colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];
    const series = [{label: opts.x || "step"}].concat(labels.map((l, i) => ({
      label: l, stroke: colors[i % colors.length], width: 1.5, fill: opts.fill ? colors[i % colors.length] + "33" : undefined,
    })));
    const plot = new uPlot({width: 460, height: 220, series, scales: {x: {time: !!opts.time}},
                            axes: [{}, {size: 64}]}, data, el);
    c = {plot, el};
    charts.set(id, c);
  } else {
    c.plot.setData(data);
  }
  c.el.dataset.points = String(points);
}

function section(root, id, title) {
  let s = document.getElementById(id);
  if (!s) {
    s = document.createElement("div");
    s.id = id;
    const h = document.createElement("h2");
    h.textContent = title;
    s.appendChild(h);
    const c = document.createElement("div");
    c.className = "charts";
    s.appendChild(c);
    root.appendChild(s);
  }
  return s.querySelector(".charts");
}

function col(rows, key) { return rows.map(r => (r[key] === undefined ? null : r[key])); }

function drawRun(run, i) {
  const box = section(document.getElementById("runs"), "run" + i, "Run " + run.name);
  const s = run.steps;
  const steps = col(s, "step");
  // Validation loss at its own steps, aligned on the training steps.
  const val = new Map(run.evals.map(e => [e.step, e.val_loss]));
  chart(box, "run" + i + "-loss", "loss", ["train loss", "val loss"], [steps, col(s, "loss"), steps.map(x => val.has(x) ? val.get(x) : null)]);
  chart(box, "run" + i + "-tps", "tokens/s", ["tokens/s"], [steps, col(s, "tokens_per_s")]);
  chart(box, "run" + i + "-mfu", "MFU", ["mfu"], [steps, col(s, "mfu")]);
  // The step-time breakdown, stacked: each line is the sum of those below.
  const parts = ["compute_ms", "comm_ms", "bubble_ms", "p2p_ms"];
  let acc = s.map(() => 0);
  const stacked = parts.map(p => (acc = acc.map((a, k) => a + (s[k][p] || 0))));
  chart(box, "run" + i + "-parts", "step time (ms), stacked", ["compute", "+ communication", "+ bubble", "+ p2p"],
        [steps].concat(stacked), {fill: true});
  // Network: the all-reduce's achieved bus bandwidth against the link's
  // speed (both Gbit/s), when the run had more than one rank.
  if (s.some(r => r.busbw_all_reduce_gbps !== undefined)) {
    chart(box, "run" + i + "-busbw", "all-reduce bus bandwidth vs link (Gbit/s)", ["busbw", "link"],
          [steps, col(s, "busbw_all_reduce_gbps"), col(s, "link_gbps")]);
  }
  if (s.some(r => r.gpu_util !== undefined)) {
    chart(box, "run" + i + "-gpu", "device utilisation", ["gpu util"], [steps, col(s, "gpu_util")]);
  }
  const ck = run.checkpoints.filter(c => c.stall_share !== undefined);
  chart(box, "run" + i + "-ckpt", "checkpoint stall share of training time", ["stall share"],
        [col(ck, "checkpoint_step"), col(ck, "stall_share")]);
}

const TARGET_SERIES = [
  ["loss", ["tessera_train_loss"]],
  ["tokens/s", ["tessera_train_tokens_per_second"]],
  ["requests", ["tessera_requests_running", "tessera_requests_waiting"]],
  ["KV cache usage", ["tessera_kv_cache_usage_ratio"]],
  ["TTFT (s)", ["tessera_time_to_first_token_seconds:p50", "tessera_time_to_first_token_seconds:p90"]],
  ["inter-token latency (s)", ["tessera_inter_token_latency_seconds:p50", "tessera_inter_token_latency_seconds:p90"]],
  ["active tier (router)", ["tessera_route_tier_active{tier=gpu}", "tessera_route_tier_active{tier=cpu}"]],
  ["all-reduce bus bandwidth vs link (B/s)", ["tessera_train_comm_bus_bandwidth_bytes_per_second{op=all_reduce}",
                                              "tessera_train_link_speed_bytes_per_second"]],
  ["device utilisation", ["tessera_gpu_utilization_ratio"]],
];

function drawTarget(t, i) {
  const box = section(document.getElementById("targets"), "target" + i, "Endpoint " + t.url);
  if (t.error) {
    let e = box.querySelector(".error");
    if (!e) { e = document.createElement("div"); e.className = "error"; box.appendChild(e); }
    e.textContent = "unreachable: " + t.error;
    return;
  }
  let h = history.get(t.url);
  if (!h) { h = {t: [], series: {}}; history.set(t.url, h); }
  h.t.push(Date.now() / 1000);
  for (const [, keys] of TARGET_SERIES) {
    for (const k of keys) (h.series[k] = h.series[k] || []).push(t.values[k] === undefined ? null : t.values[k]);
  }
  TARGET_SERIES.forEach(([title, keys], j) => {
    if (!keys.some(k => t.values[k] !== undefined)) return;
    chart(box, "target" + i + "-" + j, title, keys, [h.t].concat(keys.map(k => h.series[k])), {time: true, x: "time"});
  });
}

function drawAlerts(alerts) {
  const ul = document.getElementById("alerts");
  ul.textContent = "";
  for (const a of alerts) {
    const li = document.createElement("li");
    li.className = a.state;
    li.dataset.alert = a.alert;
    li.dataset.target = a.target;
    li.textContent = `${a.state.toUpperCase()} ${a.alert} (${a.target}): ${a.detail || ""}`;
    ul.appendChild(li);
  }
}

function render(s, when) {
  const status = document.getElementById("status");
  s.runs.forEach(drawRun);
  s.targets.forEach(drawTarget);
  drawAlerts(s.alerts);
  const firing = s.alerts.filter(a => a.state === "firing").length;
  status.textContent = `${s.runs.length} runs, ${s.targets.length} endpoints; ${firing} alerts firing; ${when}`;
  status.dataset.ready = "1";
  status.dataset.firing = String(firing);
}

async function poll() {
  try {
    const r = await fetch("/api/state");
    render(await r.json(), "updated " + new Date().toLocaleTimeString());
  } catch (e) {
    document.getElementById("status").textContent = "cannot reach the dashboard server: " + e;
  }
  setTimeout(poll, POLL_MS);
}

// A report (tessera report) carries its state in the page: drawn once.
if (window.TESSERA_STATE) render(window.TESSERA_STATE, window.TESSERA_STATE.generated || "");
else poll();
