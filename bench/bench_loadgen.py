"""Load generator capacity: can knobkeeper.loadgen hold concurrency 96 against the sim with CPU to spare?

Starts one decode sim (knobkeeper.sim, time scale 1, the shipped calibration, 512 target CTAs),
runs the load generator at 64/80/96 (chat API, streaming, fresh connection per request) and
prints per level: output tokens/s vs the sim model's expectation, the concurrency actually held
(Little's law: requests/s x mean end-to-end), TTFT/ITL p50, and the client's CPU use (share of one
core). The sim process is stopped by PID at the end.

    .venv/bin/python bench/bench_loadgen.py [--duration 8] [--time-scale 1.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from knobkeeper.loadgen import run_load  # noqa: E402
from tests.procs import free_port, stop, wait_http  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args(argv)
    port = free_port()
    env = {**os.environ, "SGLANG_SM120_MMA_TARGET_CTAS": "512"}
    log = Path(tempfile.mkdtemp()) / "sim.log"
    with open(log, "ab") as handle:
        proc = subprocess.Popen([sys.executable, "-m", "knobkeeper.sim", "--role", "decode", "--port", str(port),
                                 "--time-scale", str(args.time_scale), "--seed", "1", "--log-level", "warning"],
                                stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT), start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=30, proc=proc)
        print(f"loadgen vs sim decode (time scale {args.time_scale}, output {args.output_len} tokens, "
              f"{args.duration:g}s per level, fresh connection per request)")
        print(f"{'conc':>5} {'tok/s':>8} {'req/s':>7} {'held':>6} {'ttft p50':>9} {'itl p50':>8} {'errors':>6} "
              f"{'client CPU':>10}")
        for conc in (64, 80, 96):
            s = run_load(f"http://127.0.0.1:{port}", conc, duration=args.duration, input_len=64,
                         output_len=args.output_len)
            held = s["requests_per_s"] * s["e2e_ms"]["mean"] / 1000 if s["e2e_ms"] else 0.0
            ttft = f"{s['ttft_ms']['p50']:.1f}ms" if s["ttft_ms"] else "n/a"
            itl = f"{s['itl_ms']['p50']:.1f}ms" if s["itl_ms"] else "n/a"
            print(f"{conc:>5} {s['output_tokens_per_s']:>8.0f} {s['requests_per_s']:>7.1f} {held:>6.1f} "
                  f"{ttft:>9} {itl:>8} {s['errors']:>6} "
                  f"{s['client_cpu_util']:>10.0%}")
    finally:
        stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
