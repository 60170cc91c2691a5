"""`incident snapshot`: the stack's gauges now, recorded in an incident (a note and the full JSON, one
commit). The observation that refutes a suspect knob: "engines idle while the client hung".

The gauges come from knobkeeper.evidence.metrics (`snapshot`, `snapshot_summary`: every engine's and
router's own metrics); the note goes through knobkeeper.changelog.incidents like any other.

Which stack: the inventory given, else the one the incident's last snapshot read, else the one the
last deploy record of this repo names (knobkeeper.deploy.record); with none of them the command is
refused. A snapshot in which nothing answers, of an inventory this repo never deployed, is refused
too: its "unreachable" lines would say nothing about the incident (a stack that was deployed and is
down now is recorded: that IS the observation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knobkeeper.changelog.incidents import add_snapshot, find_incident, snapshot_inventory
from knobkeeper.deploy import stack as deploy_stack
from knobkeeper.deploy.record import load_records
from knobkeeper.errors import UserError
from knobkeeper.evidence import metrics
from knobkeeper.evidence.metrics import snapshot_summary
from knobkeeper.project import Project


def snapshot_incident(project: Project, ident: str, inventory: str | None = None, window: float = 5.0):
    """Scrape every service of the incident's stack (`inventory`, or see the module docstring) twice
    `window` s apart and add the result to incident `ident`; returns the incident change (its commit,
    the note)."""
    incident = find_incident(project, ident)  # a bad id fails before the window is waited out
    if window <= 0:
        raise UserError(f"--window {window:g}: expected a positive number of seconds")
    if inventory is None:
        inventory = snapshot_inventory(project, incident) or next(reversed(_deployed_inventories(project)), None)
    if inventory is None:
        raise UserError(f"incident snapshot {incident.id}: no stack to read: the incident has no snapshot yet and "
                        f"{project.rel(project.deploys_dir)}/ no deploy record; give --inventory PATH of the "
                        f"deployed stack the incident is about")
    # Scraped first, the deploy records read after: the gauges are of the moment the command was run.
    snap = metrics.snapshot(deploy_stack.running_stack(project.root, inventory), window)  # a Slurm job: where it placed each one
    if not any(_answered(row) for row in snap["services"]):
        deployed = _deployed_inventories(project)
        if _repo_path(project, inventory) not in deployed:
            last = f" (the last deploy was of {deployed[-1]})" if deployed else ""
            raise UserError(f"--inventory {inventory}: nothing answered, and this repo has no deploy record of "
                            f"it{last}: not recorded; give --inventory PATH of the stack the incident is about")
    return add_snapshot(project, incident.id, snapshot_summary(snap), {"inventory": inventory, **snap})


def _answered(row: dict[str, Any]) -> bool:
    """A service whose metrics (or, for a router without a metrics port, /workers) answered."""
    workers = row.get("workers")
    return not row.get("error") and not (isinstance(workers, dict) and set(workers) == {"error"})


def _repo_path(project: Project, inventory: str) -> str:
    """An inventory as the repo names it (inventory/x.py), however it was spelled (./, absolute)."""
    path = Path(inventory)
    path = (path if path.is_absolute() else project.root / path).resolve()
    try:
        return path.relative_to(project.root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _deployed_inventories(project: Project) -> list[str]:
    """The inventories this repo's committed deploy records name, in the order of their last deploy."""
    seen = [_repo_path(project, r.inventory_path) for r in load_records(project) if r.inventory_path]
    return list(dict.fromkeys(reversed(seen)))[::-1]
