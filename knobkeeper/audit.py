"""Reverts are hypotheses. This module derives each revert's status, lists the performance that
reverts gave up and can be reclaimed, guards `restore`, and builds the timeline.

Revert status (derived from the changelog every time, never stored):

    unexplained  the revert names no incident (`revert` without --incident).
    suspected    made for an incident (--incident) and nothing is known yet: the incident is
                 open and no note refutes or confirms it.
    refuted      a note refutes it ("hang persisted after the revert"), or the incident is
                 resolved with a root cause that does not implicate it.
    confirmed    a note confirms it, or the incident's resolution implicates it.

While the incident is open the latest note that names the revert decides; once it is resolved
the resolution decides (it is the last word: notes after it cannot refute or confirm, see
changelog/incidents.py).

`reclaimable`: every (role, knob) whose latest revert took back a value that had positive
evidence (a judgement level with verdict "better"), whose declared value today differs from
that value, and whose revert is refuted, suspected or unexplained. Confirmed reverts are
listed apart as not reclaimable. Sorted by what it gives back: the largest lower 95% CI bound
of a "better" level (the gain we are confident of), then the largest effect.

Evidence is stale when it is older than `stale_days` (default 30) or when its
setup.engine_version differs from the current engine version. The current engine version is
the `engine_version` argument (CLI --engine-version) or, when not given, an `engine_version = "..."`
line in inventory/group_data/all.py if there is one; otherwise only age counts.

This module reads evidence JSON itself (schema knobkeeper.evidence/1, validated with
evidence.schema): knobkeeper.evidence.store imports the judge and with it scipy (~1.5 s), which
would put `reclaimable` far over its 1 s budget.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from knobkeeper.knobs.catalog import show_value
from knobkeeper.changelog import ops
from knobkeeper.changelog.entries import Entry, load_entries
from knobkeeper.changelog.incidents import Incident, Note, load_incidents
from knobkeeper.changelog.ops import Change, CommitOptions, RestoreVerdict
from knobkeeper.errors import UserError
from knobkeeper.project import Project
from knobkeeper.timeutil import STAMP_FORMAT, id_from_stem, iso, parse_duration, parse_time, utcnow

STATUSES = ("refuted", "suspected", "unexplained", "confirmed")
RECLAIMABLE_STATUSES = ("refuted", "suspected", "unexplained")
STALE_DAYS = 30
CANDIDATE_WARNING = ("coincidence in time is not cause: these changes happened before the symptom began, "
                     "which makes them candidates, not culprits; revert one as a hypothesis and note whether "
                     "the symptom changed")


def fmt_pct(x: float | None, digits: int = 1) -> str:
    """Same format as evidence.judge.fmt_pct (imported there with scipy, so not imported here)."""
    return "n/a" if x is None else f"{x * 100:+.{digits}f}%"


def _short(text: str, width: int = 70) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


# --------------------------------------------------------------------------- revert status

@dataclass
class RevertStatus:
    revert: Entry
    status: str                   # one of STATUSES
    why: str                      # who or what decided it, in words
    source: str | None = None     # "note" | "resolution" | None
    incident: Incident | None = None
    note: Note | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"revert": self.revert.id, "status": self.status, "why": self.why, "source": self.source,
                                "incident": self.revert.incident}
        if self.note is not None:
            data["note"] = {"time": self.note.time, "author": self.note.author, "text": self.note.text}
        return data


def revert_status(revert: Entry, incident: Incident | None) -> RevertStatus:
    """The status of one revert, from its incident's notes and resolution."""
    if revert.incident is None:
        return RevertStatus(revert, "unexplained", "the revert names no incident")
    if incident is None:
        return RevertStatus(revert, "suspected", f"incident {revert.incident} is not in changelog/incidents/")
    res = incident.resolution
    if res is not None:
        # The resolution decides; the latest note that named the revert is kept as supporting detail.
        note = next((n for n in reversed(incident.notes) if revert.id in (n.refutes, n.confirms)), None)
        said = ""
        if note is not None:
            verb = "refuted" if note.refutes == revert.id else "confirmed"
            said = f"; the note of {note.time[:19]}Z had {verb} it: \"{_short(note.text)}\""
        if revert.id in res.implicates:
            return RevertStatus(revert, "confirmed", f"the resolution of incident {incident.id} ({res.time[:19]}Z) "
                                f"implicates it: root cause \"{_short(res.root_cause)}\"{said}", "resolution", incident, note)
        return RevertStatus(revert, "refuted", f"incident {incident.id} was resolved ({res.time[:19]}Z) with root cause "
                            f"\"{_short(res.root_cause)}\", which does not implicate it{said}", "resolution", incident, note)
    for note in reversed(incident.notes):
        if note.refutes == revert.id:
            return RevertStatus(revert, "refuted", f"note of {note.time[:19]}Z on incident {incident.id}: "
                                f"\"{_short(note.text)}\"", "note", incident, note)
        if note.confirms == revert.id:
            return RevertStatus(revert, "confirmed", f"note of {note.time[:19]}Z on incident {incident.id}: "
                                f"\"{_short(note.text)}\"", "note", incident, note)
    return RevertStatus(revert, "suspected", f"incident {incident.id} is open and no note refutes or confirms it",
                        None, incident)


def revert_statuses(project: Project, entries: list[Entry] | None = None,
                    incidents: list[Incident] | None = None) -> dict[str, RevertStatus]:
    """revert id -> status, for every revert in the changelog."""
    entries = load_entries(project) if entries is None else entries
    by_id = {i.id: i for i in (load_incidents(project) if incidents is None else incidents)}
    return {e.id: revert_status(e, by_id.get(e.incident) if e.incident else None)
            for e in entries if e.action == "revert"}


# --------------------------------------------------------------------------- evidence

class EvidenceReader:
    """Loads evidence docs by id from changelog/evidence/ (one directory scan per reader)."""

    def __init__(self, project: Project):
        self.project = project
        self._paths: dict[str, Path] | None = None
        self._docs: dict[str, dict | str] = {}

    def _index(self) -> dict[str, Path]:
        if self._paths is None:
            folder = self.project.evidence_dir
            self._paths = {}
            if folder.is_dir():
                for path in folder.glob("*.json"):
                    if not path.name.startswith("."):
                        self._paths[id_from_stem(path.stem)] = path
        return self._paths

    def load(self, ident: str) -> dict | str:
        """The doc, or a string saying why it cannot be read."""
        if ident in self._docs:
            return self._docs[ident]
        index = self._index()
        path = index.get(ident)
        if path is None:
            hits = [p for i, p in index.items() if i.startswith(ident)]
            path = hits[0] if len(hits) == 1 else None
        if path is None:
            result: dict | str = f"evidence {ident} is not in {self.project.rel(self.project.evidence_dir)}/"
        else:
            from knobkeeper.evidence.schema import validate

            try:
                doc = json.loads(path.read_text())
                problems = validate(doc)
                result = doc if not problems else f"{self.project.rel(path)}: {problems[0]}"
            except (OSError, ValueError) as exc:
                result = f"{self.project.rel(path)}: unreadable ({exc})"
        self._docs[ident] = result
        return result


def levels(doc: dict) -> list[dict]:
    """Per concurrency level: concurrency, effect, ci_low, ci_high, p_value, verdict (relative)."""
    return [{"concurrency": lv.get("concurrency"), "effect": lv.get("effect"), "ci_low": lv.get("ci_low"),
             "ci_high": lv.get("ci_high"), "p_value": lv.get("p_value"), "verdict": lv.get("verdict")}
            for lv in doc["judgement"]["levels"]]


def positive_levels(doc: dict) -> list[dict]:
    """The levels judged "better" with a positive effect: the gain a revert gives up."""
    return [lv for lv in levels(doc) if lv["verdict"] == "better" and (lv["effect"] or 0) > 0]


def gains_text(gains: list[dict]) -> str:
    """`+12.8% at concurrency 64, +5.7% at 96`."""
    parts = []
    for i, lv in enumerate(gains):
        where = f"at concurrency {lv['concurrency']}" if i == 0 else f"at {lv['concurrency']}"
        parts.append(f"{fmt_pct(lv['effect'])} {where}")
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
    levels: list[dict] = field(default_factory=list)
    gains: list[dict] = field(default_factory=list)
    anomalies: list[dict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def view_evidence(reader: EvidenceReader, ident: str, now: datetime, stale_days: float,
                  engine_version: str | None) -> EvidenceView:
    doc = reader.load(ident)
    if isinstance(doc, str):
        return EvidenceView(id=ident, problem=doc)
    setup = doc.get("setup") or {}
    view = EvidenceView(id=doc["id"], created=doc["created"], engine=setup.get("engine"),
                        engine_version=setup.get("engine_version"), levels=levels(doc),
                        gains=positive_levels(doc), anomalies=list(doc.get("anomalies") or []))
    try:
        view.age_days = round((now - parse_time(doc["created"])).total_seconds() / 86400, 1)
    except ValueError:
        view.stale_why.append(f"created {doc['created']!r} is not a time")
    if view.age_days is not None and view.age_days > stale_days:
        view.stale_why.append(f"{view.age_days:.0f} days old (older than {stale_days:g})")
    if engine_version and view.engine_version and view.engine_version != engine_version:
        view.stale_why.append(f"measured on engine {view.engine_version}, current is {engine_version}")
    view.stale = bool(view.stale_why)
    return view


def current_engine_version(project: Project) -> str | None:
    """`engine_version = "..."` in inventory/group_data/all.py, when the inventory declares it."""
    path = project.inventory_dir / "group_data" / "all.py"
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(r"""^engine_version\s*=\s*["']([^"']+)["']""", text, re.M)
    return match.group(1) if match else None


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
    def gains(self) -> list[dict]:
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
    from knobkeeper.knobs.catalog import load_catalog
    from knobkeeper.knobs.state import read_declared

    now = now or utcnow()
    engine_version = engine_version or current_engine_version(project)
    catalog = load_catalog(project.catalog_path)
    declared = read_declared(project.knobs_path, catalog)
    entries = load_entries(project)
    by_id = {e.id: e for e in entries}
    latest: dict[tuple[str, str], Entry] = {}
    latest_revert: dict[tuple[str, str], Entry] = {}
    for e in entries:
        latest[(e.role, e.knob)] = e
        if e.action == "revert":
            latest_revert[(e.role, e.knob)] = e
    incidents = None
    reader = EvidenceReader(project)
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
        views = [view_evidence(reader, ev, now, stale_days, engine_version) for ev in target.evidence]
        gains = [g for v in views for g in v.gains]
        if not gains:
            continue
        if incidents is None:
            incidents = {i.id: i for i in load_incidents(project)}
        status = revert_status(revert, incidents.get(revert.incident) if revert.incident else None)
        if latest[key] is revert:
            command = f"knobkeeper restore {knob} --role {role}"
        else:
            # Changed again after the revert: restore no longer applies; set the value back with its evidence.
            shown = catalog.get(knob).display(target.new) if knob in catalog else show_value(target.new)
            evidence = "".join(f" --evidence {ev}" for ev in target.evidence)
            command = (f"knobkeeper set {knob}={shown} --role {role} --reason \"reclaim: revert {revert.id} "
                       f"was {status.status}\"{evidence}")
        gain = max((g["ci_low"] if g["ci_low"] is not None else g["effect"]) for g in gains)
        best = max(g["effect"] for g in gains)
        item = Reclaim(role, knob, target.new, current, revert, target, status, views, gain, best, command)
        (confirmed if status.status == "confirmed" else found).append(item)
    order = lambda r: (-r.gain, -r.best_effect, r.role, r.knob)  # noqa: E731
    return ReclaimReport(sorted(found, key=order), sorted(confirmed, key=order), stale_days, engine_version)


def format_reclaimable(report: ReclaimReport) -> list[str]:
    """The text `knobkeeper reclaimable` prints."""
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
    return out


def _format_item(item: Reclaim, mark: str, confirmed: bool = False) -> list[str]:
    gains = sorted(item.gains, key=lambda g: g["concurrency"])
    lines = [f"{mark} {item.role}: {item.knob}={show_value(item.value)}  (now {show_value(item.current)})  "
             f"gives back {gains_text(gains)}"]
    pad = " " * (len(mark) + 1)
    r = item.revert
    lines.append(f"{pad}reverted    {r.time[:19]}Z by {r.author}: entry {r.id} took back {item.reverted.id} "
                 f"({item.reverted.action} of {item.reverted.time[:19]}Z)")
    lines.append(f"{pad}why         {r.reason}")
    if r.hypothesis:
        lines.append(f"{pad}hypothesis  {r.hypothesis}")
    lines.append(f"{pad}status      {item.status.status.upper()}: {item.status.why}")
    inc = item.status.incident
    if inc is not None:
        res = f"resolved {inc.resolution.time[:19]}Z, root cause: {inc.resolution.root_cause}" if inc.resolution else "open"
        lines.append(f"{pad}incident    {inc.id} \"{inc.title}\" ({res})")
    for ev in item.evidence:
        if ev.problem:
            lines.append(f"{pad}evidence    {ev.id}: {ev.problem}")
            continue
        engine = " ".join(x for x in (ev.engine, ev.engine_version) if x) or "engine unknown"
        age = (f"{ev.age_days:.0f} day{'' if round(ev.age_days) == 1 else 's'} old" if ev.age_days is not None
               else "age unknown")
        stale = f"  STALE: {'; '.join(ev.stale_why)}" if ev.stale else ""
        lines.append(f"{pad}evidence    {ev.id}: created {(ev.created or '?')[:10]} ({age}), {engine}{stale}")
        lines.append(f"{pad}              {'concurrency':>11}  {'effect':>7}  {'95% CI':<17}  {'p':>7}  verdict")
        for lv in ev.levels:
            ci = f"{fmt_pct(lv['ci_low'])}..{fmt_pct(lv['ci_high'])}" if lv["ci_low"] is not None else "n/a"
            p = f"{lv['p_value']:.3g}" if isinstance(lv["p_value"], (int, float)) else "n/a"
            lines.append(f"{pad}              {lv['concurrency']!s:>11}  {fmt_pct(lv['effect']):>7}  {ci:<17}  {p:>7}  {lv['verdict']}")
        for an in ev.anomalies:
            lines.append(f"{pad}              anomaly: arm {an.get('arm')} throughput at {an.get('to_concurrency')} "
                         f"is {fmt_pct(an.get('change'))} vs {an.get('from_concurrency')}")
    if confirmed:
        lines.append(f"{pad}restore     only with --force: {item.command} --force")
    else:
        lines.append(f"{pad}restore     {item.command}")
    return lines


# --------------------------------------------------------------------------- revert and restore

def evidence_gains(project: Project, entry: Entry, reader: EvidenceReader | None = None) -> list[tuple[str, list[dict]]]:
    """(evidence id, positive levels) for each of the entry's evidence that shows a gain."""
    reader = reader or EvidenceReader(project)
    out = []
    for ident in entry.evidence:
        doc = reader.load(ident)
        if isinstance(doc, dict):
            gains = positive_levels(doc)
            if gains:
                out.append((doc["id"], gains))
    return out


def revert(project: Project, knob: str, role: str, reason: str | None, incident: str | None = None,
           hypothesis: str | None = None, options: CommitOptions | None = None) -> Change:
    """`ops.revert_knob`, plus a warning when it gives up a measured gain without naming why.

    A revert for a resolved incident is refused: its resolution has already decided every revert
    made for it, so the new one would be born refuted (open a new incident instead).
    """
    if incident:
        from knobkeeper.changelog.incidents import find_incident

        try:
            found = find_incident(project, incident)
        except UserError as exc:
            raise UserError(f"--incident {incident}: {exc}") from None
        if found.resolution is not None:
            raise UserError(f"--incident {found.id}: resolved at {found.resolution.time[:19]}Z (root cause: "
                            f"{_short(found.resolution.root_cause)}); a revert cannot be a suspect for it any more: "
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
            reader = EvidenceReader(project)
            now = utcnow()
            for ident in original.evidence:
                view = view_evidence(reader, ident, now, STALE_DAYS, current_engine_version(project))
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

@dataclass
class Event:
    time: str
    kind: str          # knob | deploy | restart | incident
    ref: str           # entry, deploy or incident id
    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "kind": self.kind, "ref": self.ref, "text": self.text, **self.data}


@dataclass
class Candidate:
    entry: Entry
    revert: Entry | None
    status: RevertStatus | None

    @property
    def verdict(self) -> str:
        if self.revert is None:
            return "not reverted"
        s = self.status
        when = f"reverted {self.revert.time[:19]}Z (entry {self.revert.id})"
        if s.status == "refuted":
            said = "the symptom did not change, refuted" if s.source == "note" else "refuted"
            return f"{when}: {said} ({s.why})"
        if s.status == "confirmed":
            said = "the symptom changed, confirmed" if s.source == "note" else "confirmed"
            return f"{when}: {said} ({s.why})"
        if s.status == "suspected":
            return f"{when}: no verdict yet ({s.why})"
        return f"{when}: unexplained ({s.why})"

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.entry.id, "time": self.entry.time, "role": self.entry.role, "knob": self.entry.knob,
                "action": self.entry.action, "old": self.entry.old, "new": self.entry.new,
                "revert": self.revert.id if self.revert else None,
                "revert_status": self.status.status if self.status else None, "verdict": self.verdict}


@dataclass
class OpenIncident:
    incident: Incident
    since: str
    candidates: list[Candidate]
    restarts: list[Event]
    warning: str = CANDIDATE_WARNING

    def to_json(self) -> dict[str, Any]:
        return {"id": self.incident.id, "title": self.incident.title, "started": self.incident.started,
                "opened": self.incident.opened, "candidates_since": self.since, "warning": self.warning,
                "candidates": [c.to_json() for c in self.candidates],
                "restarts": [r.to_json() for r in self.restarts]}


@dataclass
class Timeline:
    since: str
    until: str
    events: list[Event]
    open_incidents: list[OpenIncident]
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "until": self.until, "events": [e.to_json() for e in self.events],
                "open_incidents": [o.to_json() for o in self.open_incidents], "problems": self.problems}


def window(since: str | None = None, until: str | None = None, around: str | None = None,
           width: str | None = None, now: datetime | None = None) -> tuple[datetime, datetime]:
    """[since, until] from --since/--until (default: the last 7 days) or --around T --window D (default 2h)."""
    now = now or utcnow()

    def when(text: str, option: str) -> datetime:
        try:
            return parse_time(text)
        except ValueError as exc:
            raise UserError(f"{option}: {exc}") from None

    if around is not None:
        if since is not None or until is not None:
            raise UserError("--around: give either --since/--until or --around/--window, not both")
        try:
            half = parse_duration(width or "2h")
        except ValueError as exc:
            raise UserError(f"--window: {exc}") from None
        center = when(around, "--around")
        return center - half, center + half
    if width is not None:
        raise UserError("--window: only with --around T (the window is T ± D)")
    lo = when(since, "--since") if since else now - timedelta(days=7)
    hi = when(until, "--until") if until else now
    if hi < lo:
        raise UserError(f"--until {iso(hi)} is before --since {iso(lo)}")
    return lo, hi


def _entry_text(e: Entry) -> str:
    links = "".join(f" {k}={v}" for k, v in (("reverts", e.reverts), ("restores", e.restores), ("refutes", e.refutes),
                                              ("incident", e.incident)) if v)
    ev = f" evidence={','.join(e.evidence)}" if e.evidence else ""
    return f"{e.role}: {e.action} {e.knob} {show_value(e.old)} -> {show_value(e.new)}{links}{ev}  ({e.author}: {_short(e.reason, 60)})"


def _iso_of(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return iso(parse_time(value))
    except ValueError:
        return None


def _first(data: dict, *keys: str) -> Any:
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return None


def deploy_events(project: Project, problems: list[str] | None = None, lo: str | None = None,
                  hi: str | None = None) -> list[Event]:
    """Every deploy record as events: the run itself and each restart (when issued, when healthy).

    The format belongs to knobkeeper.deploy.record: {id, inventory, commit, started_at, result,
    services: [{host, service, role, action: restarted|started|unchanged, restart_issued_at,
    healthy_at, gate: {result}}]}. It is read tolerantly (plain JSON, no import of the deploy
    package, which sits beside audit in the layering): older or hand-made records with
    started/time, git_sha, restart_issued/issued, healthy, a string gate, or items under
    steps/restarts/hosts[].services are shown too, and an unreadable file is reported, not fatal.

    With `lo`/`hi` (iso times), records whose file stamp (the run's start) lies outside
    [lo - 1 day, hi] are not read: a deploy run is assumed to last less than a day.
    """
    folder = project.deploys_dir
    events: list[Event] = []
    if not folder.is_dir():
        return events
    first = iso(parse_time(lo) - timedelta(days=1)).replace("-", "").replace(":", "") if lo else None
    last = iso(parse_time(hi)).replace("-", "").replace(":", "") if hi else None
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):
            continue
        stamp_ = path.stem.rsplit("-", 1)[0]
        if len(stamp_) == len("20261129T170226.168580Z") and ((first and stamp_ < first) or (last and stamp_ > last)):
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            if problems is not None:
                problems.append(f"{project.rel(path)}: unreadable ({exc})")
            continue
        if not isinstance(doc, dict):
            continue
        ident = str(doc.get("id") or id_from_stem(path.stem))
        stamp = path.stem.rsplit("-", 1)[0]
        try:
            file_time = iso(datetime.strptime(stamp, STAMP_FORMAT).replace(tzinfo=timezone.utc))
        except ValueError:
            file_time = None
        start = _iso_of(_first(doc, "started", "started_at", "time", "created", "start")) or file_time
        items = _deploy_items(doc)
        gate = _first(doc, "gate", "result", "status", "outcome")
        if isinstance(gate, dict):
            gate = _first(gate, "result", "status", "passed")
        sha = _first(doc, "git_sha", "sha", "commit")
        if start:
            restarted = sum(1 for it in items if it.get("action") in ("restarted", "started"))
            bits = [f"inventory {doc.get('inventory')}" if doc.get("inventory") else "",
                    f"git {str(sha)[:10]}" if sha else "", f"{restarted} restart(s)", f"result {gate}" if gate is not None else ""]
            events.append(Event(start, "deploy", ident, f"deploy {ident}: " + ", ".join(b for b in bits if b),
                                {"file": project.rel(path)}))
        for it in items:
            action = it.get("action")
            if action not in ("restarted", "started"):
                continue
            issued = _iso_of(_first(it, "restart_issued", "issued", "restart_issued_at", "issued_at", "restarted_at",
                                    "started_at", "time"))
            healthy = _iso_of(_first(it, "healthy_at", "healthy", "became_healthy"))
            when = issued or healthy or start
            if not when:
                continue
            it_gate = _first(it, "gate", "health", "result")
            if isinstance(it_gate, dict):
                it_gate = _first(it_gate, "result", "status", "passed")
            what = " ".join(str(x) for x in (it.get("role"), it.get("service"), "on", it.get("host")) if x)
            tail = f", healthy {healthy[11:19]}Z" if healthy else ", not healthy"
            if it_gate is not None:
                tail += f" (gate {it_gate})"
            events.append(Event(when, "restart", ident, f"{action} {what}{tail}",
                                {"deploy": ident, "role": it.get("role"), "host": it.get("host"),
                                 "service": it.get("service"), "action": action, "issued": issued, "healthy": healthy}))
    return events


def _deploy_items(doc: dict) -> list[dict]:
    items: list[dict] = []
    for key in ("services", "steps", "restarts", "actions"):
        value = doc.get(key)
        if isinstance(value, list):
            items += [x for x in value if isinstance(x, dict)]
        elif isinstance(value, dict):
            # keyed by "host/service" or host -> {service -> item}
            for name, item in value.items():
                if isinstance(item, dict):
                    items.append({"service": name, **item} if "action" in item else {})
    hosts = doc.get("hosts")
    if isinstance(hosts, list):
        for host in hosts:
            if isinstance(host, dict):
                for svc in host.get("services") or []:
                    if isinstance(svc, dict):
                        items.append({"host": host.get("host") or host.get("name"), **svc})
    elif isinstance(hosts, dict):
        for hname, host in hosts.items():
            services = host.get("services") if isinstance(host, dict) else None
            if isinstance(services, dict):
                for sname, svc in services.items():
                    if isinstance(svc, dict):
                        items.append({"host": hname, "service": sname, **svc})
            elif isinstance(services, list):
                items += [{"host": hname, **svc} for svc in services if isinstance(svc, dict)]
    return [x for x in items if x]


def incident_events(incident: Incident) -> list[Event]:
    events = [Event(incident.started, "incident", incident.id, f"{incident.id} symptom began: \"{incident.title}\"",
                    {"event": "started"}),
              Event(incident.opened, "incident", incident.id, f"{incident.id} opened by {incident.opened_by}: "
                    f"\"{incident.title}\"", {"event": "opened"})]
    for note in incident.notes:
        judged = "".join(f" ({k} {v})" for k, v in (("refutes", note.refutes), ("confirms", note.confirms)) if v)
        events.append(Event(note.time, "incident", incident.id, f"{incident.id} note by {note.author}: "
                            f"\"{_short(note.text)}\"{judged}", {"event": "note", "refutes": note.refutes,
                                                                  "confirms": note.confirms}))
    if incident.resolution:
        res = incident.resolution
        imp = f" (implicates {', '.join(res.implicates)})" if res.implicates else ""
        events.append(Event(res.time, "incident", incident.id, f"{incident.id} resolved by {res.author}: root cause "
                            f"\"{_short(res.root_cause)}\"{imp}", {"event": "resolved", "implicates": res.implicates}))
    return events


def timeline(project: Project, since: datetime, until: datetime, lookback: timedelta = timedelta(hours=72)) -> Timeline:
    """Knob entries, deploy restarts and incident events in [since, until], in time order; and for
    each incident still open at `until`, the changes in the `lookback` before its symptom began."""
    lo, hi = iso(since), iso(until)
    entries = load_entries(project)
    incidents = load_incidents(project)
    problems: list[str] = []
    earliest = lo
    for inc in incidents:
        if inc.resolution is None and inc.started <= hi:
            earliest = min(earliest, iso(parse_time(inc.started) - lookback))
    deploys = deploy_events(project, problems, earliest, hi)
    events: list[Event] = []
    for e in entries:  # entry times are all iso(): string order is time order
        if lo <= e.time <= hi:
            # vars(), not Entry.to_json(): dataclasses.asdict costs ~0.1 ms an entry.
            events.append(Event(e.time, "knob", e.id, _entry_text(e),
                                {"entry": {k: v for k, v in vars(e).items() if v is not None and v != []}}))
    events += [d for d in deploys if lo <= d.time <= hi]
    for inc in incidents:
        events += [ev for ev in incident_events(inc) if lo <= ev.time <= hi]
    order = {"restart": 1, "deploy": 0, "knob": 2, "incident": 3}
    events.sort(key=lambda ev: (ev.time, order.get(ev.kind, 9)))

    open_ones = []
    by_inc = {i.id: i for i in incidents}
    reverts_of: dict[str, Entry] = {}
    for e in entries:
        if e.action == "revert" and e.reverts:
            reverts_of[e.reverts] = e  # the latest revert of each entry
    for inc in incidents:
        if inc.resolution is not None or inc.started > hi:
            continue
        start = parse_time(inc.started)
        c_lo = iso(start - lookback)
        cands = []
        for e in entries:
            if c_lo <= e.time <= inc.started and e.action != "revert":
                rev = reverts_of.get(e.id)
                status = revert_status(rev, by_inc.get(rev.incident) if rev.incident else None) if rev else None
                cands.append(Candidate(e, rev, status))
        restarts = [d for d in deploys if d.kind == "restart" and c_lo <= d.time <= inc.started]
        open_ones.append(OpenIncident(inc, c_lo, cands, restarts))
    return Timeline(lo, hi, events, open_ones, problems)


def format_timeline(tl: Timeline) -> list[str]:
    out = [f"Timeline {tl.since[:19]}Z .. {tl.until[:19]}Z: {len(tl.events)} event{'s' if len(tl.events) != 1 else ''}"]
    for ev in tl.events:
        out.append(f"{ev.time[:19]}Z  {ev.kind:<8}  {ev.text}  [{ev.ref}]")
    for oi in tl.open_incidents:
        inc = oi.incident
        out.append("")
        out.append(f"Open incident {inc.id} \"{inc.title}\": symptom began {inc.started[:19]}Z, opened {inc.opened[:19]}Z")
        out.append(f"  candidates: changes from {oi.since[:19]}Z until the symptom began")
        out.append(f"  warning: {oi.warning}")
        if not oi.candidates and not oi.restarts:
            out.append("  (no knob change or restart in that window)")
        for c in oi.candidates:
            out.append(f"  {c.entry.time[:19]}Z  {_entry_text(c.entry)}  [{c.entry.id}]")
            out.append(f"      {c.verdict}")
        for r in oi.restarts:
            out.append(f"  {r.time[:19]}Z  restart  {r.text}  [deploy {r.ref}]")
    for p in tl.problems:
        out.append(f"problem: {p}")
    return out
