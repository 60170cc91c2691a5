"""Split-KV decode attention: kernel time, HBM bandwidth and SDPA side by side, per target CTAs.

A thin wrapper over `python -m knobkeeper_kernels.bench` (the kernels are engine-side, their own
package). With a CUDA device it runs the issue's sweep (targets 128,256,512,1024; batch
1,16,64,96; context 4096,32768) and writes evidence into bench/out/kernels/; without one it
runs the smoke mode in Triton's CPU interpreter (tiny sizes: proves the path, not performance).
Extra arguments are passed through, e.g. `bench/bench_kernels.py --smoke`.

The full device check (tests on CUDA, per-shape tuning, the issue's TARGET_CTAS sweep at GQA 8 up
to 128k context, evidence.tar) is `make gpu-check`: see kernels/README.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    has_gpu = probe.stdout.strip() == "True"
    args = list(argv)
    if not has_gpu and "--smoke" not in args:
        print("no CUDA device: smoke mode in the Triton interpreter (figures are not performance)")
        args.append("--smoke")
    if "--out" not in args:
        args += ["--out", str(ROOT / "bench" / "out" / "kernels")]
    return subprocess.run([sys.executable, "-m", "knobkeeper_kernels.bench", *args], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
