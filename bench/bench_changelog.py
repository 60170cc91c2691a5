"""Median whole-process time of `knobs`, `log` and `show` on a repo with 10,000 entries.

Target: under 1 s each on a 2-core machine. The first run after a change fills the entries
cache (.git/knobkeeper/entries.json); it is timed apart as the cold figure.

Then the same 10,000 entries as 10,000 commits (one entry each, via git fast-import): the
history order (changelog/order.py) diffs every commit once, cold, and caches each commit's
contribution; `knobs` after one more commit must stay under the target.
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
        history(tmp, kk)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def history(tmp: Path, kk: list[str]) -> None:
    import subprocess

    project = make_infra_repo(tmp, name="history")
    write_entries(project, 10_000, KNOBS)  # files + one commit; rewritten below as one commit each
    root = str(project.root)
    files = sorted(project.entries_dir.glob("*.toml"))
    base = subprocess.run(["git", "-C", root, "rev-parse", "HEAD~1"], capture_output=True, text=True).stdout.strip()
    stream = [f"reset refs/heads/main\nfrom {base}\n"]
    for i, path in enumerate(files):
        data = path.read_bytes()
        stream.append(f"commit refs/heads/main\ncommitter Bench <b@example.com> {1_700_000_000 + i} +0000\n"
                      f"data 5\nentry\nM 644 inline changelog/entries/{path.name}\ndata {len(data)}\n")
        stream.append(data.decode() + "\n")
    knobs = project.knobs_path.read_bytes()
    stream.append(f"commit refs/heads/main\ncommitter Bench <b@example.com> 1800000000 +0000\ndata 5\nknobs\n"
                  f"M 644 inline inventory/knobs.toml\ndata {len(knobs)}\n{knobs.decode()}\n")
    subprocess.run(["git", "-C", root, "fast-import", "--quiet", "--force"], input="".join(stream).encode(), check=True)
    subprocess.run(["git", "-C", root, "reset", "-q", "--hard", "main"], check=True)
    repo = ["--repo", root]
    start = time.perf_counter()
    subprocess.run([*kk, "knobs", *repo], capture_output=True, check=True)
    print(f"history of 10,001 commits: cold `knobs` (every commit diffed once): {time.perf_counter() - start:.3f} s")
    median, samples = time_command([*kk, "knobs", *repo])
    print(f"{'knobs':>16}: median {median:.3f} s over {len(samples)} runs  [{'OK' if median < 1.0 else 'OVER TARGET'}, target < 1 s]")
    subprocess.run([*kk, "set", "NCCL_DEBUG=TRACE", "--role", "prefill", "--reason", "one more", *repo],
                   capture_output=True, check=True)
    start = time.perf_counter()
    subprocess.run([*kk, "knobs", *repo], capture_output=True, check=True)
    after = time.perf_counter() - start
    print(f"{'after a commit':>16}: {after:.3f} s  [{'OK' if after < 1.0 else 'OVER TARGET'}, target < 1 s]")


if __name__ == "__main__":
    main()
