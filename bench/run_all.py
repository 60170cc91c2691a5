"""Run every benchmark in bench/ (bench_*.py), one after another, each printing its own figures.

    .venv/bin/python bench/run_all.py            # all
    .venv/bin/python bench/run_all.py changelog  # only bench_changelog.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Not benchmarks: bench_format_fixtures.py regenerates tests/data/bench_formats/ (installs the tools,
# runs them against the stack, ~10 min); run it by hand.
BY_HAND = {"bench_format_fixtures.py"}


def main(argv: list[str]) -> int:
    scripts = sorted(s for s in HERE.glob("bench_*.py") if s.name not in BY_HAND)
    if argv:
        scripts = [s for s in scripts if any(name in s.stem for name in argv)]
    failed = []
    for script in scripts:
        print(f"\n=== {script.name}", flush=True)
        done = subprocess.run([sys.executable, str(script)], cwd=HERE.parent)
        if done.returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
