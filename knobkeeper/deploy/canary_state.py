"""The canary's marker: which candidate a running canary put on which services, so that a canary
that dies (SIGKILL, a reboot) does not leave its candidate running unseen.

    .git/knobkeeper/canary.json   {"knob", "value", "role", "inventory", "services", "hosts",
                                   "applied_at", "seen_at", "pid"}
    .git/knobkeeper/canary.lock   flocked by the canary for its whole run

The marker is written before the candidate deploy starts and removed once the canary hosts are
put back or the value is promoted. A marker whose lock nobody holds is an abandoned canary (the
lock dies with its process, whatever its PID is reused for): `status`, `plan`, `check` and the
next canary say so, and `knobkeeper canary --abort` deploys those services back to the declared
state and removes it. Only this module reads or writes the two files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from knobkeeper import fmt
from knobkeeper.changelog.store import atomic_write, lock_file, unlock_file
from knobkeeper.errors import UserError
from knobkeeper.project import Project


def marker_path(project: Project) -> Path:
    return project.private_dir / "canary.json"


def lock_path(project: Project) -> Path:
    return project.private_dir / "canary.lock"


def hold(project: Project):
    """The canary's lock (an open handle; unlock_file releases it), or UserError naming the running canary."""
    running = read_marker(project)
    what = f"canary {_what(running)} is running" if running else "another canary of this repo is running"
    return lock_file(lock_path(project), wait=False, busy=f"{what}; wait for it or stop it (Ctrl-C puts it back)")


def write_marker(project: Project, data: dict[str, Any]) -> None:
    atomic_write(marker_path(project), json.dumps(data) + "\n")


def clear_marker(project: Project) -> None:
    marker_path(project).unlink(missing_ok=True)


def read_marker(project: Project) -> dict[str, Any] | None:
    try:
        data = json.loads(marker_path(project).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _what(data: dict[str, Any]) -> str:
    services = ", ".join(data.get("services") or []) or "?"
    return f"{data.get('knob')}={fmt.value(data.get('value'))} on {services}"


def abandoned(project: Project) -> dict[str, Any] | None:
    """The marker of a canary whose process is gone (nobody holds its lock), else None."""
    data = read_marker(project)
    if data is None:
        return None
    try:
        handle = lock_file(lock_path(project), wait=False)
    except UserError:
        return None   # the canary is alive
    unlock_file(handle)
    return data


def abandoned_line(project: Project) -> str | None:
    """`canary X=V on <services> abandoned at <time>; put back with `knobkeeper canary --abort` ...`."""
    data = abandoned(project)
    if data is None:
        return None
    return (f"canary {_what(data)} abandoned at {data.get('seen_at') or data.get('applied_at')}; put back with "
            f"`knobkeeper canary --abort` (or a deploy of role {data.get('role')})")
