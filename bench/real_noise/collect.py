"""Collect real runs of a real vLLM (CPU build, tiny model) for the noise study: appends one JSON line per
run to bench/real_noise/data/<name>.jsonl (so a chunk cut short keeps what it measured).

Sessions (default): one vLLM instance, restarted for every session, sessions in ABBA order of two arms
(A = the default --max-num-seqs 256, B = --max-num-seqs 4: a real ~2x throughput effect), K consecutive
load runs per session (run 0 is the first after the restart), a CPU hog (one busy loop) on the machine
the whole time: "a loaded 2-core machine". The ABBA order gives adjacent A-B pairs (for the A/B designs)
and adjacent A-A / B-B pairs (for the A/A designs) in one series.

    flock /tmp/kk-heavy.lock .venv/bin/python bench/real_noise/collect.py --model /tmp/kk-tiny \
        --name sessions --first 0 --sessions 8 --runs 4 --duration 6

Twins (--twins): two instances side by side (one core each, VLLM_CPU_OMP_THREADS_BIND=0 and =1), both
loaded at the same time in windows, the arms swapped between the instances at every restart (so the
core/instance effect cancels): --twin-arms AB (the effect) or AA (the A/A check).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real_vllm"))
from stack import Hog, Worker, free_port, wait_health  # noqa: E402

from knobkeeper.loadgen import run_load  # noqa: E402

ARMS = {"A": [], "B": ["--max-num-seqs", "4"]}
DATA = Path(__file__).parent / "data"


def abba(index: int) -> str:
    """A B B A A B B A ...: the arm of session `index` (0-based)."""
    return "AB"[(index % 4) in (1, 2)]


def load(url: str, args) -> dict:
    return run_load(url, args.concurrency, duration=args.duration, api="completions", model="tiny",
                    input_len=args.input_len, output_len=args.output_len, timeout_s=60)


def row_of(summary: dict) -> dict:
    return {k: summary.get(k) for k in ("output_tokens_per_s", "requests_per_s", "window_s", "completed", "errors")} | {
        "ttft_p50_ms": (summary.get("ttft_ms") or {}).get("p50"), "tpot_p50_ms": (summary.get("tpot_ms") or {}).get("p50"),
        "client_cpu_util": summary.get("client_cpu_util")}


def sessions(args, out) -> None:
    started = time.monotonic()
    per_session = None
    for index in range(args.first, args.first + args.sessions):
        if per_session and time.monotonic() - started + per_session > args.budget_s:
            print(f"budget: stopping before session {index}", flush=True)
            break
        t_session = time.monotonic()
        arm = abba(index)
        worker = Worker("single", free_port(), free_port(), args.bind, extra=ARMS[arm])
        proc = worker.start(args.model, args.work, tag=f"-s{index}")
        try:
            startup = wait_health(proc, timeout=400)
            for run in range(args.runs):
                t0 = time.time()
                summary = load(proc.url, args)
                rec = {"design": "sessions", "session": index, "arm": arm, "run": run, "t": round(t0, 2),
                       "startup_s": round(startup, 1), "hog": args.hog, "bind": args.bind,
                       "duration_s": args.duration, "concurrency": args.concurrency, **row_of(summary)}
                out.write(json.dumps(rec) + "\n")
                out.flush()
                print(json.dumps(rec), flush=True)
        finally:
            proc.stop()
        per_session = time.monotonic() - t_session


def twins(args, out) -> None:
    started = time.monotonic()
    per_session = None
    pair = args.twin_arms
    for index in range(args.first, args.first + args.sessions):
        if per_session and time.monotonic() - started + per_session > args.budget_s:
            print(f"budget: stopping before twin session {index}", flush=True)
            break
        t_session = time.monotonic()
        # arms swap between the two instances (cores) at every session
        arms = (pair[0], pair[1]) if index % 2 == 0 else (pair[1], pair[0])
        workers = [Worker(f"twin{core}", free_port(), free_port(), str(core), extra=ARMS[arm[0]])
                   for core, arm in enumerate(arms)]
        procs = [w.start(args.model, args.work, tag=f"-t{index}") for w in workers]
        try:
            startup = [wait_health(p, timeout=400) for p in procs]
            for run in range(args.runs):
                results: list[dict | None] = [None, None]

                def go(i: int) -> None:
                    results[i] = load(procs[i].url, args)

                threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
                t0 = time.time()
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                for core, (arm, summary) in enumerate(zip(arms, results)):
                    label = arm if pair != "AA" else ("A", "A2")[core if index % 2 == 0 else 1 - core]
                    rec = {"design": f"twins-{pair}", "session": index, "arm": label, "core": core, "run": run,
                           "t": round(t0, 2), "startup_s": round(startup[core], 1), "hog": args.hog,
                           "duration_s": args.duration, "concurrency": args.concurrency, **row_of(summary)}
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    print(json.dumps(rec), flush=True)
        finally:
            for p in procs:
                p.stop()
        per_session = time.monotonic() - t_session


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--name", default="sessions")
    ap.add_argument("--first", type=int, default=0, help="index of the first session (continues the ABBA order)")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--bind", default="auto", help="VLLM_CPU_OMP_THREADS_BIND of the single instance")
    ap.add_argument("--hog", type=int, default=1, help="busy loops on the machine meanwhile")
    ap.add_argument("--twins", action="store_true")
    ap.add_argument("--twin-arms", default="AB", choices=("AB", "AA"))
    ap.add_argument("--budget-s", type=float, default=780.0, help="start no session that would end past this")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kk-real-noise"))
    args = ap.parse_args()
    # `timeout` sends SIGTERM: unwind as Ctrl-C does, so the engines (own sessions) are stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    args.work.mkdir(parents=True, exist_ok=True)
    DATA.mkdir(parents=True, exist_ok=True)
    with open(DATA / f"{args.name}.jsonl", "a") as out, Hog(args.hog):
        (twins if args.twins else sessions)(args, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
