"""Fixed-content changelog files for the review/check tests: entries, evidence and incidents with
pinned ids and times, committed with pinned git dates, so a review of them is byte-for-byte stable."""

from __future__ import annotations

import json

from knobkeeper.changelog.entries import Entry, entry_path
from knobkeeper.knobs.state import load_document, with_value
from knobkeeper.deploy import repo_files
from knobkeeper.project import Project
from knobkeeper.timeutil import file_stem, parse_time
from tests.infra import git

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
AUTHOR = "Test Operator <test.operator@example.com>"
FIXED_DATE = "2026-11-29T12:00:00+00:00"


def pin_git_dates(monkeypatch) -> None:
    monkeypatch.setenv("GIT_AUTHOR_DATE", FIXED_DATE)
    monkeypatch.setenv("GIT_COMMITTER_DATE", FIXED_DATE)


def commit_all(project: Project, message: str) -> str:
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "--no-verify", "-m", message)
    return git(project.root, "rev-parse", "HEAD")


def write_entry(project: Project, **fields) -> Entry:
    """An entry file (fixed id/time), the knobs.toml value it explains and the repo files (a Kubernetes
    stack's manifests) that change with it, as `set` writes them; not committed."""
    fields.setdefault("author", AUTHOR)
    entry = Entry(**fields)
    text = with_value(load_document(project.knobs_path), entry.role, entry.knob, entry.new)
    for path, content in repo_files.after_change(project, text, [entry]).items():
        path.write_text(content)
    entry_path(project, entry).write_text(entry.to_toml())
    project.knobs_path.write_text(text)
    return entry


def ctas_runs() -> list[dict]:
    """+12.8% @64, +5.7% @96, and arm A falls from 80 to 96 (the field story's anomaly)."""
    base = {64: 1000.0, 80: 1100.0, 96: 1040.0}
    gain = {64: 1.128, 80: 1.02, 96: 1.057}
    jitter = (0.995, 1.0, 1.005)
    runs = []
    for conc in (64, 80, 96):
        for rep, j in enumerate(jitter, 1):
            runs.append({"arm": "A", "repeat": rep, "concurrency": conc, "output_tokens_per_s": round(base[conc] * j, 3), "errors": 0})
            runs.append({"arm": "B", "repeat": rep, "concurrency": conc,
                         "output_tokens_per_s": round(base[conc] * gain[conc] * (2.0 - j), 3), "errors": 0})
    return runs


def write_evidence(project: Project, ident: str = "e1e2e3e4", created: str = "2026-11-28T10:00:00.000000Z",
                   value=512, runs: list[dict] | None = None):
    from knobkeeper.evidence import store

    doc = store.build_doc(
        knob=KNOB, role="decode",
        arms={"A": {"label": "baseline", "knobs": {KNOB: None}}, "B": {"label": "candidate", "knobs": {KNOB: value}}},
        runs=runs or ctas_runs(), setup={"engine": "sglang", "model": "deepseek-v3"},
        source={"tool": "sglang bench_serving"}, ident=ident, created=created,
    )
    path = project.evidence_dir / f"{file_stem(parse_time(created), ident)}.json"
    path.write_text(json.dumps(doc.to_json(), indent=2) + "\n")
    return doc


def write_incident(project: Project, ident: str = "9f8e7d6c", title: str = "multi-round harness hangs",
                   opened: str = "2026-11-29T18:02:11.000000Z", notes: str = "", resolution: str = "") -> None:
    text = (f'id = "{ident}"\ntitle = "{title}"\nopened = "{opened}"\nstarted = "{opened}"\n'
            f'opened_by = "{AUTHOR}"\n{notes}{resolution}')
    (project.incidents_dir / f"{file_stem(parse_time(opened), ident)}.toml").write_text(text)
