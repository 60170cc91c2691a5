"""The marker of a running `ab run` or `sweep`: which arm the experiment put on which role, so that
one that dies (SIGKILL, a reboot, a CI job killed) does not leave the stack on a candidate unseen.
The canary's marker (deploy/canary_state.py) is the model; this one is the experiments' own.

    .git/knobkeeper/experiment.json   {"kind": "ab run" | "sweep", "knob", "role", "scope", "inventory",
                                       "arms": {name: {"label", "knobs"}}, "arm": the arm last switched
                                       to, "phase", "plan" (a sweep's plan id), "pid", "started_at",
                                       "seen_at", "journal": what `ab abort` needs to keep the runs
                                       measured so far as interrupted evidence}
    .git/knobkeeper/experiment.lock   flocked by the experiment for its whole run

The marker is written before the first switch and rewritten after every block (the journal of its
runs); it is removed once the declared state is back (the experiment's restore, on success, an
error, Ctrl-C or SIGTERM). A marker whose lock nobody holds is an abandoned experiment (the lock dies
with its process, whatever its PID is reused for): `check`, `deploy`, `status`, `plan`, `set`,
`ab run` and `sweep` say so, and `knobkeeper ab abort` deploys the role back to the declared state,
writes the runs of the journal as evidence marked "interrupted" and removes the marker. Only this
module reads or writes the two files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knobkeeper import fmt
from knobkeeper.fsio import LOOK_GRACE_S, lock_file, read_json_object, unlock_file, write_json_object
from knobkeeper.errors import UserError
from knobkeeper.project import Project


def marker_path(project: Project) -> Path:
    return project.private_dir / "experiment.json"


def lock_path(project: Project) -> Path:
    return project.private_dir / "experiment.lock"


def hold(project: Project):
    """The experiments' lock (an open handle; `release` gives it back), or UserError naming the one running."""
    running = read_marker(project)
    what = f"{_what(running)} is running" if running else "another ab run or sweep of this repo is running"
    return lock_file(lock_path(project), wait=LOOK_GRACE_S,
                     busy=f"{what}; wait for it or stop it (Ctrl-C puts the stack back)")


def release(project: Project, handle) -> None:
    unlock_file(handle)


def write_marker(project: Project, data: dict[str, Any]) -> None:
    write_json_object(marker_path(project), data, allow_nan=False)


def update_marker(project: Project, **fields: Any) -> None:
    """The marker with `fields` replaced (nothing when there is none)."""
    data = read_marker(project)
    if data is not None:
        write_marker(project, {**data, **fields})


def clear_marker(project: Project) -> None:
    marker_path(project).unlink(missing_ok=True)


def read_marker(project: Project) -> dict[str, Any] | None:
    return read_json_object(marker_path(project))


def _arm_words(data: dict[str, Any], name: str | None) -> str:
    arm = (data.get("arms") or {}).get(name or "") or {}
    knobs = arm.get("knobs") or {}
    values = ", ".join(f"{k}={fmt.value(v)}" for k, v in knobs.items()) or "?"
    return f"arm {name} ({values})"


def _what(data: dict[str, Any]) -> str:
    return (f"{data.get('kind', 'ab run')} of {data.get('knob')} on {data.get('scope') or data.get('role')} "
            f"({data.get('inventory')}, pid {data.get('pid')})")


def abandoned(project: Project) -> dict[str, Any] | None:
    """The marker of an experiment whose process is gone (nobody holds its lock), else None."""
    data = read_marker(project)
    if data is None:
        return None
    try:
        handle = lock_file(lock_path(project), wait=False)
    except UserError:
        return None   # it is alive
    unlock_file(handle)
    return data


def abandoned_line(project: Project) -> str | None:
    """`sweep of K on decode (inventory, pid P) abandoned at T with decode on arm C (K=512); put the
    stack back with `knobkeeper ab abort` ...`, or None."""
    data = abandoned(project)
    if data is None:
        return None
    runs = len((data.get("journal") or {}).get("runs") or [])
    where = (f"{data.get('role')} on {_arm_words(data, data.get('arm'))}" if data.get("arm")
             else f"{data.get('role')} possibly on an arm")
    return (f"{_what(data)} abandoned at {data.get('seen_at') or data.get('started_at')} with {where}; put the "
            f"stack back with `knobkeeper ab abort` (deploys role {data.get('role')} to the declared state and keeps "
            f"the {runs} runs measured as evidence marked interrupted)")
