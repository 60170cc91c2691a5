"""The field story (docs/design.md, "The story it serves") built in an infra repo through the
library, on a clock that moves minutes and hours between the steps as it did in the field; the
report's tests and the README screenshot (`make docs-screenshot`) use it.

    python -m tests.fieldstory --screenshot docs/report.png

1. A/B evidence imported from sglang bench_serving results: +12.8% at concurrency 64, +5.7% at 96,
   and without the knob throughput at 96 is lower than at 80; the knob is set with it, deployed.
2. An incident: the multi-round harness hangs; the knob is reverted as the suspect, deployed.
3. A note refutes the revert (the hang persisted); the incident is resolved with another root
   cause (a faulty client-side proxy). The gain is left on the table: `reclaimable` lists it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

from knobkeeper import audit, gitio, timeutil
from knobkeeper.changelog import incidents, ops, store as changelog_store
from knobkeeper.deploy import record
from knobkeeper.deploy.record import DeployRecord, save
from knobkeeper.deploy.status import declared_knobs_now
from knobkeeper.evidence import importers, store
from knobkeeper.project import Project
from knobkeeper.report import write_report
from knobkeeper.timeutil import iso, new_id
from tests.browser import Chromium

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
TITLE = "multi-round harness hangs"
ROOT_CAUSE = "faulty client-side proxy"
REFUTING_NOTE = "hang persisted after the revert; servers idle while the client waits"
# Baseline throughput per level (96 below 80: the scaling anomaly) and the knob's gain.
BASE = {64: 5000.0, 80: 5600.0, 96: 5450.0}
GAIN = {64: 0.128, 80: 0.02, 96: 0.057}
JITTER = (0.99, 1.0, 1 / 0.99)   # symmetric on the log scale: the geometric-mean ratio is the gain exactly


@dataclass
class Story:
    evidence: str
    set_entry: str
    revert: str
    incident: str
    deploys: list[str]


@contextlib.contextmanager
def clock(moment: datetime) -> Iterator[list[datetime]]:
    """`utcnow()` of every loaded knobkeeper module returns now[0] (move it by assigning)."""
    original = timeutil.utcnow
    now = [moment]
    fake = lambda: now[0]  # noqa: E731
    patched = [m for name, m in sys.modules.items()
               if name.startswith("knobkeeper") and getattr(m, "utcnow", None) is original]
    for module in patched:
        module.utcnow = fake
    try:
        yield now
    finally:
        for module in patched:
            module.utcnow = original


def bench_serving_lines(arm: str) -> str:
    """sglang bench_serving JSONL for one arm: three repeats at each level."""
    lines = []
    for conc, base in BASE.items():
        for j in JITTER:
            tput = base * j * (1 + GAIN[conc] if arm == "B" else 1)
            lines.append(json.dumps({
                "backend": "sglang-oai-chat", "dataset_name": "random", "max_concurrency": conc,
                "random_input_len": 1024, "random_output_len": 256, "completed": 640, "duration": 29.0,
                "output_throughput": tput, "request_throughput": tput / 256, "mean_ttft_ms": 80.0 + conc / 4,
                "median_ttft_ms": 78.0 + conc / 4, "p99_ttft_ms": 140.0 + conc, "mean_itl_ms": 12.0,
                "median_itl_ms": 11.8, "p99_itl_ms": 20.0, "mean_e2e_latency_ms": 3100.0,
                "median_e2e_latency_ms": 3050.0, "p99_e2e_latency_ms": 3900.0, "model_id": "deepseek-ai/DeepSeek-V3"}))
    return "\n".join(lines) + "\n"


def _deploy(project: Project, started: datetime, roles: list[str]) -> str:
    """The record of a deploy of inventory/example_prod.py (one host per role) that restarted `roles`,
    each service started with the knobs a deploy gives it now, as a real deploy records them."""
    knobs = declared_knobs_now(project, "inventory/example_prod.py")
    services = []
    for k, role in enumerate(["prefill", "decode", "router"]):
        host, name = f"{role}-1", f"knobkeeper-{role}"
        acted = role in roles
        issued = started + timedelta(seconds=5 + 20 * k)
        services.append({"host": host, "service": name, "role": role,
                         "action": "restarted" if acted else "unchanged", "reason": "knobs changed" if acted else "same",
                         "knobs": knobs[(host, name)], "restart_issued_at": iso(issued) if acted else None,
                         "healthy_at": iso(issued + timedelta(seconds=14)) if acted else None,
                         "gate": {"result": "passed" if acted else "skipped", "url": f"http://{name}/health",
                                  "status": "200" if acted else None, "seconds": 14.0 if acted else None,
                                  "checked_at": None}})
    record = DeployRecord(id=new_id(), inventory="prod", inventory_path="inventory/example_prod.py",
                          commit="0" * 40, dirty=False, allow_dirty=False, options={},
                          order=["prefill", "decode", "router"], started_at=iso(started),
                          finished_at=iso(started + timedelta(minutes=1)), result="ok", services=services)
    save(project, record, commit=True)
    return record.id


def build(project: Project, workdir: Path, start: datetime | None = None) -> Story:
    """The story in `project` (a committed infra repo with a git identity), each step one commit."""
    # Imported before the clock is set, so that every `utcnow` they bound is the one it replaces.

    if start is None:
        today = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        start = today - timedelta(days=2)
    files = {}
    for arm, label in (("A", "unset"), ("B", "ctas512")):
        files[arm] = workdir / f"bench_serving_{label}.jsonl"
        files[arm].write_text(bench_serving_lines(arm))
    with clock(start.replace(hour=14)) as now:
        doc = store.import_files(project, baseline=[str(files["A"])], candidate=[str(files["B"])], role="decode",
                                 knob=f"{KNOB}=512", engine="sglang")
        now[0] += timedelta(minutes=25)
        set_entry = ops.set_knob(project, KNOB, "512", "decode", "A/B: +12.8% output tok/s at concurrency 64, "
                                 "+5.7% at 96; 96 no longer below 80", evidence=[doc.id]).entry
        now[0] += timedelta(minutes=20)
        deploys = [_deploy(project, now[0], ["decode", "router"])]
        now[0] += timedelta(hours=3, minutes=10)
        incident = incidents.open_incident(project, TITLE, now[0] - timedelta(minutes=12)).incident
        now[0] += timedelta(minutes=15)
        revert = audit.revert(project, KNOB, "decode", "last deploy delta; suspect for the harness hang",
                              incident.id, "the harness stops hanging").entry
        now[0] += timedelta(minutes=5)
        deploys.append(_deploy(project, now[0], ["decode", "router"]))
        now[0] += timedelta(minutes=50)
        incidents.note_incident(project, incident.id, REFUTING_NOTE, refutes=revert.id)
        now[0] += timedelta(hours=17)
        incidents.resolve_incident(project, incident.id, ROOT_CAUSE)
    return Story(doc.id, set_entry.id, revert.id, incident.id, deploys)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import shutil
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.fieldstory", description=__doc__.splitlines()[0])
    parser.add_argument("--screenshot", default=None, help="write a 1280x800 PNG of the report here")
    parser.add_argument("--html", default=None, help="also keep the report's HTML here")
    parser.add_argument("--scroll-to", default="timeline", help="the section at the top of the screenshot")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="kk-fieldstory-"))
    try:
        root = tmp / "infra"
        source = Path(__file__).resolve().parents[1]
        root.mkdir()
        for item in ("inventory", "templates"):
            shutil.copytree(source / item, root / item, ignore=shutil.ignore_patterns("__pycache__"))
        for sub in ("entries", "incidents", "evidence", "deploys"):
            (root / "changelog" / sub).mkdir(parents=True)
            (root / "changelog" / sub / ".gitkeep").touch()
        gitio.output(root, "init", "-q", "-b", "main")
        for key, value in (("user.name", "Ann Operator"), ("user.email", "ann@example.com"), ("commit.gpgsign", "false")):
            gitio.output(root, "config", key, value)
        gitio.output(root, "add", "-A")
        gitio.output(root, "commit", "-qm", "infra repo")
        project = Project(root)
        build(project, tmp)
        written = write_report(project, Path(args.html) if args.html else tmp / "report.html")
        print(f"report: {written.path} ({written.size / 1024:.0f} KiB)")
        if args.screenshot:
            with Chromium() as browser:
                page = browser.open(written.path.as_uri())
                if page.errors:
                    print("page errors: " + "; ".join(page.errors), file=sys.stderr)
                    return 1
                page.evaluate(f"window.scrollTo(0, document.getElementById({json.dumps(args.scroll_to)}).offsetTop - 100)")
                print(f"screenshot: {page.screenshot(args.screenshot)}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
