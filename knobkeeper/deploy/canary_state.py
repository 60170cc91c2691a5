"""The canary's marker: which candidate a running canary put on which services, so that a canary
that dies (SIGKILL, a reboot) does not leave its candidate running unseen.

    .git/knobkeeper/canary.json   a CanaryMarker (below; `knobkeeper schema canary-marker`)
    .git/knobkeeper/canary.lock   flocked by the canary for its whole run

The marker is written when the canary starts (phase "calibrating", no `applied_at`: it owns its
role from its first window), stamped `applied_at` before the candidate deploy starts, and removed
once the canary hosts are put back or the value is promoted. Its `phase` says which deploy was in
flight (PHASES): "candidate-deploy" (started, not yet through), "candidate" (applied, the canary
measuring), "put-back" (the deploy back to the declared state started), "promote" (the value was
`set`, the whole role's deploy started). A marker whose lock nobody holds is an
abandoned canary (the lock dies with its process, whatever its PID is reused for): `status`, `plan`,
`check` and the next canary say so, and `knobkeeper canary abort` deploys those services back to
the declared state and removes it; one that never got to `applied_at` left nothing on and is removed
by the first reader that finds it. Only this module reads or writes the two files.

While a canary runs (marker present, lock held by another process) it owns its role:
`refuse_change` (set, unset, revert, restore) and `refuse_deploy` (a deploy whose scope holds the
role) raise one line naming it. The canary's own process (its promote's `set`) and its own deploys
(a child of that process) pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from pathlib import Path
from typing import Any

from knobkeeper import fmt
from knobkeeper.declared import Declared, declared, extra_field, fact
from knobkeeper.fsio import LOOK_GRACE_S, lock_file, read_marker_file, unlock_file, write_json_object
from knobkeeper.errors import UserError
from knobkeeper.project import Project


def marker_path(project: Project) -> Path:
    return project.private_dir / "canary.json"


def lock_path(project: Project) -> Path:
    return project.private_dir / "canary.lock"


# The marker's phases, as the lines below say them. A canary killed during "candidate-deploy" or
# "put-back" left some of its services on the candidate and some not (a deploy goes host by host);
# during "promote" the declared state already is the candidate, so its `canary abort` deploys the whole role.
PHASES = {"calibrating": "calibrating", "candidate-deploy": "during its candidate deploy",
          "candidate": "on its candidate", "put-back": "during its put-back", "promote": "during its promote"}




@declared
class CanaryMarker(Declared):
    """A running canary: the candidate value of its knob, the services it put (or is putting) it
    on, the deploy in flight (`phase`), and the process that owns it."""

    knob: str = fact(required=True)
    value: Any = fact(required=True)
    role: str = fact(required=True)
    inventory: str = fact(required=True)
    scope: str | None = None            # the knobs.toml table of the role (stack.role where a repo holds stacks)
    services: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    phase: str | None = fact(None, choices=tuple(PHASES))   # None: a marker of an earlier version (read by applied_at)
    started_at: str | None = None
    applied_at: str | None = None       # the candidate deploy started: something of it may be on
    seen_at: str | None = None          # the canary was last alive (each window stamps it)
    pid: int | None = None
    OMIT = frozenset({"scope", "phase", "started_at", "applied_at"})
    extra: dict[str, Any] = extra_field()


def phase_words(data: CanaryMarker) -> str:
    """The marker's phase as words ("during its put-back"); an older marker without one: by applied_at."""
    phase = data.phase
    if phase not in PHASES:
        phase = "candidate" if data.applied_at else "calibrating"
    return PHASES[phase]


# Roots whose canary lock this process holds: its own `set` (the promote) is not refused.
_held_here: set[Path] = set()


def hold(project: Project):
    """The canary's lock (an open handle; `release` gives it back), or UserError naming the running canary."""
    running = read_marker(project)
    what = f"canary {_what(running)} is running" if running else "another canary of this repo is running"
    # `abandoned` and `running` take the lock for an instant to look: a canary starting then waits it out
    handle = lock_file(lock_path(project), wait=LOOK_GRACE_S,
                       busy=f"{what}; wait for it or stop it (Ctrl-C puts it back)")
    _held_here.add(project.root)
    return handle


def release(project: Project, handle) -> None:
    _held_here.discard(project.root)
    unlock_file(handle)


def write_marker(project: Project, marker: CanaryMarker) -> None:
    write_json_object(marker_path(project), CanaryMarker.of(marker).to_json())


def update_marker(project: Project, **changes: Any) -> CanaryMarker | None:
    """The marker with `changes` made (None, and nothing written, when there is none)."""
    marker = read_marker(project)
    if marker is not None:
        marker = dataclasses.replace(marker, **changes)
        write_marker(project, marker)
    return marker


def clear_marker(project: Project) -> None:
    marker_path(project).unlink(missing_ok=True)


def read_marker(project: Project) -> CanaryMarker | None:
    """The marker, or None when there is none; UserError naming the file when it is not a marker."""
    return read_marker_file(marker_path(project), CanaryMarker, "a canary marker", "remove it if no canary runs")


def _what(data: CanaryMarker) -> str:
    return f"{data.knob}={fmt.value(data.value)} on {', '.join(data.services) or '?'}"


def abandoned(project: Project) -> CanaryMarker | None:
    """The marker of a canary whose process is gone (nobody holds its lock), else None."""
    data = read_marker(project)
    if data is None:
        return None
    try:
        handle = lock_file(lock_path(project), wait=False)
    except UserError:
        return None   # the canary is alive
    try:
        if not data.applied_at:   # died before its candidate deploy: nothing of it is on
            clear_marker(project)
            return None
    finally:
        unlock_file(handle)
    return data


def running(project: Project) -> CanaryMarker | None:
    """The marker of a canary running in another process (its lock held), else None."""
    if project.root in _held_here:
        return None
    data = read_marker(project)
    if data is None:
        return None
    try:
        handle = lock_file(lock_path(project), wait=False)
    except UserError:
        return data
    unlock_file(handle)
    return None


def _owner_line(data: CanaryMarker) -> str:
    phase = phase_words(data)
    return (f"canary {_what(data)} holds role {data.scope or data.role} ({phase}, pid {data.pid}, "
            f"since {data.started_at or data.applied_at}); wait for it or stop it (Ctrl-C puts it back)")


def refuse_change(project: Project, scope: str, verb: str) -> None:
    """UserError when a running canary owns `scope` (a role, or stack.role): `verb` of a knob there
    would change the baseline under its measurement and the value its promote compares with."""
    data = running(project)
    if data is None:
        return
    owned = str(data.scope or data.role or "")
    if scope == owned or scope.rpartition(".")[2] == owned or owned.rpartition(".")[2] == scope:
        raise UserError(f"{verb} on {scope}: {_owner_line(data)}")


def refuse_deploy(project: Project, inventory: str, roles: list[str], parent: int | None = None) -> None:
    """UserError when a running canary owns a role among `roles` of `inventory` (a deploy's scope);
    `parent`: the pid that started this deploy (pyinfra's parent): the canary's own deploys pass."""
    data = running(project)
    if data is None or (parent is not None and parent == data.pid):
        return
    same = (project.root / inventory).resolve() == (project.root / data.inventory).resolve()
    if same and data.role in roles:
        raise UserError(f"deploy of {inventory} (roles {', '.join(roles)}): {_owner_line(data)}")


def abandoned_line(project: Project) -> str | None:
    """`canary X=V on <services> abandoned at <time> <phase>; put back with `knobkeeper canary abort` ...`."""
    data = abandoned(project)
    if data is None:
        return None
    if data.phase == "promote":
        return (f"canary {_what(data)} abandoned at {data.seen_at or data.applied_at} during its "
                f"promote ({data.knob} is set; the rest of role {data.role} may not run it yet); finish "
                f"with `knobkeeper canary abort` (or a deploy of role {data.role})")
    return (f"canary {_what(data)} abandoned at {data.seen_at or data.applied_at} {phase_words(data)}; "
            f"put back with `knobkeeper canary abort` (or a deploy of role {data.role})")
