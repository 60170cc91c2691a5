"""The marker of a running `ab run` or `sweep`: which arm the experiment put on which role, so that
one that dies (SIGKILL, a reboot, a CI job killed) does not leave the stack on a candidate unseen.
The canary's marker (deploy/canary_state.py) is the model; this one is the experiments' own.

    .git/knobkeeper/experiment.json   an ExperimentMarker (below; `knobkeeper schema experiment-marker`)
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

import dataclasses
from dataclasses import field
from pathlib import Path
from typing import Any

from knobkeeper import fmt
from knobkeeper.declared import Declared, declared, extra_field, fact
from knobkeeper.evidence.model import Arm
from knobkeeper.fsio import LOOK_GRACE_S, lock_file, read_marker_file, unlock_file, write_json_object
from knobkeeper.errors import UserError
from knobkeeper.project import Project


@declared
class ExperimentMarker(Declared):
    """A running `ab run` or `sweep`: the arms it measures, the arm it last switched the role to, the
    step it is at, the process that owns it, and the journal of what it measured so far."""

    kind: str = fact(required=True, choices=("ab run", "sweep"))
    knob: str = fact(required=True)
    role: str = fact(required=True)
    scope: str | None = None            # the knobs.toml table of the role
    inventory: str | None = None
    arms: dict[str, Arm] = field(default_factory=dict)
    arm: str | None = None              # the arm the role was last switched to (None: the declared state)
    phase: str = fact("measuring", choices=("measuring", "put-back", "restored"))
    plan: str | None = None             # a sweep's plan id
    pid: int | None = None
    journal: dict[str, Any] = field(default_factory=dict)   # what `ab abort` needs to keep the runs measured
    started_at: str | None = None
    seen_at: str | None = None
    extra: dict[str, Any] = extra_field()


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


def write_marker(project: Project, marker: ExperimentMarker) -> None:
    write_json_object(marker_path(project), ExperimentMarker.of(marker).to_json(), allow_nan=False)


def update_marker(project: Project, **changes: Any) -> None:
    """The marker with `changes` made (nothing when there is none)."""
    marker = read_marker(project)
    if marker is not None:
        write_marker(project, dataclasses.replace(marker, **changes))


def clear_marker(project: Project) -> None:
    marker_path(project).unlink(missing_ok=True)


def read_marker(project: Project) -> ExperimentMarker | None:
    """The marker, or None when there is none; UserError naming the file when it is not a marker."""
    return read_marker_file(marker_path(project), ExperimentMarker, "an experiment marker",
                            "remove it if no ab run or sweep runs")


def _arm_words(data: ExperimentMarker, name: str | None) -> str:
    arm = data.arms.get(name or "")
    knobs = arm.knobs if arm is not None else {}
    values = ", ".join(f"{k}={fmt.value(v)}" for k, v in knobs.items()) or "?"
    return f"arm {name} ({values})"


def _what(data: ExperimentMarker) -> str:
    return f"{data.kind} of {data.knob} on {data.scope or data.role} ({data.inventory}, pid {data.pid})"


def abandoned(project: Project) -> ExperimentMarker | None:
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
    runs = len(data.journal.get("runs") or [])
    where = f"{data.role} on {_arm_words(data, data.arm)}" if data.arm else f"{data.role} possibly on an arm"
    return (f"{_what(data)} abandoned at {data.seen_at or data.started_at} with {where}; put the "
            f"stack back with `knobkeeper ab abort` (deploys role {data.role} to the declared state and keeps "
            f"the {runs} runs measured as evidence marked interrupted)")
