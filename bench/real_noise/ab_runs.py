"""Real `ab run`s on the real PD stack by hand: vLLM prefill (core 0) + decode + vllm-router (PD, Nixl),
decode's VLLM_CPU_OMP_THREADS_BIND as the knob, judged by knobkeeper's own `measure()` and judge with
the real-engine design (knobkeeper.evidence.ab.engine_design: a 5-s block warm-up recorded and not
judged, 25-s judged runs, ABBA). Appends one JSON line per ab run to data/ab_runs.jsonl (the evidence
document, the restart times, the wall time), for analyse_ab.py (A/A rate and power on real runs) and
the README's knob verdicts.

The harness switches an arm the way the deploy does: a decode whose binding already is the arm's is
left running ("unchanged"); otherwise decode is stopped, started with the arm's binding, gated on its
/health and on the router's /workers calling it healthy, as inventory/local_vllm.py's gates do.
`--aa` restarts decode at EVERY block, also for an unchanged arm (an A/A check must include the
restart-to-restart noise the A/B runs carry).

    flock /tmp/kk-heavy.lock .venv/bin/python bench/real_noise/ab_runs.py --model /tmp/kk-re/tiny \\
        --exp worse --exp better

Experiments: worse = declared "1" vs candidate "0-1" (decode spreads over both cores, onto prefill's);
better = declared "0" (decode shares prefill's core) vs candidate "1"; aa = "1" vs "1" with restarts;
seq-worse / seq-better = `worse` / `better` in the real-engine default design (sequential, cap 10): the
time to a verdict.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "real_vllm"))
sys.path.insert(0, str(ROOT))
from stack import Hog, Worker, free_port, http, start_router, wait_health  # noqa: E402

from knobkeeper.evidence.ab import Design, Harness, engine_design, measure  # noqa: E402

KNOB = "VLLM_CPU_OMP_THREADS_BIND"
DATA = Path(__file__).parent / "data"
ROUTER_FAST = ["--worker-startup-check-interval", "1", "--health-check-interval-secs", "2",
               "--health-failure-threshold", "2", "--health-success-threshold", "1", "--disable-circuit-breaker"]
EXPERIMENTS = {  # name: (baseline, candidate, fixed repeats or None = the real-engine default design)
    "worse": ("1", "0-1", 2),
    "better": ("0", "1", 2),
    "aa": ("1", "1", 3),
    "seq-worse": ("1", "0-1", None),
    "seq-better": ("0", "1", None),
}
# As inventory/local_vllm.py runs the engines: eager (vLLM 0.32.0's CPU build recompiles on every restart
# otherwise) and nixl's progress thread given 10 ms (else each idle PD worker spins a core).
EAGER = ["--enforce-eager"]
os.environ.setdefault("KNOBKEEPER_NIXL_PROGRESS_DELAY_US", "10000")


class Stack:
    """prefill + decode + router, decode restartable with another binding."""

    def __init__(self, model: Path, work: Path):
        self.model, self.work = model, work
        self.prefill_w = Worker("prefill", free_port(), free_port(), "0", EAGER)
        self.decode_port, self.decode_side = free_port(), free_port()
        self.router_port, self.metrics_port = free_port(), free_port()
        self.prefill = self.decode = self.router = None
        self.bind = None
        self.restarts: list[dict] = []
        self.tag = 0

    def start(self, bind: str) -> dict:
        t0 = time.monotonic()
        self.prefill = self.prefill_w.start(self.model, self.work)
        self._start_decode(bind)
        up = {"prefill_s": round(wait_health(self.prefill, timeout=600), 1),
              "decode_s": round(wait_health(self.decode, timeout=600), 1)}
        self.router = start_router([self.prefill.url], [self.decode.url], self.router_port, self.metrics_port,
                                   self.work, ROUTER_FAST)
        up["router_s"] = round(wait_health(self.router, "/readiness", timeout=120), 1)
        up["all_s"] = round(time.monotonic() - t0, 1)
        return up

    def _start_decode(self, bind: str) -> None:
        self.tag += 1
        worker = Worker("decode", self.decode_port, self.decode_side, bind, EAGER)
        self.decode = worker.start(self.model, self.work, tag=f"-{self.tag}")
        self.bind = bind

    def router_sees_decode(self, timeout: float = 120.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            status, text = http(self.router.url + "/workers")
            if status == 200:
                workers = json.loads(text).get("workers", [])
                if any(w.get("worker_type") == "decode" and w.get("is_healthy") for w in workers):
                    # and one request through the router (the first after a start is slow)
                    status, _ = http(self.router.url + "/v1/completions",
                                     {"model": "tiny", "prompt": "def f(x):", "max_tokens": 4}, timeout=60)
                    if status == 200:
                        return time.monotonic() - t0
            time.sleep(0.3)
        raise RuntimeError("router never saw the restarted decode healthy")

    def switch(self, bind: str, force: bool = False) -> None:
        if bind == self.bind and not force and self.decode.popen.poll() is None:
            self.restarts.append({"bind": bind, "action": "unchanged"})
            return
        t0 = time.monotonic()
        self.decode.stop(timeout=30)
        self._start_decode(bind)
        health = wait_health(self.decode, timeout=600)
        routed = self.router_sees_decode()
        self.restarts.append({"bind": bind, "action": "restarted", "decode_health_s": round(health, 1),
                              "router_after_s": round(routed, 1), "total_s": round(time.monotonic() - t0, 1)})

    def stop(self) -> None:
        for proc in (self.router, self.decode, self.prefill):
            if proc is not None:
                proc.stop(timeout=30)


def run_experiment(stack: Stack, name: str, declared: str, args) -> dict:
    base, cand, repeats = EXPERIMENTS[name]
    stack.restarts = []
    aa = base == cand
    arms = {"A": {"label": "baseline (declared)", "knobs": {KNOB: base}},
            "B": {"label": "candidate", "knobs": {KNOB: cand}}}
    design = Design([args.concurrency], repeats=repeats, api="completions", model="tiny", duration=args.duration,
                    input_len=args.input_len, output_len=args.output_len, load_options={"timeout_s": 180})
    design = engine_design(design, simulated=False)
    harness = Harness(switch_arm=lambda arm: stack.switch(arm["knobs"][KNOB], force=aa),
                      restore=lambda: stack.switch(declared, force=False), endpoint=stack.router.url)
    t0 = time.monotonic()
    doc = measure(harness, design, knob=KNOB, role="decode", arms=arms,
                  setup={"engine": "vllm", "engine_version": "0.32.0", "model": str(stack.model),
                         "extra": {"stack": "PD by hand: bench/real_vllm/stack.py, prefill bind 0"}})
    wall = time.monotonic() - t0
    [level] = doc.judgement.levels
    print(f"{name}: {base} -> {cand}: {level.verdict} effect {level.effect} p_adj {level.p_adjusted} "
          f"n {level.n_a}/{level.n_b} wall {wall:.0f}s restarts {stack.restarts}", flush=True)
    return {"experiment": name, "baseline": base, "candidate": cand, "hog": args.hog, "wall_s": round(wall, 1),
            "workload": {"concurrency": args.concurrency, "input_len": args.input_len, "output_len": args.output_len,
                         "duration_s": design.duration, "warmup_s": design.warmup_duration},
            "restarts": list(stack.restarts), "t": round(time.time(), 1), "evidence": doc.to_json()}


def bench_file(stack: Stack, folder: Path) -> None:
    """One `vllm bench serve --save-result` against the real stack's router (the real tool, the real
    engine): a fixture for `ab import --format vllm`, with the command beside it (COMMAND.md)."""
    import shlex
    import subprocess

    from stack import engine_env

    folder.mkdir(parents=True, exist_ok=True)
    name = f"decode-bind{stack.bind}-c16.json"
    cmd = [f"{engine_env().bin}/vllm", "bench", "serve", "--backend", "vllm", "--base-url", stack.router.url,
           "--endpoint", "/v1/completions", "--model", "tiny", "--tokenizer", str(stack.model),
           "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "64", "--ignore-eos",
           "--num-prompts", "64", "--max-concurrency", "16", "--seed", "7", "--save-result",
           "--result-dir", str(folder), "--result-filename", name]
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    wall = time.monotonic() - t0
    (folder / (name[:-5] + ".stdout.txt")).write_text(done.stdout)
    shown = " ".join(shlex.quote(c) for c in cmd).replace(str(ROOT) + "/", "")
    (folder / "COMMAND.md").write_text(
        "# vllm-0.32.0 against a REAL engine: what `vllm bench serve` wrote\n\n"
        f"Tool: vllm-cpu 0.32.0 (the engine environment of knobkeeper.engine.vllm_install). Date: "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}. Exit {done.returncode}, {wall:.1f} s.\n"
        f"Stack: bench/real_vllm/stack.py's PD stack (vLLM prefill bind 0, decode bind {stack.bind}, vllm-router "
        "0.1.17 over Nixl), the tiny model (`knobkeeper model tiny`, seed 0), a busy loop on the machine, "
        "other helpers' work on the 2 cores. Written by bench/real_noise/ab_runs.py --bench-file; nothing "
        "edited by hand.\n\n```\n" + shown + "\n```\n")
    print(f"vllm bench serve: exit {done.returncode}, {wall:.1f} s -> {folder / name}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--exp", action="append", choices=sorted(EXPERIMENTS), required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--duration", type=float, default=None, help="seconds per judged run (default: the real "
                    "engine's, defaults.REAL_RUN_S)")
    ap.add_argument("--hog", type=int, default=1, help="busy loops on the machine meanwhile (a loaded machine)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kk-re/work"))
    ap.add_argument("--out", default="ab_runs")
    ap.add_argument("--bench-file", type=Path, default=None,
                    help="after the experiments: one real `vllm bench serve --save-result` into this folder")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    args.work.mkdir(parents=True, exist_ok=True)
    DATA.mkdir(parents=True, exist_ok=True)
    first = EXPERIMENTS[args.exp[0]][0]
    stack = Stack(args.model, args.work)
    try:
        up = stack.start(first)
        print(f"stack up: {up}", flush=True)
        with open(DATA / f"{args.out}.jsonl", "a") as out, Hog(args.hog):
            for name in args.exp:
                declared = EXPERIMENTS[name][0]
                stack.switch(declared)          # the experiment's declared state, before its clock starts
                row = run_experiment(stack, name, declared, args)
                row["stack_up"] = up
                out.write(json.dumps(row) + "\n")
                out.flush()
            if args.bench_file is not None:
                bench_file(stack, args.bench_file)
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
