"""`knobkeeper report` at scale: whole-process render time and file size at 1,000 and 10,000
entries (with 50/500 incidents, 20/200 deploy records, 50 evidence files: bench_audit's
generator), and headless Chromium's load time for the 10k page (DevTools navigation timing).

Targets: render < 3 s, file < 5 MB, browser load < 2 s. A screenshot of the 10k page is saved
to bench/out/report-10k.png to look at.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repo root on sys.path)

import bench_audit
from common import ROOT, time_command
from tests.infra import make_infra_repo

SIZES = [(1_000, 50, 20), (10_000, 500, 200)]


def main() -> None:
    from tests.browser import Chromium

    failed = False
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    kk = str(Path(sys.executable).parent / "knobkeeper")
    for entries, incidents, deploys in SIZES:
        tmp = Path(tempfile.mkdtemp(prefix="kk-bench-report-"))
        try:
            bench_audit.ENTRIES, bench_audit.INCIDENTS, bench_audit.DEPLOYS = entries, incidents, deploys
            project = make_infra_repo(tmp)
            bench_audit.build(project)
            page = tmp / "report.html"
            cmd = [kk, "report", "-o", str(page), "--repo", str(project.root)]
            median, samples = time_command(cmd, repeats=5)
            size = page.stat().st_size
            marks = page.read_text().count('class="mark ')
            ok = median < 3.0 and size < 5 * 1024 * 1024
            failed |= not ok
            print(f"{entries:>6} entries, {incidents} incidents, {deploys} deploys: render median {median:.2f} s "
                  f"(runs {', '.join(f'{s:.2f}' for s in samples)}), file {size / 1024:.0f} KiB, {marks} marks drawn  "
                  f"[{'OK' if ok else 'OVER TARGET'}, targets < 3 s, < 5 MB]")
            if entries == SIZES[-1][0]:
                loads = []
                with Chromium(1280, 800) as browser:
                    for _ in range(3):
                        tab = browser.open(page.as_uri())
                        if tab.errors:
                            print(f"page errors: {tab.errors[:3]}")
                            failed = True
                        loads.append(tab.timing()["load_ms"] / 1000)
                    tab.screenshot(out / "report-10k.png")
                load = statistics.median(loads)
                failed |= load >= 2.0
                print(f"{'':>6} chromium load (navigation start to load event end): median {load:.2f} s over 3 "
                      f"[{'OK' if load < 2.0 else 'OVER TARGET'}, target < 2 s]; screenshot {out / 'report-10k.png'}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
