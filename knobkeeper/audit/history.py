"""The timeline: knob changes, deploy restarts and incident events in one time-ordered view, and for
each open incident the changes before its symptom as candidates (coincidence in time is not cause).
Deploy records are read only through knobkeeper.deploy.record.load_records (`deploy_records`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from knobkeeper import fmt
from knobkeeper.audit.status import RevertStatus, revert_status
from knobkeeper.changelog.entries import Entry, load_entries, shown_old
from knobkeeper.changelog.incidents import Incident, load_incidents
from knobkeeper.deploy.record import load_records, record_path
from knobkeeper.errors import UserError
from knobkeeper.project import Project
from knobkeeper.timeutil import iso, parse_duration, parse_time, utcnow

CANDIDATE_WARNING = ("coincidence in time is not cause: these changes happened before the symptom began, "
                     "which makes them candidates, not culprits; revert one as a hypothesis and note whether "
                     "the symptom changed")


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
        # a note is an observation of the symptom; a resolution decides without one
        said = {"refuted": "the symptom did not change, ", "confirmed": "the symptom changed, "}.get(s.status, "")
        return f"{when}: {said if s.source == 'note' else ''}{s.words} ({s.why})"

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


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)  # nothing git or knobkeeper wrote is older


def _minus(moment: datetime, delta: timedelta) -> datetime:
    """moment - delta, but never before the epoch (a --lookback of a million days means "all")."""
    try:
        return max(moment - delta, EPOCH)
    except OverflowError:
        return EPOCH


def duration(text: str, option: str) -> timedelta:
    """`--window`/`--lookback` text as a timedelta, or one UserError line naming the option."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None
    except OverflowError:
        raise UserError(f"{option} {text}: too long (at most {timedelta.max.days} days; e.g. 30d)") from None


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
        half = duration(width or "2h", "--window")
        center = when(around, "--around")
        try:
            return center - half, center + half
        except OverflowError:
            raise UserError(f"--window {width}: reaches past the years 1..9999 around {iso(center)}; "
                            f"give a shorter window (e.g. 30d)") from None
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
    return f"{e.role}: {e.action} {e.knob} {shown_old(e)} -> {fmt.value(e.new)}{links}{ev}  ({e.author}: {fmt.short(e.reason, 60)})"


def _iso_of(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return iso(parse_time(value))
    except ValueError:
        return None


def deploy_records(project: Project, problems: list[str]) -> list[Any]:
    """The committed deploy records (knobkeeper.deploy.record): the one place audit reads them.
    A record that cannot be read is reported in `problems`, not fatal."""
    return load_records(project, problems)  # an unreadable record is named there, the rest still count


def deploy_events(project: Project, problems: list[str] | None = None, lo: str | None = None,
                  hi: str | None = None) -> list[Event]:
    """Every deploy record as events: the run itself and each restart (when issued, when healthy).

    With `lo`/`hi` (iso times), runs that started outside [lo - 1 day, hi] are left out: a deploy
    run is assumed to last less than a day.
    """
    problems = [] if problems is None else problems
    first = iso(_minus(parse_time(lo), timedelta(days=1))) if lo else None
    events: list[Event] = []
    for rec in deploy_records(project, problems):
        start = _iso_of(rec.started_at)
        if start is None:
            problems.append(f"deploy {rec.id}: started_at {rec.started_at!r} is not a time")
            continue
        if (first and start < first) or (hi and start > hi):
            continue
        acted = [row for row in rec.services if row.acted]
        bits = [f"inventory {rec.inventory}", f"git {str(rec.commit)[:10]}" if rec.commit else "",
                f"{len(acted)} restart(s)", f"result {rec.result}"]
        events.append(Event(start, "deploy", rec.id, f"deploy {rec.id}: " + ", ".join(b for b in bits if b),
                            {"file": project.rel(record_path(project, rec, committed=True))}))
        for row in acted:
            issued, healthy = _iso_of(row.restart_issued_at), _iso_of(row.healthy_at)
            gate = row.gate.result if row.gate else None
            what = " ".join(str(x) for x in (row.role, row.service, "on", row.host) if x)
            tail = (f", healthy {healthy[11:19]}Z" if healthy else ", not healthy") + (f" (gate {gate})" if gate else "")
            events.append(Event(issued or healthy or start, "restart", rec.id, f"{row.action} {what}{tail}",
                                {"deploy": rec.id, "role": row.role, "host": row.host, "service": row.service,
                                 "action": row.action, "issued": issued, "healthy": healthy}))
    return events


def incident_events(incident: Incident) -> list[Event]:
    events = [Event(incident.started, "incident", incident.id, f"{incident.id} symptom began: \"{incident.title}\"",
                    {"event": "started"}),
              Event(incident.opened, "incident", incident.id, f"{incident.id} opened by {incident.opened_by}: "
                    f"\"{incident.title}\"", {"event": "opened"})]
    for note in incident.notes:
        judged = "".join(f" ({k} {v})" for k, v in (("refutes", note.refutes), ("confirms", note.confirms)) if v)
        events.append(Event(note.time, "incident", incident.id, f"{incident.id} note by {note.author}: "
                            f"\"{fmt.short(note.text)}\"{judged}", {"event": "note", "refutes": note.refutes,
                                                                  "confirms": note.confirms}))
    if incident.resolution:
        res = incident.resolution
        imp = f" (implicates {', '.join(res.implicates)})" if res.implicates else ""
        events.append(Event(res.time, "incident", incident.id, f"{incident.id} resolved by {res.author}: root cause "
                            f"\"{fmt.short(res.root_cause)}\"{imp}", {"event": "resolved", "implicates": res.implicates}))
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
            earliest = min(earliest, iso(_minus(parse_time(inc.started), lookback)))
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
        c_lo = iso(_minus(start, lookback))
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
    """The human text of `timeline`: one line per item, every line through fmt.safe (reasons, notes
    and values come from files anyone can edit; --json prints them raw)."""
    return [fmt.safe(line) for line in _timeline_lines(tl)]


def _timeline_lines(tl: Timeline) -> list[str]:
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
