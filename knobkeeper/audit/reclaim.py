"""What reverts gave up, and whether it can be taken back; the revert and restore commands' audit.

`reclaimable`: every (role, knob) whose latest revert took back a value that had positive
evidence (a judgement level with verdict "better"), whose declared value today differs from
that value, and whose revert is refuted, suspected or unexplained. Confirmed reverts are
listed apart as not reclaimable. Sorted by what it gives back: the largest lower 95% CI bound
of a "better" level (the gain we are confident of), then the largest effect.

Evidence is stale when it is older than `stale_days` (default 30) or when the engine it was
measured on (setup.engine, setup.engine_version) is not the one its role runs today: the
`engine_version` argument (CLI --engine-version: a version, whatever the engine) or, when not given,
the (engine, version) the evidence's inventory pins today for its role and stack
(knobkeeper.engine.role_engine, read through the inventories; the inventory as `ab run` was given it,
in any spelling: `inventory/<name>.py`, `./inventory/<name>.py`, an absolute path). Evidence without an
inventory (imported) is compared with what every inventory pins for the role, when they agree.
Where the two cannot be compared (no such inventory, no version pinned, the inventories disagree,
the evidence records none), the view says "version not checked: WHY" and only age counts.

Evidence is read only through knobkeeper.evidence.store (importing it costs ~40 ms: the judge
imports scipy only inside the functions that compute).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from knobkeeper import fmt
from knobkeeper.audit.status import MEANING, RevertStatus, revert_status
from knobkeeper.changelog import ops
from knobkeeper.changelog.entries import Entry, load_entries
from knobkeeper.changelog.incidents import find_incident, load_incidents
from knobkeeper.changelog.ops import Change, CommitOptions, RestoreVerdict
from knobkeeper.engine import family
from knobkeeper.engine.pins import engine_pins, inventory_key
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.state import read_declared
from knobkeeper.project import Project
from knobkeeper.timeutil import parse_time, utcnow

STALE_DAYS = 30


def load_evidence(project: Project, ident: str):
    """The Evidence (through the evidence store), or a string saying why it cannot be read."""
    try:
        return store.load(project, ident)
    except UserError as exc:
        return str(exc)


def gains_text(gains: list) -> str:
    """`+12.8% at concurrency 64, +5.7% at 96` (gains: evidence.model.Gain rows)."""
    parts = []
    for i, g in enumerate(gains):
        where = f"at concurrency {g.concurrency}" if i == 0 else f"at {g.concurrency}"
        parts.append(f"{fmt.pct(g.effect)} {where}")
    return ", ".join(parts)


@dataclass
class EvidenceView:
    id: str
    problem: str | None = None            # unreadable or missing
    created: str | None = None
    age_days: float | None = None
    engine: str | None = None
    engine_version: str | None = None
    stale: bool = False
    stale_why: list[str] = field(default_factory=list)
    version_note: str | None = None       # "version not checked: WHY" where the engine could not be compared
    levels: list[Any] = field(default_factory=list)      # evidence.model.Gain: every valid level
    gains: list[Any] = field(default_factory=list)       # the "better" ones with a positive effect
    anomalies: list[Any] = field(default_factory=list)   # evidence.model.Anomaly

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "levels": [g.to_json() for g in self.levels], "gains": [g.to_json() for g in self.gains],
                "anomalies": [a.to_json() for a in self.anomalies]}


def view_evidence(project: Project, ident: str, now: datetime, stale_days: float,
                  engine_version: str | None) -> EvidenceView:
    doc = load_evidence(project, ident)
    if isinstance(doc, str):
        return EvidenceView(id=ident, problem=doc)
    view = EvidenceView(id=doc.id, created=doc.created, engine=doc.setup.engine,
                        engine_version=doc.setup.engine_version, levels=doc.gains(),
                        gains=doc.positive_gains(), anomalies=list(doc.anomalies))
    try:
        view.age_days = round((now - parse_time(doc.created)).total_seconds() / 86400, 1)
    except ValueError:
        view.stale_why.append(f"created {doc.created!r} is not a time")
    if view.age_days is not None and view.age_days > stale_days:
        view.stale_why.append(f"{view.age_days:.0f} days old (older than {stale_days:g})")
    if engine_version:   # given by the caller: the version deployed now, whatever the engine
        current, note = (None, engine_version), None
    else:
        current, note = pinned_engine(project, doc.setup, doc.role)
    if current is None:
        note = note if view.engine_version else "the evidence records no engine version"
    elif current[1] is None:   # the role runs an engine without a version (the sim)
        note = f"its role runs {current[0]} without a pinned version" if view.engine_version else None
    elif not view.engine_version:
        note = f"the evidence records no engine version (its role runs {_engine_label(*current)} today)"
    elif not _same_engine((view.engine, view.engine_version), current):
        view.stale_why.append(f"measured on {_engine_label(view.engine, view.engine_version)}, "
                              f"current is {_engine_label(*current)}")
    view.version_note = f"version not checked: {note}" if note else None
    view.stale = bool(view.stale_why)
    return view


def _engine_label(engine: str | None, version: str | None) -> str:
    return " ".join(x for x in (engine if engine != "unknown" else None, version) if x) or "an unknown engine"


def _same_engine(measured: tuple[str | None, str | None], current: tuple[str | None, str]) -> bool:
    """Same version, and the same engine where both name one (an imported file often names none:
    "unknown"; --engine-version names a version only)."""
    engine, version = measured
    named = engine not in (None, "unknown") and current[0] is not None
    return version == current[1] and (not named or engine == current[0])


def pinned_engine(project: Project, setup: Any, role: str) -> tuple[tuple[str, str | None] | None, str | None]:
    """((engine, version) the evidence's role runs today, None), or (None, why that cannot be said).

    The pins (knobkeeper.engine.role_engine, through engine_pins) of the evidence's inventory, in
    whatever spelling `ab run` was given it, for its role and stack. Evidence that names no inventory
    (an import) is compared with the version every inventory pins for its role and engine, when they
    agree on one."""
    scope = f"role {role}" + (f" of stack {setup.stack}" if setup.stack else "")
    pins = [p for p in engine_pins(project.inventory_dir) if p.role == role and p.stack == (setup.stack or "")]
    if setup.inventory:
        key = inventory_key(project.inventory_dir, setup.inventory)
        if key is None:
            return None, (f"its inventory {setup.inventory} is not one of "
                          f"{project.rel(project.inventory_dir)}/*.py, whose pins are read")
        pins = [p for p in pins if p.inventory == key]
        if not pins:
            return None, f"{key} runs no {scope}"
    else:
        if setup.engine not in (None, "unknown"):
            pins = [p for p in pins if p.engine == setup.engine]
        pins = [p for p in pins if p.version]
        if not pins:
            engine = f"{setup.engine} " if setup.engine not in (None, "unknown") else ""
            return None, f"it names no inventory, and none pins a version of {engine}{scope}"
    engines = {(p.engine, p.version) for p in pins}
    if len(engines) > 1:
        return None, f"{scope} runs {', '.join(sorted({f'{p.label()} ({p.inventory})' for p in pins}))}"
    return engines.pop(), None


def current_engine_version(project: Project) -> str | None:
    """The one engine version every pinned worker role of every inventory agrees on (the report's
    `engine_version`; each evidence is checked against its own role's pin, pinned_engine); None
    where none is pinned or they differ."""
    pins = [p for p in engine_pins(project.inventory_dir) if p.version and family(p.engine).kind == "worker"]
    versions = {p.version for p in pins}
    return versions.pop() if len(versions) == 1 else None


# --------------------------------------------------------------------------- reclaimable

@dataclass
class Reclaim:
    role: str
    knob: str
    value: Any                 # the value the revert took back (what a restore re-applies)
    current: Any               # declared today
    revert: Entry
    reverted: Entry
    status: RevertStatus
    evidence: list[EvidenceView]
    gain: float                # sort key: the largest lower CI bound of a "better" level
    best_effect: float
    command: str

    @property
    def gains(self) -> list[Any]:
        return [g for ev in self.evidence for g in ev.gains]

    def to_json(self) -> dict[str, Any]:
        inc = self.status.incident
        return {
            "role": self.role, "knob": self.knob, "value": self.value, "current": self.current,
            "revert": {"id": self.revert.id, "time": self.revert.time, "author": self.revert.author,
                       "reason": self.revert.reason, "hypothesis": self.revert.hypothesis,
                       "reverts": self.reverted.id},
            "status": self.status.status, "status_why": self.status.why,
            "incident": None if inc is None else {
                "id": inc.id, "title": inc.title, "status": inc.status, "started": inc.started,
                "root_cause": inc.resolution.root_cause if inc.resolution else None,
                "resolved": inc.resolution.time if inc.resolution else None},
            "evidence": [ev.to_json() for ev in self.evidence],
            "gain_ci_low": self.gain, "best_effect": self.best_effect, "command": self.command,
        }


@dataclass
class ReclaimReport:
    reclaimable: list[Reclaim]
    confirmed: list[Reclaim]
    stale_days: float
    engine_version: str | None
    sort: str = "largest lower 95% CI bound of a 'better' level, then largest effect"

    def to_json(self) -> dict[str, Any]:
        return {"sorted_by": self.sort, "stale_days": self.stale_days, "engine_version": self.engine_version,
                "reclaimable": [r.to_json() for r in self.reclaimable],
                "confirmed": [r.to_json() for r in self.confirmed]}


def _same(a, b) -> bool:
    return a == b and type(a) is type(b)


def reclaimable(project: Project, stale_days: float = STALE_DAYS, engine_version: str | None = None,
                now: datetime | None = None) -> ReclaimReport:
    """What reverts took away that evidence says was a gain, and whether it can be taken back."""
    now = now or utcnow()
    explicit = engine_version  # else each evidence is compared with its own inventory's pin
    engine_version = engine_version or current_engine_version(project)
    catalog = load_catalog(project.catalog_path)
    declared = read_declared(project.knobs_path, catalog)
    entries = load_entries(project)
    by_id = {e.id: e for e in entries}
    latest: dict[tuple[str, str], Entry] = {}
    latest_revert: dict[tuple[str, str], Entry] = {}
    for e in entries:
        latest[(e.scope, e.knob)] = e  # the scope: a knob of two stacks' decode is two knobs
        if e.action == "revert":
            latest_revert[(e.scope, e.knob)] = e
    incidents = None
    found: list[Reclaim] = []
    confirmed: list[Reclaim] = []
    for key, revert in latest_revert.items():
        role, knob = key
        target = by_id.get(revert.reverts or "")
        if target is None or target.new is None or not target.evidence:
            continue
        current = declared.get(role, {}).get(knob)
        if _same(current, target.new):
            continue
        views = [view_evidence(project, ev, now, stale_days, explicit) for ev in target.evidence]
        gains = [g for v in views for g in v.gains]
        if not gains:
            continue
        if incidents is None:
            incidents = {i.id: i for i in load_incidents(project)}
        status = revert_status(revert, incidents.get(revert.incident) if revert.incident else None)
        where = f"--role {revert.role}" + (f" --stack {revert.stack}" if revert.stack else "")
        if latest[key] is revert:
            command = f"knobkeeper restore {knob} {where}"
        else:
            # Changed again after the revert: restore no longer applies; set the value back with its evidence.
            shown = catalog.get(knob).display(target.new) if knob in catalog else fmt.value(target.new)
            evidence = "".join(f" --evidence {ev}" for ev in target.evidence)
            command = (f"knobkeeper set {knob}={shown} {where} --reason \"reclaim: revert {revert.id} "
                       f"was {status.status}\"{evidence}")
        gain = max((g.ci_low if g.ci_low is not None else g.effect) for g in gains)
        best = max(g.effect for g in gains)
        item = Reclaim(role, knob, target.new, current, revert, target, status, views, gain, best, command)
        (confirmed if status.status == "confirmed" else found).append(item)
    order = lambda r: (-r.gain, -r.best_effect, r.role, r.knob)  # noqa: E731
    return ReclaimReport(sorted(found, key=order), sorted(confirmed, key=order), stale_days, engine_version)


def format_reclaimable(report: ReclaimReport) -> list[str]:
    """The text `knobkeeper reclaimable` prints (every line through fmt.safe: reasons come from files)."""
    out: list[str] = []
    n = len(report.reclaimable)
    if not n:
        out.append("nothing to reclaim: no revert of a knob with positive evidence is refuted, suspected or unexplained")
    else:
        out.append(f"Reclaimable: {n} knob{'s' if n != 1 else ''}, sorted by what it gives back ({report.sort})")
    for i, item in enumerate(report.reclaimable, 1):
        out.append("")
        out += _format_item(item, f"{i}.")
    if report.confirmed:
        out.append("")
        out.append(f"Not reclaimable: {len(report.confirmed)} revert{'s' if len(report.confirmed) != 1 else ''} "
                   f"confirmed as the cause (restore needs --force)")
        for item in report.confirmed:
            out.append("")
            out += _format_item(item, "-", confirmed=True)
    return [fmt.safe(line) for line in out]


def _format_item(item: Reclaim, mark: str, confirmed: bool = False) -> list[str]:
    gains = sorted(item.gains, key=lambda g: g.concurrency)
    lines = [f"{mark} {item.role}: {item.knob}={fmt.value(item.value)}  (now {fmt.value(item.current)})  "
             f"gives back {gains_text(gains)}"]
    pad = " " * (len(mark) + 1)
    r = item.revert
    lines.append(f"{pad}reverted    {r.time[:19]}Z by {r.author}: entry {r.id} took back {item.reverted.id} "
                 f"({item.reverted.action} of {item.reverted.time[:19]}Z)")
    lines.append(f"{pad}why         {r.reason}")
    if r.hypothesis:
        lines.append(f"{pad}hypothesis  {r.hypothesis}")
    lines.append(f"{pad}status      {item.status.status.upper()} ({MEANING[item.status.status]}): {item.status.why}")
    inc = item.status.incident
    if inc is not None:
        res = f"resolved {inc.resolution.time[:19]}Z, root cause: {inc.resolution.root_cause}" if inc.resolution else "open"
        lines.append(f"{pad}incident    {inc.id} \"{inc.title}\" ({res})")
    for ev in item.evidence:
        if ev.problem:
            lines.append(f"{pad}evidence    {ev.id}: {ev.problem}")
            continue
        engine = " ".join(x for x in (ev.engine, ev.engine_version) if x and x != "unknown") or "engine unknown"
        age = (f"{ev.age_days:.0f} day{'' if round(ev.age_days) == 1 else 's'} old" if ev.age_days is not None
               else "age unknown")
        stale = f"  STALE: {'; '.join(ev.stale_why)}" if ev.stale else ""
        unchecked = f"  ({ev.version_note})" if ev.version_note else ""
        lines.append(f"{pad}evidence    {ev.id}: created {(ev.created or '?')[:10]} ({age}), {engine}{stale}{unchecked}")
        lines.append(f"{pad}              {'concurrency':>11}  {'effect':>7}  {'95% CI':<17}  {'p':>7}  verdict")
        for g in ev.levels:
            lines.append(f"{pad}              {g.concurrency!s:>11}  {fmt.pct(g.effect):>7}  {g.ci_text():<17}  "
                         f"{fmt.p_value(g.p):>7}  {g.verdict}")
        for an in ev.anomalies:
            lines.append(f"{pad}              anomaly: {an.text()}")
    if confirmed:
        lines.append(f"{pad}restore     only with --force: {item.command} --force")
    else:
        lines.append(f"{pad}restore     {item.command}")
    return lines


# --------------------------------------------------------------------------- revert and restore

def evidence_gains(project: Project, entry: Entry) -> list[tuple[str, list[Any]]]:
    """(evidence id, positive levels) for each of the entry's evidence that shows a gain."""
    out = []
    for ident in entry.evidence:
        doc = load_evidence(project, ident)
        if not isinstance(doc, str):
            gains = doc.positive_gains()
            if gains:
                out.append((doc.id, gains))
    return out


def revert(project: Project, knob: str, role: str, reason: str | None, incident: str | None = None,
           hypothesis: str | None = None, options: CommitOptions | None = None) -> Change:
    """`ops.revert_knob`, plus a warning when it gives up a measured gain without naming why.

    A revert for a resolved incident is refused: its resolution has already decided every revert
    made for it, so the new one would be born refuted (open a new incident instead).
    """
    if incident:
        try:
            found = find_incident(project, incident)
        except UserError as exc:
            raise UserError(f"--incident {incident}: {exc}") from None
        if found.resolution is not None:
            raise UserError(f"--incident {found.id}: resolved at {found.resolution.time[:19]}Z (root cause: "
                            f"{fmt.short(found.resolution.root_cause)}); a revert cannot be a suspect for it any more: "
                            f"open a new incident (knobkeeper incident open TITLE)")
    change = ops.revert_knob(project, knob, role, reason, incident, hypothesis, options)
    entry = change.entry
    if entry.incident and entry.hypothesis:
        return change
    target = next((e for e in reversed(load_entries(project)) if e.id == entry.reverts), None)
    gains = evidence_gains(project, target) if target is not None else []
    if gains:
        given_up = "; ".join(f"{gains_text(g)} (evidence {ident})" for ident, g in gains)
        missing = [m for m, v in (("incident (--incident ID)", entry.incident), ("hypothesis (--hypothesis TEXT)",
                                                                             entry.hypothesis)) if not v]
        then = ("it counts as 'unexplained' and stays on `knobkeeper reclaimable` until someone explains it"
                if not entry.incident else "say what the revert is expected to show, so a note can refute or confirm it")
        change.warnings.append(
            f"{knob} on {role} had positive evidence; this revert gives up {given_up}. "
            f"It names no {' and no '.join(missing)}: {then}")
    return change


def restore_guard(project: Project, force: bool):
    """The guard `ops.restore_knob` calls under the repo lock with (entries, revert)."""

    def guard(entries: list[Entry], revert_entry: Entry) -> RestoreVerdict:
        incident = None
        if revert_entry.incident:
            incident = next((i for i in load_incidents(project) if i.id == revert_entry.incident), None)
        status = revert_status(revert_entry, incident)
        verdict = RestoreVerdict()
        if status.status == "confirmed":
            if not force:
                raise UserError(
                    f"restore {revert_entry.knob} on {revert_entry.role}: revert {revert_entry.id} is confirmed as the "
                    f"cause ({status.why}); restoring would bring the cause back. Pass --force to restore anyway")
            verdict.reason = f"forced restore: revert {revert_entry.id} was confirmed ({status.why})"
            verdict.warnings.append(f"revert {revert_entry.id} was confirmed as the cause ({status.why}); restored because of --force")
        elif status.status == "refuted":
            verdict.refutes = True
            by = "a note" if status.source == "note" else "the resolution"
            verdict.reason = f"revert {revert_entry.id} was refuted by {by}: {status.why}"
        elif status.status == "suspected":
            verdict.warnings.append(f"revert {revert_entry.id} is still a suspect for open incident {revert_entry.incident}; "
                                    f"restoring ends that experiment: note the outcome with `knobkeeper incident note "
                                    f"{revert_entry.incident} TEXT --refutes/--confirms {revert_entry.id}`")
        else:
            verdict.reason = None
        original = next((e for e in entries if e.id == revert_entry.reverts), None)
        if original is not None:
            now = utcnow()
            for ident in original.evidence:
                view = view_evidence(project, ident, now, STALE_DAYS, None)
                if view.problem:
                    verdict.warnings.append(f"carried evidence {ident}: {view.problem}")
                elif view.stale:
                    verdict.warnings.append(f"carried evidence {ident} is stale ({'; '.join(view.stale_why)}); "
                                            f"consider measuring again (knobkeeper ab run)")
        return verdict

    return guard


def restore(project: Project, knob: str, role: str, reason: str | None = None, evidence: list[str] | None = None,
            force: bool = False, options: CommitOptions | None = None) -> Change:
    """Restore the value the latest revert took back: a refuted revert's refutation is recorded
    (entry `refutes`, trailer `Refutes:`), a confirmed one needs force."""
    return ops.restore_knob(project, knob, role, reason, evidence, options=options, guard=restore_guard(project, force))


# --------------------------------------------------------------------------- timeline
