#!/usr/bin/env python3
"""The failover drill of hybrid serving (docs/serving.md, "Failover drill").

Starts real processes: a primary worker (`tessera serve --fault-injection`,
the "gpu" tier), a CPU worker (`tessera serve --dtype int8`, the "cpu"
tier) and `tessera route` in front of both; sends a steady load through the
router (streamed and non-streamed, completions and chat, every request
asking for exactly --max-tokens tokens with ignore_eos); and, for each fault
kind, breaks the primary, waits for the switch, heals it, waits for the
failback. Faults:
  kill          SIGKILL, then a new worker started on the same port
  stop          SIGSTOP, then SIGCONT
  error         POST /admin/fault {"fault": "error"}: 500s, then "none"
  device_error  POST /admin/fault {"fault": "device_error"}, then "none"

Checks: no request fails at the client; every stream is well-formed (one id,
chunks in order, a finish reason, usage, [DONE]) and carries exactly
max_tokens tokens; the router's /health names the cpu tier during the fault
and the gpu tier after; tessera_route_failovers_total counts each switch.
Prints one line per fault with the measurements (time from the fault to the
switch and to the first request answered by the cpu tier, latency
percentiles before, during and after, retries) and writes them as JSON
with --json. Exit 0 when every check passed, 1 otherwise.
"""
import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

from ports import free_port  # tests/cli/ports.py: outside the ephemeral range


TLS = None  # with --tls-dir: the ssl context that trusts its ca.pem


def connect(port, timeout):
    if TLS is not None:
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=TLS)
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)


def get(port, path, timeout=2.0):
    c = connect(port, timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def post(port, path, body, timeout=5.0):
    c = connect(port, timeout)
    try:
        data = json.dumps(body)
        c.request("POST", path, data, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def wait_until(what, pred, timeout):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if pred():
                return time.monotonic()
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


class Procs:
    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = {}

    def start(self, name, argv):
        log = open(os.path.join(self.logdir, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=log)
        self.procs[name] = p
        return p

    def stop_all(self):
        for p in self.procs.values():
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass


PROMPTS = ["The license", "Permission is hereby granted", "You may", "This program is free software",
           "the terms of", "Copyright", "WITHOUT ANY WARRANTY", "a copy of"]


class Load:
    """Client threads sending requests through the router, back to back."""

    def __init__(self, port, threads, max_tokens, timeout):
        self.port, self.threads, self.max_tokens, self.timeout = port, threads, max_tokens, timeout
        self.records = []  # (t_start, t_end, ok, tier, kind, error)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.workers = []

    def start(self):
        for i in range(self.threads):
            t = threading.Thread(target=self.loop, args=(i,), daemon=True)
            t.start()
            self.workers.append(t)

    def stop(self):
        self.stopping.set()
        for t in self.workers:
            t.join(timeout=self.timeout + 5)

    def loop(self, i):
        rng = random.Random(i)
        n = 0
        while not self.stopping.is_set():
            stream = n % 2 == 0
            chat = (n // 2) % 2 == 1
            n += 1
            body = {"max_tokens": self.max_tokens, "ignore_eos": True, "stream": stream,
                    "temperature": rng.choice([0, 0.8]), "seed": rng.randrange(1 << 30)}
            if chat:
                body["messages"] = [{"role": "user", "content": rng.choice(PROMPTS)}]
            else:
                body["prompt"] = rng.choice(PROMPTS)
            if stream:
                body["stream_options"] = {"include_usage": True}
            path = "/v1/chat/completions" if chat else "/v1/completions"
            t0 = time.monotonic()
            ok, tier, err = False, "", ""
            try:
                ok, tier, err = self.one(path, body, stream, chat)
            except Exception as e:  # noqa: BLE001 (any failure is a failed request)
                err = f"{type(e).__name__}: {e}"
            with self.lock:
                self.records.append((t0, time.monotonic(), ok, tier, ("stream" if stream else "plain"), err))

    def one(self, path, body, stream, chat):
        c = connect(self.port, self.timeout)
        try:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read().decode()
            tier = r.getheader("X-Tessera-Tier", "")
            if r.status != 200:
                return False, tier, f"HTTP {r.status}: {data[:200]}"
            if not stream:
                j = json.loads(data)
                got = j["usage"]["completion_tokens"]
                ch = j["choices"][0]
                text = ch["message"]["content"] if chat else ch["text"]
                if got != self.max_tokens or ch["finish_reason"] != "length" or not isinstance(text, str):
                    return False, tier, f"answer with {got} tokens, finish {ch['finish_reason']}"
                return True, tier, ""
            ok, err = self.check_stream(data, chat)
            return ok, tier, err
        finally:
            c.close()

    def check_stream(self, data, chat):
        events = [line[6:] for line in data.split("\n") if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return False, "a stream that does not end with [DONE]"
        ids, finishes, usage, choice_chunks = set(), [], None, 0
        for e in events[:-1]:
            j = json.loads(e)
            if "error" in j:
                return False, f"an error event: {e[:200]}"
            ids.add(j["id"])
            if j["choices"]:
                ch = j["choices"][0]
                choice_chunks += 1
                if finishes:
                    return False, "a chunk after the finish reason"
                if ch.get("finish_reason"):
                    finishes.append(ch["finish_reason"])
                piece = ch["delta"].get("content", "") if chat else ch["text"]
                if not isinstance(piece, str):
                    return False, "a chunk without text"
            elif j.get("usage"):
                usage = j["usage"]
        if len(ids) != 1:
            return False, f"{len(ids)} different ids in one stream"
        if finishes != ["length"]:
            return False, f"finish reasons {finishes}"
        if not usage or usage["completion_tokens"] != self.max_tokens:
            return False, f"usage {usage}, want {self.max_tokens} completion tokens"
        return True, ""


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def metric(port, name, labels):
    _, text = get(port, "/metrics")
    total = 0.0
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--model", required=True, help="the model both workers serve")
    ap.add_argument("--gpu-args", default="", help="more arguments for the primary worker")
    ap.add_argument("--cpu-args", default="--dtype int8", help="arguments for the cpu worker")
    ap.add_argument("--faults", default="kill,stop,error,device_error")
    ap.add_argument("--threads", type=int, default=4, help="client threads")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--phase", type=float, default=1.5, help="seconds of load before, during and after a fault")
    ap.add_argument("--hold-down", type=float, default=1.0)
    ap.add_argument("--logdir", default=None)
    ap.add_argument("--tls-dir", default=None,
                    help="a folder with ca.pem, server.pem and server.key (for 127.0.0.1): the workers and the "
                         "router serve HTTPS, the router talks TLS to the workers, the clients check the CA")
    ap.add_argument("--json", default=None, help="write the measurements here")
    ap.add_argument("--records", default=None, help="write every request (start, end, ok, tier, kind, error) here")
    a = ap.parse_args()

    logdir = a.logdir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"route-drill-{os.getpid()}")
    os.makedirs(logdir, exist_ok=True)
    procs = Procs(logdir)
    global TLS
    tls_args, worker_ca, scheme = [], [], "http"
    if a.tls_dir:
        import ssl
        TLS = ssl.create_default_context(cafile=os.path.join(a.tls_dir, "ca.pem"))
        tls_args = ["--tls-cert", os.path.join(a.tls_dir, "server.pem"), "--tls-key", os.path.join(a.tls_dir, "server.key")]
        worker_ca = ["--tls-worker-ca", os.path.join(a.tls_dir, "ca.pem")]
        scheme = "https"
    gpu_port, cpu_port, router_port = free_port(), free_port(), free_port()
    gpu_argv = [a.tessera, "serve", "--model", a.model, "--port", str(gpu_port), "--fault-injection",
                "--served-model-name", "drill"] + a.gpu_args.split() + tls_args
    cpu_argv = [a.tessera, "serve", "--model", a.model, "--port", str(cpu_port),
                "--served-model-name", "drill-int8"] + a.cpu_args.split() + tls_args
    failures = []
    results = []
    load = None
    try:
        procs.start("gpu", gpu_argv)
        procs.start("cpu", cpu_argv)
        for port in (gpu_port, cpu_port):
            wait_until(f"worker on {port}", lambda p=port: get(p, "/health")[0] == 200, 120)
        procs.start("router", [a.tessera, "route", "--port", str(router_port), "--served-model-name", "drill",
                               "--tier", f"gpu={scheme}://127.0.0.1:{gpu_port}",
                               "--tier", f"cpu={scheme}://127.0.0.1:{cpu_port}",
                               "--health-interval", "0.1", "--health-timeout", "0.5", "--health-failures", "2",
                               "--hold-down", str(a.hold_down), "--stall-timeout", "30"] + tls_args + worker_ca)
        wait_until("the router", lambda: get(router_port, "/health")[0] == 200, 30)

        def active():
            return json.loads(get(router_port, "/health")[1])["active_tier"]

        load = Load(router_port, a.threads, a.max_tokens, timeout=60)
        load.start()
        for fault in [f for f in a.faults.split(",") if f]:
            time.sleep(a.phase)
            retries0 = metric(router_port, "tessera_route_retries_total", {})
            t_fault = time.monotonic()
            if fault == "kill":
                procs.procs["gpu"].kill()
                procs.procs["gpu"].wait()
            elif fault == "stop":
                procs.procs["gpu"].send_signal(signal.SIGSTOP)
            elif fault in ("error", "device_error"):
                s, _ = post(gpu_port, "/admin/fault", {"fault": fault})
                if s != 200:
                    raise RuntimeError(f"/admin/fault answered {s}")
            else:
                raise SystemExit(f"unknown fault '{fault}'")
            t_switch = wait_until(f"the switch to the cpu tier ({fault})", lambda: active() == "cpu", 30)
            h = json.loads(get(router_port, "/health")[1])
            time.sleep(a.phase)
            t_heal = time.monotonic()
            if fault == "kill":
                procs.start("gpu", gpu_argv)
            elif fault == "stop":
                procs.procs["gpu"].send_signal(signal.SIGCONT)
            else:
                post(gpu_port, "/admin/fault", {"fault": "none"})
            t_back = wait_until(f"the failback to the gpu tier ({fault})", lambda: active() == "gpu", 120)
            time.sleep(a.phase)
            retries = metric(router_port, "tessera_route_retries_total", {}) - retries0
            with load.lock:
                recs = list(load.records)
            before = [e - s for s, e, ok, *_ in recs if e < t_fault and s > t_fault - a.phase]
            during = [e - s for s, e, ok, *_ in recs if e >= t_fault and s < t_back]
            after = [e - s for s, e, ok, *_ in recs if s > t_back]
            first_cpu = min([e for s, e, ok, tier, *_ in recs if ok and tier == "cpu" and e > t_fault], default=None)
            bad = [r for r in recs if not r[2] and r[0] >= t_fault - a.phase]
            r = {"fault": fault,
                 "switch_s": t_switch - t_fault,
                 "first_cpu_answer_s": None if first_cpu is None else first_cpu - t_fault,
                 "failback_s": t_back - t_heal,
                 "switch_reason": h["reason"],
                 "retries": retries,
                 "requests": {"before": len(before), "during": len(during), "after": len(after)},
                 "p50_s": {"before": percentile(before, 0.5), "during": percentile(during, 0.5),
                           "after": percentile(after, 0.5)},
                 "p99_s": {"before": percentile(before, 0.99), "during": percentile(during, 0.99),
                           "after": percentile(after, 0.99)},
                 "max_s": {"before": max(before, default=0), "during": max(during, default=0),
                           "after": max(after, default=0)}}
            results.append(r)
            print(f"{fault:13s} switch {r['switch_s']:.2f} s, first cpu answer "
                  f"{'-' if first_cpu is None else f'{first_cpu - t_fault:.2f} s'}, failback {r['failback_s']:.2f} s "
                  f"after healing; {len(during)} requests during, {retries:.0f} retried; p50/p99 before "
                  f"{r['p50_s']['before']*1e3:.0f}/{r['p99_s']['before']*1e3:.0f} ms, during "
                  f"{r['p50_s']['during']*1e3:.0f}/{r['p99_s']['during']*1e3:.0f} ms, after "
                  f"{r['p50_s']['after']*1e3:.0f}/{r['p99_s']['after']*1e3:.0f} ms; slowest during "
                  f"{r['max_s']['during']*1e3:.0f} ms; reason: {h['reason']}",
                  flush=True)
            if not during:
                failures.append(f"{fault}: no request ran during the fault")
            label = {"kill": "connection", "stop": "timeout", "error": "http_5xx", "device_error": "device_error"}[fault]
            if fault in ("kill", "stop") and h["reason"].find("gpu worker") < 0:
                failures.append(f"{fault}: /health reason '{h['reason']}' does not name the gpu worker")
            n = metric(router_port, "tessera_route_failovers_total", {"from": "gpu", "to": "cpu"})
            if n < len(results):
                failures.append(f"{fault}: tessera_route_failovers_total{{from=gpu,to=cpu}} is {n}")
            if fault in ("error", "device_error") and \
                    metric(router_port, "tessera_route_failovers_total", {"from": "gpu", "reason": label}) < 1:
                failures.append(f"{fault}: no failover with reason {label}")
            for rec in bad:
                failures.append(f"{fault}: a {rec[4]} request failed: {rec[5]}")
        load.stop()
        recs = load.records
        print(f"{len(recs)} requests, {sum(1 for r in recs if not r[2])} failed, "
              f"{sum(1 for r in recs if r[3] == 'cpu')} answered by the cpu tier", flush=True)
        if len(recs) == 0:
            failures.append("no request was sent")
        for rec in recs:
            if not rec[2] and f"a {rec[4]} request failed: {rec[5]}" not in " ".join(failures):
                failures.append(f"a {rec[4]} request failed: {rec[5]}")
        if metric(router_port, "tessera_route_failovers_total", {"from": "cpu", "to": "gpu", "reason": "recovered"}) < \
                len(results):
            failures.append("tessera_route_failovers_total{from=cpu,to=gpu,reason=recovered} misses a failback")
    except Exception as e:  # noqa: BLE001
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        procs.stop_all()
    if a.records:
        with open(a.records, "w") as f:
            t0 = min((r[0] for r in load.records), default=0)
            for r in load.records:
                f.write(json.dumps([round(r[0] - t0, 4), round(r[1] - t0, 4)] + list(r[2:])) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "failures": failures}, f, indent=1)
    for f in failures:
        print("FAIL " + f, flush=True)
    if failures:
        print(f"logs: {logdir}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
