"""`knobkeeper status INVENTORY`: per host and service, declared vs running.

Running = the header of started.sh (the copy of the launch script taken when the service was last
started; it names the knob values and the digest the process was started with) + the process state
from the service manager. Declared = a fresh render of knobs.toml. Each service is:

    in sync   running, started from what is declared now
    drifted   running, but knobs (listed) or other rendered content differ: a deploy would restart it
    down      not running
    unknown   the host could not be inspected (it could not be reached: the reason is given)

Hosts are inspected where they are: @local on this machine, every other host over SSH with its
inventory data (pyinfra's connector: ssh_hostname, ssh_port, ssh_user, ssh_key, ...). The launch
script on the host is read too: a hand edit of it (what the service manager runs) shows as drift,
naming the knobs whose exported values differ from the declared ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from knobkeeper.deploy.observe import (HostShell, hand_edits, host_shell, knob_differences, parse_service_state,
                                       state_command)
from knobkeeper.deploy.render import render_stack
from knobkeeper.deploy.stack import HostPlan, Service, load_inventory, stack_from_inventory
from knobkeeper.project import Project

# Shared with the deploy's facts and `plan` (re-exported here for the callers that import them from status).
__all__ = ["state_command", "parse_service_state", "knob_differences", "stack_status", "ServiceStatus"]


@dataclass
class ServiceStatus:
    host: str
    service: str
    role: str
    state: str  # in sync | drifted | down | unknown
    pid: int | None
    manager_state: str
    declared_digest: str
    running_digest: str | None
    differences: list[str] = field(default_factory=list)
    started_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def observe(shell: HostShell, plan: HostPlan, svc: Service) -> dict[str, Any] | None:
    """The service manager's view, started.sh's header and the launch script on the host, or None
    when the host cannot be reached (shell.errors says why)."""
    ctl = plan.supervisor.ctl() if plan.supervisor else ""
    lines = shell.run(plan.name, state_command(svc.manager, ctl, svc.name, svc.started_path, svc.launch_path))
    return None if lines is None else parse_service_state(lines)


def _merge(diffs: list[str], edits: list[str] | None) -> list[str]:
    """Knob differences from started.sh, overridden per knob by those read from the host's launch script."""
    by_name = {d.split(":", 1)[0]: d for d in diffs}
    for line in edits or []:
        by_name[line.split(":", 1)[0] if ": running " in line else line] = line
    return [by_name[k] for k in sorted(by_name)]


def stack_status(project: Project, inventory_path: str, data: Mapping[str, Any] | None = None) -> list[ServiceStatus]:
    inventory = load_inventory(project.root, inventory_path, data)
    stack = stack_from_inventory(inventory, Path(inventory_path).stem)
    rendered = render_stack(project, stack)
    out: list[ServiceStatus] = []
    with host_shell(inventory) as shell:
        for svc in sorted(stack.services, key=lambda s: (stack.order.index(s.role), s.host, s.name)):
            plan = stack.hosts[svc.host]
            want = rendered[(svc.host, svc.name)]
            seen = observe(shell, plan, svc)
            if seen is None:
                out.append(ServiceStatus(svc.host, svc.name, svc.role, "unknown", None, "unreachable",
                                         want.digest, None, [shell.errors.get(svc.host, "could not connect")]))
                continue
            started = seen["started"] or {}
            running_digest = started.get("digest")
            diffs: list[str] = []
            if not seen["running"]:
                state = "down"
            else:
                diffs = knob_differences(want.knobs, started.get("knobs") or {})
                edits = hand_edits(want.launch, seen["launch"])
                if edits and (any(": running " in e for e in edits) or running_digest == want.digest):
                    diffs = _merge(diffs, edits)
                if running_digest != want.digest and not diffs:
                    diffs = ["engine command or service files differ (knobs are the same)" if running_digest
                             else "started outside knobkeeper (no started.sh)"]
                state = "drifted" if diffs else "in sync"
            out.append(ServiceStatus(
                host=svc.host, service=svc.name, role=svc.role, state=state, pid=seen["pid"],
                manager_state=seen["state"], declared_digest=want.digest, running_digest=running_digest,
                differences=diffs, started_from=started.get("source"),
            ))
    return out
