"""PD vs one aggregated instance on this machine (issue 23's benchmark), real vLLM, side by side in time.

    flock /tmp/kk-heavy.lock .venv/bin/python bench/real_vllm/pd_vs_aggregated.py [--repeats 3 --duration 20]

Three setups start once and stay up together (idle instances sleep since the nixl hook, so an idle one
does not slow the measured one; ~12 GB in all):

  pd           prefill (core 0) -> decode (core 1) over NixlConnector, vllm-router in PD mode in front:
               the stack inventory/local_vllm.py deploys (the same environment and bindings).
  agg-0-1      one vLLM instance, its threads bound to both cores ("0-1"): the same two cores, no
               transfer, no router.
  agg-1        one vLLM instance on one core ("1"): what one of the PD pair's cores does alone.

Then rounds: in each, every setup in turn (the order rotated each round, so that a drift of the
machine falls on all of them alike) at each concurrency, `--duration` seconds of knobkeeper's load
generator (completions, 32 prompt tokens, 64 output tokens) after a warm-up of one request per stream.
Medians of the rounds, and each setup's tokens/s over PD's in the same round (median of those ratios).
Writes bench/out/pd_vs_aggregated.json. Everything started is stopped by its PID.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stack import Worker, free_port, start_router, wait_health

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from knobkeeper.engine import tiny_model as TM  # noqa: E402
from knobkeeper.knobs.registry import cache_dir  # noqa: E402
from knobkeeper.loadgen import run_load  # noqa: E402

OUT = ROOT / "bench" / "out" / "pd_vs_aggregated.json"
# As inventory/local_vllm.py's environment: nixl's progress thread sleeps, UCX hooks without patching code.
ENV = {"KNOBKEEPER_NIXL_PROGRESS_DELAY_US": "10000", "UCX_MEM_MMAP_HOOK_MODE": "reloc"}


def model_dir() -> Path:
    path = cache_dir() / "models" / f"tiny-seed{TM.SEED}"
    if TM.is_model_dir(path) is not None:      # a reason it is not a model: build it (seconds)
        TM.build(path)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--concurrency", default="4,16")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    model = model_dir()
    work = Path(tempfile.mkdtemp(prefix="kkpd"))
    procs = []
    try:
        prefill = Worker("prefill", free_port(), free_port(), "0", env=ENV)
        decode = Worker("decode", free_port(), free_port(), "1", env=ENV)
        singles = {"agg-0-1": Worker("single", free_port(), free_port(), "0-1", env=ENV),
                   "agg-1": Worker("single", free_port(), free_port(), "1", env=ENV)}
        started, by_name = {}, {}
        for name, worker in [("prefill", prefill), ("decode", decode), *singles.items()]:
            proc = worker.start(model, work, tag=f"-{name}")   # one at a time: start-ups fight for 2 cores
            procs.append(proc)
            by_name[name] = proc
            started[name] = round(wait_health(proc, timeout=900), 1)
            print(f"{name}: healthy in {started[name]} s", flush=True)
        router = start_router([by_name["prefill"].url], [by_name["decode"].url], free_port(), free_port(), work,
                              extra=["--worker-startup-check-interval", "1"])
        procs.append(router)
        started["router"] = round(wait_health(router, "/readiness", timeout=300), 1)
        endpoints = {"pd": router.url, **{name: by_name[name].url for name in singles}}
        names = list(endpoints)
        runs = []
        for repeat in range(args.repeats):
            order = names[repeat % len(names):] + names[:repeat % len(names)]
            for c in levels:
                for name in order:
                    s = run_load(endpoints[name], c, duration=args.duration, api="completions", model="tiny",
                                 input_len=32, output_len=64, timeout_s=120)
                    row = {"repeat": repeat, "setup": name, "concurrency": c,
                           "output_tokens_per_s": round(s["output_tokens_per_s"], 1),
                           "ttft_p50_ms": round(s["ttft_ms"]["p50"], 1) if s.get("ttft_ms") else None,
                           "tpot_p50_ms": round(s["tpot_ms"]["p50"], 2) if s.get("tpot_ms") else None,
                           "completed": s["completed"], "errors": s["errors"]}
                    runs.append(row)
                    print(row, flush=True)
        summary = {}
        for c in levels:
            for name in names:
                mine = [r for r in runs if r["setup"] == name and r["concurrency"] == c]
                pd = {r["repeat"]: r["output_tokens_per_s"] for r in runs if r["setup"] == "pd" and r["concurrency"] == c}
                summary[f"{name}@{c}"] = {
                    "tok_s": statistics.median(r["output_tokens_per_s"] for r in mine),
                    "ttft_p50_ms": statistics.median(r["ttft_p50_ms"] for r in mine if r["ttft_p50_ms"] is not None),
                    "tpot_p50_ms": statistics.median(r["tpot_p50_ms"] for r in mine if r["tpot_p50_ms"] is not None),
                    "vs_pd": round(statistics.median(r["output_tokens_per_s"] / pd[r["repeat"]] for r in mine), 3),
                    "errors": sum(r["errors"] for r in mine)}
        result = {"started_s": started, "repeats": args.repeats, "duration_s": args.duration, "runs": runs,
                  "summary": summary, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=1) + "\n")
        print(f"{'setup@c':<14} {'tok/s':>8} {'TTFT p50':>9} {'TPOT p50':>9} {'vs pd':>7}")
        for key, row in summary.items():
            print(f"{key:<14} {row['tok_s']:>8.1f} {row['ttft_p50_ms']:>7.1f}ms {row['tpot_p50_ms']:>7.2f}ms "
                  f"{row['vs_pd']:>6.2f}x")
        print(f"wrote {OUT}")
    finally:
        for proc in reversed(procs):
            proc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
