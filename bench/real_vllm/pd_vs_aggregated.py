"""PD (prefill + decode over NixlConnector behind vllm-router) vs a single aggregated vLLM instance, on
this machine's 2 cores, at concurrency 4 and 16 (issue 23's benchmark). Writes
bench/real_vllm/results/pd_vs_aggregated.json and prints a table of medians.

    flock /tmp/kk-heavy.lock .venv/bin/python bench/real_vllm/pd_vs_aggregated.py --model /tmp/tiny

The three setups are up together for the whole run (4 vLLM processes, ~3 GB each) and are loaded one
at a time, in an order rotated every round, so a slow stretch of the machine falls on each setup in
turn rather than on whichever came last ("side by side in one run"):

  pd          prefill on core 0, decode on core 1 (inventory/local_vllm.py's layout), through the router
  agg-1core   one instance on core 1: the same engine resources as ONE of PD's workers
  agg-2core   one instance on cores 0-1: the same hardware as the whole PD stack

Every instance runs as the local inventory runs it: eager (`--enforce-eager`), 1 GiB of KV cache, and
nixl's progress thread given 10 ms (KNOBKEEPER_NIXL_PROGRESS_DELAY_US, else each PD worker spins a
core). Each measurement: a 5-s warm-up load, then a --duration-s judged window (knobkeeper.loadgen,
completions API, --input-len in / --output-len out).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time
from pathlib import Path

from stack import Worker, free_port, start_router, wait_health

from knobkeeper.loadgen import run_load  # noqa: E402

EAGER = ["--enforce-eager"]


def measure(url: str, concurrency: int, args) -> dict:
    common = dict(api="completions", model="tiny", input_len=args.input_len, output_len=args.output_len,
                  timeout_s=120)
    run_load(url, concurrency, duration=5, **common)                 # warm-up: measured, not kept
    s = run_load(url, concurrency, duration=args.duration, **common)
    return {"output_tokens_per_s": round(s["output_tokens_per_s"], 1), "completed": s["completed"],
            "errors": s["errors"], "ttft_p50_ms": round((s["ttft_ms"] or {}).get("p50", 0), 1),
            "tpot_p50_ms": round((s["tpot_ms"] or {}).get("p50", 0), 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--work", type=Path, default=Path("/tmp/kk-pd-vs-agg"))
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "pd_vs_aggregated.json")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    os.environ["KNOBKEEPER_NIXL_PROGRESS_DELAY_US"] = "10000"
    args.work.mkdir(parents=True, exist_ok=True)
    workers = {"prefill": Worker("prefill", free_port(), free_port(), "0", EAGER),
               "decode": Worker("decode", free_port(), free_port(), "1", EAGER),
               "agg-1core": Worker("single", free_port(), free_port(), "1", EAGER),
               "agg-2core": Worker("single", free_port(), free_port(), "0-1", EAGER)}
    procs: dict = {}
    result: dict = {"when": time.strftime("%Y-%m-%dT%H:%M:%S"), "input_len": args.input_len,
                    "output_len": args.output_len, "duration_s": args.duration, "rounds": []}
    try:
        for name, worker in workers.items():        # one at a time: four start-ups at once on 2 cores crawl
            procs[name] = worker.start(args.model, args.work, tag=f"-{name}")
            print(f"{name}: /health after {wait_health(procs[name], timeout=600):.0f} s", flush=True)
        procs["router"] = start_router([procs["prefill"].url], [procs["decode"].url], free_port(), free_port(),
                                       args.work)
        wait_health(procs["router"], "/readiness", timeout=120)
        urls = {"pd": procs["router"].url, "agg-1core": procs["agg-1core"].url,
                "agg-2core": procs["agg-2core"].url}
        setups = list(urls)
        for index in range(args.rounds):
            order = setups[index % 3:] + setups[:index % 3]
            row: dict = {"round": index + 1, "loadavg": os.getloadavg()[0]}
            for concurrency in (4, 16):
                for setup in order:
                    row[f"{setup}@{concurrency}"] = measure(urls[setup], concurrency, args)
                    print(f"round {index + 1} {setup}@{concurrency}: {row[f'{setup}@{concurrency}']}", flush=True)
            result["rounds"].append(row)
    finally:
        for proc in procs.values():
            proc.stop()

    summary = {}
    for concurrency in (4, 16):
        for setup in ("pd", "agg-1core", "agg-2core"):
            rows = [r[f"{setup}@{concurrency}"] for r in result["rounds"]]
            summary[f"{setup}@{concurrency}"] = {k: statistics.median(r[k] for r in rows)
                                                 for k in ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms")}
    result["medians"] = summary
    print(f"\nmedians of {args.rounds} rounds, {args.input_len} in / {args.output_len} out, "
          f"{args.duration:g}-s windows after a 5-s warm-up")
    print(f"{'setup':<12} {'c':>3} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12} {'vs pd':>7}")
    for concurrency in (4, 16):
        pd = summary[f"pd@{concurrency}"]["output_tokens_per_s"]
        for setup in ("pd", "agg-1core", "agg-2core"):
            m = summary[f"{setup}@{concurrency}"]
            print(f"{setup:<12} {concurrency:>3} {m['output_tokens_per_s']:>10.1f} {m['ttft_p50_ms']:>12.1f} "
                  f"{m['tpot_p50_ms']:>12.2f} {m['output_tokens_per_s'] / pd:>7.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
