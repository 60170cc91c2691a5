"""Read-side views of the changelog that commands print: declared knobs with provenance, the log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from knobkeeper.changelog.entries import Entry, latest_by_knob, load_entries
from knobkeeper.changelog.store import settle
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import Catalog, Value, load_catalog
from knobkeeper.knobs.state import read_declared
from knobkeeper.knobs.values import role_of
from knobkeeper.project import Project


@dataclass
class DeclaredKnob:
    role: str  # the scope: "decode", or "vllm.decode" for a named stack
    knob: str
    value: Value
    shown: str
    entry: Entry | None  # None: knobs.toml holds it but no entry explains it (run `record`)

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role, "knob": self.knob, "value": self.shown if self.shown != str(self.value) else self.value,
            "entry": self.entry.id if self.entry else None, "action": self.entry.action if self.entry else None,
            "time": self.entry.time if self.entry else None, "author": self.entry.author if self.entry else None,
        }


def declared_knobs(project: Project, role: str | None = None) -> list[DeclaredKnob]:
    settle(project)  # a crashed change's knobs.toml is rolled back before it is read
    catalog = load_catalog(project.catalog_path)
    declared = read_declared(project.knobs_path, catalog)
    if role is not None and role not in declared and role_of(role) not in catalog.roles():
        raise UserError(f"--role {role!r}: no such role (roles: {', '.join(sorted(set(declared) | set(catalog.roles())))})")
    latest = latest_by_knob(load_entries(project))
    rows = []
    for r, table in declared.items():
        if role is not None and r != role:
            continue
        for name, value in table.items():
            entry = latest.get((r, name))
            if entry is not None and entry.new != value:
                entry = None
            rows.append(DeclaredKnob(r, name, value, catalog.get(name).display(value), entry))
    return rows


def filter_log(project: Project, knob: str | None = None, role: str | None = None,
               since: datetime | None = None, catalog: Catalog | None = None) -> list[Entry]:
    """Entries newest first, filtered."""
    if knob is not None:
        (catalog or load_catalog(project.catalog_path)).get(knob)
    rows = []
    for entry in reversed(load_entries(project)):
        if knob is not None and entry.knob != knob:
            continue
        if role is not None and entry.scope != role:
            continue
        if since is not None and entry.moment < since:
            continue
        rows.append(entry)
    return rows
