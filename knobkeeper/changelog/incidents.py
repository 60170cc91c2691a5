"""Incidents (changelog/incidents/<stamp>-<id>.toml): one TOML file per incident.

    id        = "9f8e7d6c"
    title     = "multi-round harness hangs"
    opened    = "2026-11-29T18:02:11.000000Z"   # when the incident was opened (UTC)
    started   = "2026-11-29T17:55:00.000000Z"   # when the symptom began (default: opened)
    opened_by = "Ann Operator <ann@example.com>"

    [[notes]]                                   # in time order, appended by `incident note`
    time    = "..."
    author  = "..."
    text    = "hang persisted after the revert"
    refutes = "a1b2c3d4"                        # optional: a revert made for this incident
    confirms = "..."                            # optional: idem

    [resolution]                                # absent while the incident is open
    time       = "..."
    author     = "..."
    root_cause = "faulty client proxy"
    implicates = []                             # reverts made for this incident that were the cause

The file's stem is `<stamp of opened>-<id>` (what `revert --incident` globs for). An incident's
status (open/resolved) is not stored: it is "resolved" exactly when [resolution] is present.
The status of each revert made for an incident is derived from its notes and resolution by
`knobkeeper.audit` and never written down.

Rules (all enforced before anything is written):
- --refutes/--confirms/--implicates name existing entries that are reverts made *for this
  incident* (`revert --incident ID`); a note cannot both refute and confirm one revert.
- An incident is resolved once; resolving twice is an error (add a note instead).
- Notes after the resolution are allowed (follow-ups: "restored, no recurrence after 7 days"),
  but they may not refute or confirm: the resolution decides every revert made for the
  incident. Open a new incident when the root cause turns out to be wrong.

Each of open/note/resolve rewrites the one file and is exactly one git commit with trailers
`Incident:`, `Action: open|note|resolve` and `Refutes:`/`Confirms:`/`Implicates:`.
Parsed incidents are cached in .git/knobkeeper/incidents.json keyed by (file name, size,
mtime), like entries; the files stay the truth.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import tomlkit

from knobkeeper.changelog.entries import find_entry, load_entries
from knobkeeper.changelog.filecache import find_one, load_folder, plain_file
from knobkeeper.changelog.store import Message, commit_change, git_author, repo_lock, settle
from knobkeeper.errors import UserError
from knobkeeper.fmt import short
from knobkeeper.project import Project
from knobkeeper.timeutil import EARLIEST, file_stem, id_from_stem, iso, new_id, parse_time, utcnow
from knobkeeper.tomlio import read_toml


@dataclass
class Note:
    time: str
    author: str
    text: str
    refutes: str | None = None
    confirms: str | None = None


@dataclass
class Resolution:
    time: str
    author: str
    root_cause: str
    implicates: list[str] = field(default_factory=list)


@dataclass
class Incident:
    id: str
    title: str
    opened: str
    started: str
    opened_by: str
    notes: list[Note] = field(default_factory=list)
    resolution: Resolution | None = None

    @property
    def status(self) -> str:
        return "resolved" if self.resolution is not None else "open"

    @property
    def stem(self) -> str:
        return file_stem(parse_time(self.opened), self.id)

    def to_json(self) -> dict[str, Any]:
        data = {
            "id": self.id, "title": self.title, "status": self.status, "opened": self.opened,
            "started": self.started, "opened_by": self.opened_by,
            "notes": [{k: v for k, v in asdict(n).items() if v is not None} for n in self.notes],
            "resolution": asdict(self.resolution) if self.resolution else None,
        }
        return data

    def to_toml(self) -> str:
        doc = tomlkit.document()
        for key in ("id", "title", "opened", "started", "opened_by"):
            doc[key] = getattr(self, key)
        if self.notes:
            notes = tomlkit.aot()
            for note in self.notes:
                table = tomlkit.table()
                for key, value in asdict(note).items():
                    if value is not None:
                        table[key] = value
                notes.append(table)
            doc["notes"] = notes
        if self.resolution is not None:
            table = tomlkit.table()
            for key, value in asdict(self.resolution).items():
                table[key] = value
            doc["resolution"] = table
        return tomlkit.dumps(doc)


def incident_path(project: Project, incident: Incident) -> Path:
    return project.incidents_dir / f"{incident.stem}.toml"


# --------------------------------------------------------------------------- reading

def _str(path: Path, where: str, data: dict, key: str, required: bool = True) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{path}: {where}{key}: expected a non-empty string")
    return value


def _time(path: Path, where: str, data: dict, key: str) -> str:
    text = _str(path, where, data, key)
    try:
        parse_time(text)
    except ValueError as exc:
        raise UserError(f"{path}: {where}{key}: {exc}") from None
    return text


def _from_dict(path: Path, data: dict[str, Any]) -> Incident:
    known = {"id", "title", "opened", "started", "opened_by", "notes", "resolution", "status"}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise UserError(f"{path}: unknown field {unknown[0]!r} (an incident has {', '.join(sorted(known - {'status'}))})")
    ident = _str(path, "", data, "id")
    if id_from_stem(path.stem) != ident:
        raise UserError(f"{path}: id = {ident!r} does not match the file name")
    notes = []
    raw_notes = data.get("notes", [])
    if not isinstance(raw_notes, list):
        raise UserError(f"{path}: notes: expected [[notes]] tables")
    for i, raw in enumerate(raw_notes):
        where = f"notes[{i}]."
        if not isinstance(raw, dict):
            raise UserError(f"{path}: notes[{i}]: expected a table")
        extra = [k for k in raw if k not in Note.__dataclass_fields__]
        if extra:
            raise UserError(f"{path}: {where}{extra[0]}: unknown field (a note has time, author, text, refutes, confirms)")
        notes.append(Note(time=_time(path, where, raw, "time"), author=_str(path, where, raw, "author"),
                          text=_str(path, where, raw, "text"), refutes=_str(path, where, raw, "refutes", False),
                          confirms=_str(path, where, raw, "confirms", False)))
    resolution = None
    raw_res = data.get("resolution")
    if raw_res is not None:
        where = "resolution."
        if not isinstance(raw_res, dict):
            raise UserError(f"{path}: resolution: expected a [resolution] table")
        implicates = raw_res.get("implicates", [])
        if not isinstance(implicates, list) or not all(isinstance(x, str) for x in implicates):
            raise UserError(f"{path}: resolution.implicates: expected a list of entry ids")
        resolution = Resolution(time=_time(path, where, raw_res, "time"), author=_str(path, where, raw_res, "author"),
                                root_cause=_str(path, where, raw_res, "root_cause"), implicates=list(implicates))
    return Incident(id=ident, title=_str(path, "", data, "title"), opened=_time(path, "", data, "opened"),
                    started=_time(path, "", data, "started"), opened_by=_str(path, "", data, "opened_by"),
                    notes=notes, resolution=resolution)


def parse_incident_file(path: Path) -> Incident:
    return _from_dict(path, read_toml(plain_file(path)))


def _from_json(data: dict[str, Any]) -> Incident:
    res = data.get("resolution")
    return Incident(id=data["id"], title=data["title"], opened=data["opened"], started=data["started"],
                    opened_by=data["opened_by"], notes=[Note(**n) for n in data.get("notes", [])],
                    resolution=Resolution(**res) if res else None)


def _cacheable(incident: Incident) -> dict[str, Any]:
    data = incident.to_json()
    data.pop("status")
    return data


def load_incidents(project: Project) -> list[Incident]:
    """Every incident, oldest first (by when it was opened; file names sort by that)."""
    settle(project)
    parsed = load_folder(project.incidents_dir, project.private_dir / "incidents.json",
                         lambda path: _cacheable(parse_incident_file(path)))
    return [_from_json(data) for data in parsed]


def find_incident(project: Project, ident: str, incidents: Iterable[Incident] | None = None) -> Incident:
    """By id or unique id prefix (at least 4 characters)."""
    if incidents is None:
        settle(project)
    return find_one(ident, "incident", project.incidents_dir, "knobkeeper incident list", parse_incident_file,
                    incidents, project.rel(project.incidents_dir))


# --------------------------------------------------------------------------- writing

@dataclass
class IncidentChange:
    """What an incident command did: the incident as now written, and the commit."""

    incident: Incident
    action: str
    commit: str | None
    warnings: list[str] = field(default_factory=list)


def _text(value: str | None, what: str) -> str:
    if value is None or not value.strip():
        raise UserError(f"{what}: must not be empty")
    return " ".join(value.split()) if "\n" not in value.strip() else value.strip()


def _short(text: str) -> str:
    return short(text, 60)


def _revert_for(project: Project, incident: Incident, ident: str, option: str, entries) -> str:
    """The full id of a revert made for `incident`, or a UserError saying what `ident` is instead."""
    try:
        entry = find_entry(project, ident, entries)
    except UserError as exc:
        raise UserError(f"{option} {ident}: {exc}") from None
    if entry.action != "revert":
        raise UserError(f"{option} {ident}: entry {entry.id} is a {entry.action} of {entry.knob} on {entry.role}, "
                        f"not a revert (name the revert entry; see `knobkeeper log {entry.knob}`)")
    if entry.incident != incident.id:
        made = f"for incident {entry.incident}" if entry.incident else "with no incident"
        raise UserError(f"{option} {ident}: revert {entry.id} of {entry.knob} was made {made}, not for incident "
                        f"{incident.id}; only reverts made for this incident (revert --incident {incident.id}) can be judged here")
    return entry.id


def _commit(project: Project, incident: Incident, action: str, summary: str, body: str,
            trailers: list[tuple[str, str]], no_commit: bool) -> str | None:
    message = Message(summary=f"incident {incident.id}: {summary}", body=body,
                      trailers=[("Incident", incident.id), ("Action", action), *trailers])
    return commit_change(project, {incident_path(project, incident): incident.to_toml()}, message,
                         no_commit=no_commit, locked=True)


def open_incident(project: Project, title: str | None, started: str | datetime | None = None,
                  *, no_commit: bool = False, now: datetime | None = None) -> IncidentChange:
    """Open an incident: one new file, one commit. `started` = when the symptom began (default: now)."""
    title = _text(title, "incident open TITLE")
    moment = now or utcnow()
    if started is None:
        began = moment
    elif isinstance(started, datetime):
        began = started
    else:
        try:
            began = parse_time(started)
        except ValueError as exc:
            raise UserError(f"--started: {exc}") from None
    if began < EARLIEST:
        raise UserError(f"--started {iso(began)}: before {EARLIEST.date()}; give when the symptom began (ISO 8601)")
    if (began - moment).total_seconds() > 60:
        raise UserError(f"--started {iso(began)}: in the future (now is {iso(moment)})")
    with repo_lock(project):
        incident = Incident(id=new_id(), title=title, opened=iso(moment), started=iso(began),
                            opened_by=git_author(project))
        body = f"Symptom began {incident.started}."
        sha = _commit(project, incident, "open", f"open \"{_short(title)}\"", body, [], no_commit)
    return IncidentChange(incident, "open", sha)


def note_incident(project: Project, ident: str, text: str | None, refutes: str | None = None,
                  confirms: str | None = None, *, no_commit: bool = False) -> IncidentChange:
    """Add a note; it may refute or confirm a revert made for this incident."""
    text = _text(text, "incident note TEXT")
    with repo_lock(project):
        incident = find_incident(project, ident)
        if incident.resolution is not None and (refutes or confirms):
            raise UserError(
                f"incident {incident.id}: resolved at {incident.resolution.time[:19]}Z (root cause: "
                f"{_short(incident.resolution.root_cause)}); its resolution decides every revert made for it, so a "
                f"note can no longer --refutes/--confirms (add a plain note, or open a new incident)")
        entries = load_entries(project) if (refutes or confirms) else None
        ref = _revert_for(project, incident, refutes, "--refutes", entries) if refutes else None
        con = _revert_for(project, incident, confirms, "--confirms", entries) if confirms else None
        if ref is not None and ref == con:
            raise UserError(f"--refutes {refutes} --confirms {confirms}: one note cannot both refute and confirm revert {ref}")
        note = Note(time=iso(utcnow()), author=git_author(project), text=text, refutes=ref, confirms=con)
        incident.notes.append(note)
        trailers = ([("Refutes", ref)] if ref else []) + ([("Confirms", con)] if con else [])
        sha = _commit(project, incident, "note", f"note \"{_short(text)}\"", text, trailers, no_commit)
    return IncidentChange(incident, "note", sha)


def resolve_incident(project: Project, ident: str, root_cause: str | None, implicates: list[str] | None = None,
                     *, no_commit: bool = False) -> IncidentChange:
    """Resolve once, with a root cause. Every revert made for the incident that the resolution does
    not implicate becomes refuted; those it implicates become confirmed."""
    root_cause = _text(root_cause, "--root-cause")
    with repo_lock(project):
        incident = find_incident(project, ident)
        if incident.resolution is not None:
            res = incident.resolution
            raise UserError(f"incident {incident.id}: already resolved at {res.time[:19]}Z by {res.author} "
                            f"(root cause: {_short(res.root_cause)}); add a note instead")
        entries = load_entries(project)
        implicated: list[str] = []
        for ident_ in implicates or []:
            full = _revert_for(project, incident, ident_, "--implicates", entries)
            if full not in implicated:
                implicated.append(full)
        reverts = [e for e in entries if e.action == "revert" and e.incident == incident.id]
        warnings = []
        latest: dict[str, Note] = {}
        for note in incident.notes:
            for rid in (note.refutes, note.confirms):
                if rid:
                    latest[rid] = note
        for revert in reverts:
            note = latest.get(revert.id)
            if note is None:
                continue
            if note.confirms == revert.id and revert.id not in implicated:
                warnings.append(f"revert {revert.id} ({revert.knob} on {revert.role}) was confirmed by the note of "
                                f"{note.time[:19]}Z, but this resolution does not implicate it: it is now refuted")
            if note.refutes == revert.id and revert.id in implicated:
                warnings.append(f"revert {revert.id} ({revert.knob} on {revert.role}) was refuted by the note of "
                                f"{note.time[:19]}Z, but this resolution implicates it: it is now confirmed")
        incident.resolution = Resolution(time=iso(utcnow()), author=git_author(project), root_cause=root_cause,
                                         implicates=implicated)
        # The trailers record what the resolution decided for each revert at this moment.
        trailers = [("Implicates", rid) for rid in implicated]
        trailers += [("Refutes", r.id) for r in reverts if r.id not in implicated]
        body = f"Root cause: {root_cause}"
        if implicated:
            body += "\n\nImplicated reverts: " + ", ".join(implicated)
        sha = _commit(project, incident, "resolve", f"resolve \"{_short(root_cause)}\"", body, trailers, no_commit)
    return IncidentChange(incident, "resolve", sha, warnings)


def snapshot_inventory(project: Project, incident: Incident) -> str | None:
    """The inventory the incident's latest snapshot read (`inventory` in its JSON), or None."""
    folder = project.incidents_dir / incident.stem
    for path in sorted(folder.glob("snapshot-*.json"), reverse=True) if folder.is_dir() else []:
        try:
            data = json.loads(plain_file(path, project.root).read_text())
        except (OSError, ValueError, UserError):
            continue  # a link or a torn file names no stack
        if isinstance(data, dict) and isinstance(data.get("inventory"), str) and data["inventory"]:
            return data["inventory"]
    return None


def add_snapshot(project: Project, ident: str, summary: str, data: dict[str, Any], *,
                 no_commit: bool = False) -> IncidentChange:
    """Record a snapshot of the stack's gauges in an incident: a note (its one-line `summary`, shown
    by `incident show` and `timeline`) and the full `data` as JSON beside the incident file,
    changelog/incidents/<stem>/snapshot-<time>.json, in one commit."""
    with repo_lock(project):
        incident = find_incident(project, ident)
        when = iso(utcnow())
        path = project.incidents_dir / incident.stem / f"snapshot-{when.replace(':', '')}.json"
        incident.notes.append(Note(time=when, author=git_author(project),
                                   text=f"snapshot ({project.rel(path)}): {summary}"))
        message = Message(summary=f"incident {incident.id}: snapshot", body=summary,
                          trailers=[("Incident", incident.id), ("Action", "snapshot")])
        sha = commit_change(project, {incident_path(project, incident): incident.to_toml(),
                                      path: json.dumps({"time": when, **data}, indent=2, default=str) + "\n"},
                            message, no_commit=no_commit, locked=True)
    return IncidentChange(incident, "snapshot", sha)
