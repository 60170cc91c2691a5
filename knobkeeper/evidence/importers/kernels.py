"""The kernels benchmark (kernels/knobkeeper_kernels/bench.py): its evidence docs, read as runs split by arm."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from knobkeeper.evidence.importers.common import File, Imported, load_json
from knobkeeper.evidence.model import METRIC
from knobkeeper.evidence.schema import SCHEMA, SCHEMAS, validate


def _non_finite(value: Any, where: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]")
        if found:
            return found
    return None


def read_kernels(path: Path, data: Any = None) -> Imported:
    f = File(path)
    doc = load_json(path) if data is None else data
    if not isinstance(doc, dict) or doc.get("schema") not in SCHEMAS:
        raise f.fail("schema", f"expected {SCHEMA!r} (the kernels benchmark writes evidence docs)")
    bad = _non_finite(doc, "")
    if bad:
        raise f.fail(bad.lstrip("."), "not a finite number (NaN or Infinity); the benchmark's output is broken")
    problems = validate(doc)
    if problems:
        raise f.fail(problems[0].split(":", 1)[0], problems[0].split(":", 1)[-1].strip())
    metric = doc["metric"]
    for i, run in enumerate(doc["runs"]):
        f.num(run, metric, f"runs[{i}].", positive=True)
    split: dict[str, list[dict]] = {"A": [], "B": []}
    for run in doc["runs"]:
        r = {k: v for k, v in run.items() if k not in ("arm", "repeat")}
        if metric != METRIC:
            r[METRIC] = run[metric]
        split[run["arm"]].append(r)
    setup = dict(doc.get("setup") or {})
    return Imported(doc.get("source", {}).get("tool") or "knobkeeper-kernels bench",
                    split["A"] + split["B"], setup, arm_runs=split, doc=doc)
