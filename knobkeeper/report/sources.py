"""The one place the report reads the rest of knobkeeper: every fact comes through a public
function of audit, changelog, deploy.record, evidence.store/plot or the catalog. Other parts are
being reorganised; re-point these few calls and the report follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from knobkeeper.errors import UserError
from knobkeeper.project import Project


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


def read_sources(project: Project, since: datetime, until: datetime, role: str | None) -> Sources:
    from knobkeeper import audit
    from knobkeeper.changelog.entries import load_entries
    from knobkeeper.changelog.filecache import LINK_FIX, refused_files
    from knobkeeper.changelog.incidents import load_incidents
    from knobkeeper.changelog.queries import declared_knobs
    from knobkeeper.deploy.record import load_records
    from knobkeeper.knobs.catalog import load_catalog

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
    return Sources(entries=entries, incidents=incidents, declared=declared, statuses=statuses, reclaim=reclaim,
                   events=tl.events, records=records, evidence=docs, evidence_problems=problems,
                   catalog=load_catalog(project.catalog_path), problems=refused + list(tl.problems))


def read_evidence(project: Project) -> tuple[list[dict], list[str]]:
    """Every evidence doc through the store (oldest first), and one line per file it refused."""
    if not project.evidence_dir.is_dir() or not any(project.evidence_dir.glob("*.json")):
        return [], []   # the store imports the judge (scipy): not for a repository without evidence
    from knobkeeper.evidence import store
    from knobkeeper.timeutil import id_from_stem

    docs, problems = [], []
    for path in store.paths(project):
        try:
            docs.append(store.load(project, id_from_stem(path.stem)))
        except UserError as exc:
            problems.append(str(exc))
    return docs, problems


def arm_intervals(doc: Any, arm: str) -> list[tuple[int, float, float, float, int]]:
    """[(concurrency, geometric mean, 95% low, 95% high, n)]: the same numbers `ab show --plot` draws."""
    from knobkeeper.evidence.plot import arm_levels

    return arm_levels(doc, arm)
