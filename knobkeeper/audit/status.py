"""Revert status: a revert is a hypothesis, and its incident's notes and resolution decide it.
Derived from the changelog every time, never stored:

    unexplained  the revert names no incident (`revert` without --incident).
    suspected    made for an incident (--incident) and nothing is known yet: the incident is
                 open and no note refutes or confirms it.
    refuted      a note refutes it ("hang persisted after the revert"), or the incident is
                 resolved with a root cause that does not implicate it.
    confirmed    a note confirms it, or the incident's resolution implicates it.

While the incident is open the latest note that names the revert decides; once it is resolved
the resolution decides (it is the last word: notes after it cannot refute or confirm, see
changelog/incidents.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from knobkeeper import fmt
from knobkeeper.changelog.entries import Entry, load_entries
from knobkeeper.changelog.incidents import Incident, Note, load_incidents
from knobkeeper.project import Project

STATUSES = ("refuted", "suspected", "unexplained", "confirmed")
# What each status means for the knob: the words every reader shows beside it (reclaimable, the
# timeline, review's reverts table, the report's badges).
MEANING = {"refuted": "the knob was innocent", "confirmed": "the knob was the cause",
           "suspected": "no verdict yet", "unexplained": "no incident named"}


def describe(status: str) -> str:
    """`refuted (the knob was innocent)`."""
    return f"{status} ({MEANING[status]})" if status in MEANING else status


@dataclass
class RevertStatus:
    revert: Entry
    status: str                   # one of STATUSES
    why: str                      # who or what decided it, in words
    source: str | None = None     # "note" | "resolution" | None
    incident: Incident | None = None
    note: Note | None = None

    @property
    def words(self) -> str:
        """The status and what it means: `refuted (the knob was innocent)`."""
        return describe(self.status)

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
            said = f"; the note of {note.time[:19]}Z had {verb} it: \"{fmt.short(note.text)}\""
        if revert.id in res.implicates:
            return RevertStatus(revert, "confirmed", f"the resolution of incident {incident.id} ({res.time[:19]}Z) "
                                f"implicates it: root cause \"{fmt.short(res.root_cause)}\"{said}", "resolution", incident, note)
        return RevertStatus(revert, "refuted", f"incident {incident.id} was resolved ({res.time[:19]}Z) with root cause "
                            f"\"{fmt.short(res.root_cause)}\", which does not implicate it{said}", "resolution", incident, note)
    for note in reversed(incident.notes):
        if note.refutes == revert.id:
            return RevertStatus(revert, "refuted", f"note of {note.time[:19]}Z on incident {incident.id}: "
                                f"\"{fmt.short(note.text)}\"", "note", incident, note)
        if note.confirms == revert.id:
            return RevertStatus(revert, "confirmed", f"note of {note.time[:19]}Z on incident {incident.id}: "
                                f"\"{fmt.short(note.text)}\"", "note", incident, note)
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


def reverts_by_incident(project: Project, incidents: list[Incident]) -> dict[str, list[RevertStatus]]:
    """incident id -> the status of every revert made for it, for the given incidents."""
    wanted = {i.id for i in incidents}
    out: dict[str, list[RevertStatus]] = {i.id: [] for i in incidents}
    if not incidents:
        return out
    for status in revert_statuses(project, incidents=incidents).values():
        if status.revert.incident in wanted:
            out[status.revert.incident].append(status)
    return out
