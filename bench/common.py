"""Shared by the benchmarks: whole-process timing and a synthetic big changelog."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def time_command(cmd: list[str], repeats: int = 7, cwd: Path | None = None) -> tuple[float, list[float]]:
    """Median wall seconds of a whole process (first run warms the OS cache and is dropped)."""
    subprocess.run(cmd, cwd=cwd, capture_output=True, check=True)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), samples


def time_call(fn, repeats: int = 5) -> tuple[float, list[float]]:
    """Median wall seconds of `fn()` in this process (a first call warms imports and caches and is dropped)."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), samples


def write_entries(project, count: int, knobs: list[tuple[str, str, list]]) -> list[str]:
    """`count` entries cycling through (knob, role, values), as files plus one commit. Returns ids."""
    from datetime import timedelta

    from knobkeeper.changelog.entries import Entry, entry_path
    from knobkeeper.knobs.state import load_document, with_value
    from knobkeeper.timeutil import iso, new_id, utcnow

    start = utcnow() - timedelta(days=90)
    previous: dict[tuple[str, str], object] = {}
    ids = []
    project.entries_dir.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        knob, role, values = knobs[i % len(knobs)]
        value = values[(i // len(knobs)) % len(values)]
        entry = Entry(id=new_id(), time=iso(start + timedelta(seconds=i * 60)), author="Bench <bench@example.com>",
                      action="set", knob=knob, role=role, reason=f"bench change {i}",
                      old=previous.get((knob, role)), new=value)
        previous[(knob, role)] = value
        entry_path(project, entry).write_text(entry.to_toml())
        ids.append(entry.id)
    doc = load_document(project.knobs_path)
    for (knob, role), value in previous.items():
        text = with_value(doc, role, knob, value)
    project.knobs_path.write_text(text)
    subprocess.run(["git", "-C", str(project.root), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(project.root), "commit", "-qm", f"{count} entries"], check=True)
    return ids
