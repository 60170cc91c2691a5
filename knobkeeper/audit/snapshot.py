"""`incident snapshot`: the stack's gauges now, recorded in an incident (a note and the full JSON, one
commit). The observation that refutes a suspect knob: "engines idle while the client hung".

The gauges come from knobkeeper.evidence.metrics (`snapshot`, `snapshot_summary`: every engine's and
router's own metrics); the note goes through knobkeeper.changelog.incidents like any other.
"""

from __future__ import annotations

from knobkeeper.deploy.options import DEFAULT_INVENTORY
from knobkeeper.errors import UserError
from knobkeeper.project import Project


def snapshot_incident(project: Project, ident: str, inventory: str = DEFAULT_INVENTORY, window: float = 5.0):
    """Scrape every service of `inventory` twice `window` s apart and add the result to incident
    `ident`; returns the incident change (its commit, the note)."""
    from knobkeeper.changelog.incidents import add_snapshot, find_incident
    from knobkeeper.deploy.stack import running_stack
    from knobkeeper.evidence.metrics import snapshot, snapshot_summary

    find_incident(project, ident)  # a bad id fails before the window is waited out
    if window <= 0:
        raise UserError(f"--window {window:g}: expected a positive number of seconds")
    snap = snapshot(running_stack(project.root, inventory), window)  # a Slurm job: where it placed each one
    return add_snapshot(project, ident, snapshot_summary(snap), {"inventory": inventory, **snap})
