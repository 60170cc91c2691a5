"""The one place the report reads the rest of knobkeeper: every fact comes through a public
function of audit, changelog, deploy.record, evidence.store/plot or the catalog. Other parts are
being reorganised; re-point these few calls and the report follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from knobkeeper import audit
from knobkeeper.changelog.entries import load_entries
from knobkeeper.changelog.filecache import LINK_FIX, refused_files
from knobkeeper.changelog.incidents import load_incidents
from knobkeeper.changelog.queries import declared_knobs
from knobkeeper.deploy.record import load_records
from knobkeeper.deploy.status import declared_knobs_now, knob_drift
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.evidence.plot import arm_levels
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.project import Project
from knobkeeper.timeutil import id_from_stem


@dataclass
class Sources:
    """Everything the report draws, as the library hands it over (nothing derived here)."""

    entries: list[Any]
    incidents: list[Any]
    declared: list[Any]                 # changelog.queries.DeclaredKnob rows
    statuses: dict[str, Any]            # revert id -> audit.RevertStatus
    reclaim: Any                        # audit.ReclaimReport
    events: list[Any]                   # audit.Event, in time order
    records: list[Any]                  # deploy.record.DeployRecord, oldest first
    evidence: list[Any]                 # evidence.model.Evidence, oldest first
    evidence_problems: list[str]
    catalog: Any
    problems: list[str] = field(default_factory=list)
    # Per (record id, host, service): how the knobs it started with differ from those a deploy would
    # start it with now (deploy.status.knob_drift, `status`'s words; [] none), or None when its
    # inventory no longer has it, or the one line saying why its inventory does not render.
    started_drift: dict[tuple[str, str, str], list[str] | str | None] = field(default_factory=dict)
    registries: dict[str, str] = field(default_factory=dict)   # knob only a registry declares -> "vllm 0.32.0"


def read_sources(project: Project, since: datetime, until: datetime, role: str | None) -> Sources:
    declared = declared_knobs(project, role)   # also the check that --role names a role
    entries = load_entries(project)
    incidents = load_incidents(project)
    statuses = audit.revert_statuses(project, entries, incidents)
    reclaim = audit.reclaimable(project)
    tl = audit.timeline(project, since, until)
    docs, problems = read_evidence(project)
    records = load_records(project, tl.problems)  # an unreadable record is named, the rest still count
    # Links every reader left out are named here, one line each, beside the other problems.
    refused = [f"{project.rel(path)}: {why}; {LINK_FIX}" for path, why in refused_files(project)]
    catalog = load_catalog(project.catalog_path)
    names = {e.knob for e in entries} | {row.knob for row in declared}
    return Sources(entries=entries, incidents=incidents, declared=declared, statuses=statuses, reclaim=reclaim,
                   events=tl.events, records=records, evidence=docs, evidence_problems=problems,
                   catalog=catalog, problems=refused + list(tl.problems),
                   started_drift=started_drift(project, records),
                   registries={n: label for n in sorted(names) if n not in catalog and (label := catalog.registry_of(n))})


def started_drift(project: Project, records: list[Any]) -> dict[tuple[str, str, str], list[str] | str | None]:
    """Sources.started_drift: each inventory rendered once (deploy.status.declared_knobs_now)."""
    now: dict[str, dict | str] = {}
    out: dict[tuple[str, str, str], list[str] | str | None] = {}
    for record in records:
        path = record.inventory_path
        if path not in now:
            try:
                now[path] = declared_knobs_now(project, path)
            except UserError as exc:
                now[path] = f"{path} does not render: " + str(exc).replace(f"{project.root}/", "")
        want = now[path]
        for row in record.services or []:
            key = (record.id, row.host, row.service)
            if isinstance(want, str):
                out[key] = want
            else:
                out[key] = knob_drift(want[(row.host, row.service)], row.knobs or {}) if (row.host, row.service) in want \
                    else None
    return out


def read_evidence(project: Project) -> tuple[list[dict], list[str]]:
    """Every evidence doc through the store (oldest first), and one line per file it refused."""
    if not project.evidence_dir.is_dir() or not any(project.evidence_dir.glob("*.json")):
        return [], []   # the store imports the judge (scipy): not for a repository without evidence

    docs, problems = [], []
    for path in store.paths(project):
        try:
            docs.append(store.load(project, id_from_stem(path.stem)))
        except UserError as exc:
            problems.append(str(exc))
    return docs, problems


def arm_intervals(doc: Any, arm: str) -> list[tuple[int, float, float, float, int]]:
    """[(concurrency, geometric mean, 95% low, 95% high, n)]: the same numbers `ab show --plot` draws."""
    return arm_levels(doc, arm)
