"""Median whole-process time of `knobs`, `log` and `show` on a repo with 10,000 entries.

Target: under 1 s each on a 2-core machine. The first run after a change fills the entries
cache (.git/knobkeeper/entries.json); it is timed apart as the cold figure.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, time_command, write_entries

from tests.infra import make_infra_repo

KNOBS = [
    ("SGLANG_SM120_MMA_TARGET_CTAS", "decode", [128, 256, 512, 1024]),
    ("NCCL_DEBUG", "prefill", ["INFO", "WARN"]),
    ("SGLANG_DISAGGREGATION_QUEUE_SIZE", "decode", [4, 8, 16]),
    ("KNOBKEEPER_SPLITKV_TARGET_CTAS", "decode", [256, 512]),
]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kk-bench-"))
    try:
        project = make_infra_repo(tmp)
        ids = write_entries(project, 10_000, KNOBS)
        kk = [str(Path(sys.executable).parent / "knobkeeper")]
        repo = ["--repo", str(project.root)]
        import subprocess

        start = time.perf_counter()
        subprocess.run([*kk, "knobs", *repo], capture_output=True, check=True)
        cold = time.perf_counter() - start
        print(f"entries: {len(ids)}  (cold `knobs`, parsing every file into the cache: {cold:.3f} s)")
        for name, args in (("knobs", ["knobs"]), ("log", ["log"]), ("log KNOB --json", ["log", KNOBS[0][0], "--json"]),
                           ("show", ["show", ids[5000]])):
            median, samples = time_command([*kk, *args, *repo])
            verdict = "OK" if median < 1.0 else "OVER TARGET"
            print(f"{name:>16}: median {median:.3f} s over {len(samples)} runs  [{verdict}, target < 1 s]")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
