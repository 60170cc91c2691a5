"""Import time per benchmark-tool format (issue 24): a 100-level input per format and a directory of
20 aiperf runs, built from the real tools' fixture files (tests/data/bench_formats/<tool>-<version>/)
by repeating one real record at levels 1..N (nothing else changed but the level, and the candidate's
throughput x1.05 so the arms differ).

Two figures per format, medians of --repeats (first run dropped: imports and caches warm):
    read     knobkeeper.evidence.importers.read of one arm's input (parse + check + runs)
    import   `ab import` end to end for both arms through the library (store.import_files: read,
             gates, family-wise judgement of N levels, evidence file and raw copies written, one
             git commit) in a scratch infra repo

    .venv/bin/python bench/bench_import_formats.py [--levels 100] [--aiperf-runs 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import time_call  # noqa: E402
from knobkeeper.evidence import importers  # noqa: E402
from knobkeeper.evidence import store  # noqa: E402
from tests.infra import make_infra_repo  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "bench_formats"
KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def _sglang(out: Path, levels: int, scale: float) -> list[str]:
    line = json.loads((DATA / "sglang-0.5.23" / "baseline.jsonl").read_text().splitlines()[0])
    rows = []
    for c in range(1, levels + 1):
        rec = dict(line, max_concurrency=c, output_throughput=line["output_throughput"] * scale)
        rows.append(json.dumps(rec))
    path = out / "sglang.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return [str(path)]


def _vllm(out: Path, levels: int, scale: float) -> list[str]:
    rec = json.loads((DATA / "vllm-0.32.0" / "baseline-c2.json").read_text())
    paths = []
    for c in range(1, levels + 1):   # vllm bench serve writes one level per file
        path = out / f"vllm-c{c}.json"
        path.write_text(json.dumps(dict(rec, max_concurrency=c, output_throughput=rec["output_throughput"] * scale)))
        paths.append(str(path))
    return paths


def _guidellm(out: Path, levels: int, scale: float) -> list[str]:
    doc = json.loads((DATA / "guidellm-0.8.1" / "baseline.json").read_text())
    one = doc["benchmarks"][0]
    doc["benchmarks"] = []
    for c in range(1, levels + 1):
        bench = copy.deepcopy(one)
        bench["config"]["strategy"]["streams"] = c
        for status in bench["metrics"]["output_tokens_per_second"].values():
            if isinstance(status, dict) and isinstance(status.get("mean"), (int, float)):
                status["mean"] *= scale
        doc["benchmarks"].append(bench)
    path = out / "guidellm.json"
    path.write_text(json.dumps(doc))
    return [str(path)]


def _aiperf(out: Path, levels: int, scale: float) -> list[str]:
    src = next((DATA / "aiperf-0.13.0" / "baseline").glob("concurrency_*/profile_export_aiperf.json"))
    doc = json.loads(src.read_text())
    root = out / "aiperf"
    for c in range(1, levels + 1):
        d = copy.deepcopy(doc)
        for phase in d["input_config"]["phases"]:
            if phase.get("type") == "concurrency" and phase.get("kind", phase.get("name")) != "warmup":
                phase["concurrency"] = c
        d["output_token_throughput"]["avg"] *= scale
        (root / f"concurrency_{c}").mkdir(parents=True)
        (root / f"concurrency_{c}" / "profile_export_aiperf.json").write_text(json.dumps(d))
    return [str(root)]


CASES = {"sglang": _sglang, "vllm": _vllm, "guidellm": _guidellm, "aiperf": _aiperf}


def measure(fmt: str, levels: int, repeats: int, scratch: Path) -> tuple[float, float]:
    base = scratch / f"{fmt}-{levels}-A"
    cand = scratch / f"{fmt}-{levels}-B"
    base.mkdir()
    cand.mkdir()
    files_a, files_b = CASES[fmt](base, levels, 1.0), CASES[fmt](cand, levels, 1.05)
    read_s = time_call(lambda: [importers.read(p) for p in files_a], repeats)[0]
    counter = iter(range(10**6))

    def one_import():
        project = make_infra_repo(scratch / f"repo-{fmt}-{levels}-{next(counter)}")
        store.import_files(project, baseline=importers.expand(files_a), candidate=importers.expand(files_b), role="decode",
                           knob=f"{KNOB}=512", keep_invalid=True)

    import_s = time_call(one_import, repeats)[0]
    return read_s, import_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", type=int, default=100)
    ap.add_argument("--aiperf-runs", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="kkbi-"))
    try:
        rows = [(fmt, args.levels, *measure(fmt, args.levels, args.repeats, scratch)) for fmt in CASES]
        rows.append(("aiperf dir", args.aiperf_runs, *measure("aiperf", args.aiperf_runs, args.repeats, scratch)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"import time per format, median of {args.repeats} (shared machine; both arms for `import`)")
    print(f"{'format':<12} {'levels':>6} {'read 1 arm':>12} {'ab import':>12}")
    for fmt, levels, read_s, import_s in rows:
        print(f"{fmt:<12} {levels:>6} {read_s * 1000:>10.1f}ms {import_s:>11.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
