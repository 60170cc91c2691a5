"""Deploy records (changelog/deploys/<stamp>-<id>.json): one per deploy run, committed on its own.

A record says what a run did to every (host, service) and when, so that a restart can serve as a
reference point for later incidents:

    {"id", "inventory", "inventory_path", "commit", "dirty", "allow_dirty", "options",
     "order", "started_at", "finished_at", "result": "ok" | "failed", "error",
     "services": [{"host", "service", "role", "action": "restarted" | "started" | "unchanged",
                   "reason", "digest", "previous_digest", "knobs", "restart_issued_at",
                   "healthy_at", "pid", "gate": {"result": "passed" | "failed" | "skipped" | "not-run",
                   "url", "status", "seconds", "checked_at"}}]}

record=false keeps the record out of git: it is written under .knobkeeper-state/deploys/ instead,
so a caller (the A/B harness) still gets its timings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobkeeper.changelog.store import Message, atomic_write, commit_change
from knobkeeper.project import Project
from knobkeeper.timeutil import file_stem, parse_time

ACTIONS = ("restarted", "started", "unchanged")
GATES = ("passed", "failed", "skipped", "not-run")


@dataclass
class DeployRecord:
    id: str
    inventory: str
    inventory_path: str
    commit: str
    dirty: bool
    allow_dirty: bool
    options: dict[str, Any]
    order: list[str]
    started_at: str
    finished_at: str | None = None
    result: str = "running"
    error: str | None = None
    services: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stem(self) -> str:
        return file_stem(parse_time(self.started_at), self.id)

    def service(self, host: str, name: str) -> dict[str, Any]:
        for row in self.services:
            if row["host"] == host and row["service"] == name:
                return row
        raise KeyError((host, name))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "inventory": self.inventory, "inventory_path": self.inventory_path,
            "commit": self.commit, "dirty": self.dirty, "allow_dirty": self.allow_dirty,
            "options": self.options, "order": self.order, "started_at": self.started_at,
            "finished_at": self.finished_at, "result": self.result, "error": self.error,
            "services": self.services,
        }

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DeployRecord":
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__ if k in data})


def record_path(project: Project, record: DeployRecord, committed: bool) -> Path:
    folder = project.deploys_dir if committed else project.state_dir / "deploys"
    return folder / f"{record.stem}.json"


def message(record: DeployRecord) -> Message:
    acted = [f"{r['host']}/{r['service']}" for r in record.services if r["action"] != "unchanged"]
    what = ", ".join(acted) if acted else "nothing restarted"
    summary = f"deploy {record.inventory}: {what} ({record.result})"
    body = f"Deploy {record.id} of {record.inventory_path} at {record.commit}"
    if record.dirty:
        body += " with uncommitted changes (allow_dirty=true)"
    if record.error:
        body += f"\n\n{record.error}"
    trailers = [("Deploy", record.id), ("Inventory", record.inventory), ("Result", record.result)]
    trailers += [("Restarted" if r["action"] == "restarted" else "Started", f"{r['host']}/{r['service']}")
                 for r in record.services if r["action"] != "unchanged"]
    return Message(summary=summary, body=body, trailers=trailers)


def save(project: Project, record: DeployRecord, commit: bool) -> Path:
    """Commit the record (one commit holding just this file), or write it to the state dir."""
    path = record_path(project, record, committed=commit)
    if commit:
        commit_change(project, {path: record.text()}, message(record))
    else:
        atomic_write(path, record.text())
    return path


def find_record(project: Project, deploy_id: str) -> DeployRecord | None:
    for folder in (project.deploys_dir, project.state_dir / "deploys"):
        for path in sorted(folder.glob(f"*-{deploy_id}.json")) if folder.is_dir() else []:
            return DeployRecord.from_json(json.loads(path.read_text()))
    return None


def load_records(project: Project) -> list[DeployRecord]:
    """Committed records, oldest first."""
    folder = project.deploys_dir
    if not folder.is_dir():
        return []
    return [DeployRecord.from_json(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]
