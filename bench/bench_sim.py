"""Benchmark of the SIMULATED engine (knobkeeper.sim): what it sustains, and what it costs in CPU.

For each time scale, each path and each concurrency, a closed loop of streaming /v1/chat/completions
clients (its own small aiohttp client) runs for --duration seconds after a warm-up; --repeats times.
Paths:
  direct   client -> one decode sim (no bootstrap fields: served whole, prefill + decode)
  router   client -> the router (--router: smg or sglang-router) --pd-disaggregation -> prefill + decode sims
--hog off,on runs every row without and with a CPU hog (one busy process per --hog-procs) beside the
stack: the sim's engine runs on a virtual clock, so its throughput should follow the model while the
CPU is merely slow.
--compare-routers measures each router engine instead: start-up to /readiness 200 (median of
--repeats starts), --router-requests streamed chat requests at concurrency 32 through it in PD mode
(req/s, errors) and its RSS after them.
Printed (medians over repeats): streamed tokens/s, requests/s (= tokens/s / output length), the model's expected tokens/s for the
same closed loop and the ratio (fidelity: ~1.0 means the sim keeps up with its own model, so it is
not the bottleneck), CPU seconds of the sim processes per 1,000 streamed tokens, and the router's
and the client's CPU for context.

    .venv/bin/python bench/bench_sim.py [--time-scales 1,0.25] [--duration 4] [--repeats 3] [--hog off,on]
    .venv/bin/python bench/bench_sim.py --compare-routers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from knobkeeper.engine.routers import ROUTERS  # noqa: E402
from knobkeeper.ports import free_port  # noqa: E402
from knobkeeper.sim.model import expected_throughput, load_effects  # noqa: E402

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a process and its reaped children, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def launch(cmd, log: Path, env=None) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def halt(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def wait_ok(url: str, proc: subprocess.Popen, timeout: float = 60, poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(poll)
    raise TimeoutError(url)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def start_router(engine: str, tmp: Path, prefill: tuple[str, int], decode: str) -> tuple[subprocess.Popen, str, float]:
    """(process, URL, seconds from launch to /readiness 200)."""
    rp, mp = free_port(), free_port()
    cmd = ROUTERS[engine].argv(sys.executable, "127.0.0.1", rp, [prefill], [decode], "round_robin", "127.0.0.1", mp)
    t0 = time.monotonic()
    proc = launch(cmd + ["--disable-circuit-breaker", "--shutdown-grace-period-secs", "1", "--log-level", "warn"],
                  tmp / f"{engine}.log")
    wait_ok(f"http://127.0.0.1:{rp}{ROUTERS[engine].endpoints.readiness}", proc, poll=0.02)
    return proc, f"http://127.0.0.1:{rp}", time.monotonic() - t0


class Stack:
    def __init__(self, tmp: Path, scale: float, router: str = "smg"):
        self.procs: list[subprocess.Popen] = []
        common = ["--time-scale", str(scale), "--seed", "11", "--run-noise", "0", "--log-level", "warning"]
        env = {KNOB: "512"}
        sim = [sys.executable, "-m", "knobkeeper.sim", "--host", "127.0.0.1"]
        self.direct_port, pp, self.bootstrap, dp = (free_port() for _ in range(4))
        self.direct = launch(sim + ["--role", "decode", "--port", str(self.direct_port), *common], tmp / "direct.log", env)
        self.prefill = launch(sim + ["--role", "prefill", "--port", str(pp), "--bootstrap-port", str(self.bootstrap),
                                     *common], tmp / "prefill.log", env)
        self.decode = launch(sim + ["--role", "decode", "--port", str(dp), *common], tmp / "decode.log", env)
        self.procs += [self.direct, self.prefill, self.decode]
        for port, p in ((self.direct_port, self.direct), (pp, self.prefill), (dp, self.decode)):
            wait_ok(f"http://127.0.0.1:{port}/health", p)
        self.prefill_url, self.decode_url = f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{dp}"
        self.router, router_url, self.router_ready_s = start_router(router, tmp, (self.prefill_url, self.bootstrap),
                                                                    self.decode_url)
        self.procs.append(self.router)
        self.urls = {"direct": f"http://127.0.0.1:{self.direct_port}", "router": router_url}
        self.sims = {"direct": [self.direct], "router": [self.prefill, self.decode]}

    def close(self) -> None:
        for p in reversed(self.procs):
            halt(p)


def start_hog(n: int) -> list[subprocess.Popen]:
    """n busy processes (one core each), as another tenant of the machine would be."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]


async def load(url: str, conc: int, warmup: float, duration: float, prompt: str, out_len: int,
               requests: int = 0) -> dict:
    """Closed loop for `duration` s after `warmup` s; with `requests`, until that many completed instead."""
    counters = {"tokens": 0, "requests": 0, "errors": 0}
    measuring = False
    enough = asyncio.Event()
    body = json.dumps({"model": "knobkeeper-sim", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": out_len, "stream": True, "ignore_eos": True}).encode()
    hdr = {"Content-Type": "application/json"}

    async def client(s: aiohttp.ClientSession):
        while True:
            try:
                async with s.post(url + "/v1/chat/completions", data=body, headers=hdr) as r:
                    if r.status != 200:
                        await r.read()
                        counters["errors"] += 1
                        await asyncio.sleep(0.05)
                        continue
                    async for line in r.content:
                        if measuring and line.startswith(b'data: {') and b'"delta":{"content":"' in line:
                            counters["tokens"] += 1
                if measuring:
                    counters["requests"] += 1
                    if requests and counters["requests"] >= requests:
                        enough.set()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                counters["errors"] += 1
                await asyncio.sleep(0.05)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False),
                                     timeout=aiohttp.ClientTimeout(total=600)) as s:
        tasks = [asyncio.ensure_future(client(s)) for _ in range(conc)]
        await asyncio.sleep(warmup)
        measuring = True
        t0, c0 = time.monotonic(), time.process_time()
        if requests:
            await asyncio.wait_for(enough.wait(), 600)
        else:
            await asyncio.sleep(duration)
        measuring = False
        elapsed, client_cpu = time.monotonic() - t0, time.process_time() - c0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {**counters, "elapsed": elapsed, "client_cpu": client_cpu}


def compare_routers(a, prompt: str) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_routers_") as tmpd:
        tmp = Path(tmpd)
        stack = Stack(tmp, 0.1, router="smg")  # the workers; routers are started beside them one at a time
        try:
            for engine in ROUTERS:
                starts = []
                for _ in range(a.repeats):
                    proc, url, ready_s = start_router(engine, tmp, (stack.prefill_url, stack.bootstrap), stack.decode_url)
                    starts.append(ready_s)
                    if len(starts) < a.repeats:
                        halt(proc)
                try:
                    res = asyncio.run(load(url, 32, 1.0, 0.0, prompt, a.output_len, requests=a.router_requests))
                    rows.append({"router": engine, "version": ROUTERS[engine].version,
                                 "ready_s": statistics.median(starts), "requests": res["requests"],
                                 "errors": res["errors"], "req_s": res["requests"] / res["elapsed"],
                                 "rss_mib": rss_mib(proc.pid)})
                finally:
                    halt(proc)
                r = rows[-1]
                print(f"{engine:14s} {r['version']:7s} ready in {r['ready_s']:.3f} s (median of {a.repeats})  "
                      f"{r['requests']} PD streamed requests at c=32: {r['req_s']:.1f} req/s, errors {r['errors']}  "
                      f"RSS {r['rss_mib']:.0f} MiB", flush=True)
        finally:
            stack.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scales", default="1,0.25", help="comma-separated --time-scale values for the sims")
    ap.add_argument("--concurrency", default="64,96")
    ap.add_argument("--duration", type=float, default=6.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--input-chars", type=int, default=512, help="prompt length in characters (~chars/4 tokens)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--router", choices=sorted(ROUTERS), default="smg", help="router engine of the router path")
    ap.add_argument("--paths", default="direct,router")
    ap.add_argument("--hog", default="off", help="comma-separated: off, on (a CPU hog beside the stack)")
    ap.add_argument("--hog-procs", type=int, default=1, help="busy processes of the hog")
    ap.add_argument("--compare-routers", action="store_true", help="measure each router engine (see above)")
    ap.add_argument("--router-requests", type=int, default=300)
    a = ap.parse_args()
    table = load_effects()
    prompt = ("knob " * (a.input_chars // 5 + 1))[: a.input_chars]
    in_tokens = (len(prompt) + 3) // 4 + 4
    if a.compare_routers:
        print(json.dumps({"bench": "sim-routers", "rows": compare_routers(a, prompt)}))
        return 0
    rows = []
    for scale in (float(x) for x in a.time_scales.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench_sim_") as tmpd:
            stack = Stack(Path(tmpd), scale, router=a.router)
            try:
                for path, conc, hog in ((p, int(c), h) for p in a.paths.split(",") for c in a.concurrency.split(",")
                                        for h in a.hog.split(",")):
                    hogs = start_hog(a.hog_procs) if hog == "on" else []
                    try:
                        runs = []
                        for _ in range(a.repeats):
                            pids = [p.pid for p in stack.sims[path]]
                            s0 = sum(cpu_s(p) for p in pids)
                            r0 = cpu_s(stack.router.pid)
                            res = asyncio.run(load(stack.urls[path], conc, a.warmup, a.duration, prompt, a.output_len))
                            # CPU over the whole run (warm-up included) vs tokens in the window: scale to the window
                            frac = res["elapsed"] / (res["elapsed"] + a.warmup)
                            sim_cpu = (sum(cpu_s(p) for p in pids) - s0) * frac
                            router_cpu = (cpu_s(stack.router.pid) - r0) * frac if path == "router" else 0.0
                            el = res["elapsed"]
                            # req/s from tokens: completions in a window come in waves (equal lengths), so
                            # counting them is quantised; in steady state req/s = tok/s / output_len.
                            runs.append({"tok_s": res["tokens"] / el, "req_s": res["tokens"] / el / a.output_len,
                                         "done_in_window": res["requests"],
                                         "sim_cpu_per_1k": 1000 * sim_cpu / max(1, res["tokens"]),
                                         "sim_cpu_util": sim_cpu / el, "router_cpu_util": router_cpu / el,
                                         "client_cpu_util": res["client_cpu"] / el, "errors": res["errors"]})
                        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                        exp = expected_throughput(conc, {KNOB: "512"}, in_tokens, a.output_len, table=table,
                                                  time_scale=scale, mode="unified" if path == "direct" else "pd")
                        row = {"time_scale": scale, "path": path, "concurrency": conc, "hog": hog, **med,
                               "model_tok_s": exp.output_tokens_per_s,
                               "fidelity": med["tok_s"] / exp.output_tokens_per_s}
                        rows.append(row)
                        print(f"scale {scale:<5g} {path:6s} c={conc:3d} hog {hog:3s}: {row['tok_s']:8.0f} tok/s "
                              f"{row['req_s']:7.1f} req/s  model {row['model_tok_s']:8.0f} tok/s "
                              f"fidelity {row['fidelity']:.3f}  sim CPU {row['sim_cpu_per_1k']:.3f} s/1k tok "
                              f"({row['sim_cpu_util']:.2f} cores)  router {row['router_cpu_util']:.2f} cores  "
                              f"client {row['client_cpu_util']:.2f} cores  errors {row['errors']:.0f}", flush=True)
                    finally:
                        for h in hogs:
                            halt(h)
            finally:
                stack.close()
    print(json.dumps({"bench": "sim", "input_tokens": in_tokens, "output_len": a.output_len,
                      "duration": a.duration, "repeats": a.repeats, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
