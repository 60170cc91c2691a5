"""The evidence model's load time: 10,000 evidence files read through the typed model.

Each figure is measured in one process, side by side, median of 5 (the first pass warms the OS
cache and is dropped):

    json      json.loads of every file: the floor, what any model of the file costs at least
    validate  json.loads + the checks of the declaration (evidence/schema.py validate; since the
              schema is declared once, knobkeeper/declared.py, this is the same pass as read)
    read      store.read: the file read, json.loads, and the one pass that checks and builds the
              Evidence (what `ab list`, check and the report do per file)
    ab list   the whole process `knobkeeper ab list --json` over the same 10,000 files (median of 5)

The files are one real evidence doc (tests/review_fixtures.py: 3 levels x 2 arms x 3 runs, judged
by the store) written 10,000 times with their own id and time, the shape a year of A/B tests
leaves. Prints the per-file cost and the ratio of each figure to the json floor.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from common import ROOT, time_call, time_command

from tests.infra import make_infra_repo
from tests.review_fixtures import write_evidence

COUNT = 10_000


def main() -> None:
    from knobkeeper.evidence import store
    from knobkeeper.evidence.schema import validate
    from knobkeeper.timeutil import file_stem, iso, parse_time

    tmp = Path(tempfile.mkdtemp(prefix="kk-bench-evload-"))
    try:
        project = make_infra_repo(tmp)
        first = write_evidence(project)
        template = first.to_json()
        start = parse_time(first.created)
        for i in range(1, COUNT):
            created = start + timedelta(seconds=i)
            ident = f"{i:08x}"
            doc = {**template, "id": ident, "created": iso(created)}
            (project.evidence_dir / f"{file_stem(created, ident)}.json").write_text(json.dumps(doc, indent=2) + "\n")
        paths = store.paths(project)
        assert len(paths) == COUNT, len(paths)
        size = sum(p.stat().st_size for p in paths)
        print(f"{COUNT} evidence files, {size / COUNT / 1024:.1f} KiB each; the model of {Path(store.__file__).parents[2]}")

        def loads():
            for p in paths:
                json.loads(p.read_text())

        def validated():
            for p in paths:
                assert not validate(json.loads(p.read_text()))

        def read():
            for p in paths:
                store.read(p, p.name)

        figures = {}
        for name, fn in (("json", loads), ("validate", validated), ("read", read)):
            figures[name] = time_call(fn, 5)
        # `python -m` from this checkout's root: the code of this tree, also when it is a worktree beside
        # the installed one (a before-and-after figure)
        kk = [sys.executable, "-m", "knobkeeper.cli", "ab", "list", "--json", "--repo", str(project.root)]
        figures["ab list"] = time_command(kk, repeats=5, cwd=ROOT)
        floor = figures["json"][0]
        for name, (median, samples) in figures.items():
            print(f"{name:9s} median {median:.2f} s ({median / COUNT * 1e6:.0f} us a file, {median / floor:.1f}x json)"
                  f"  samples {', '.join(f'{s:.2f}' for s in samples)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
