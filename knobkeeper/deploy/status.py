"""`knobkeeper status INVENTORY`: per host and service, declared vs running.

Running = the header of started.sh (the copy of the launch script taken when the service was last
started; it names the knob values and the digest the process was started with) + the process state
from the service manager. Declared = a fresh render of knobs.toml. Each service is:

    in sync   running, started from what is declared now
    drifted   running, but knobs (listed) or other rendered content differ: a deploy would restart it
    down      not running
    unknown   the host could not be inspected (only @local is inspected in this version)
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from knobkeeper.deploy.render import META_PREFIX, render_stack
from knobkeeper.deploy.stack import HostPlan, Service, load_stack
from knobkeeper.project import Project

STARTED_MARKER = "--knobkeeper-started--"


def state_command(manager: str, ctl: str, program: str, started_path: str) -> str:
    """Shell that prints the service manager's view of `program` and then started.sh's meta line."""
    if manager == "supervisord":
        status = f"{ctl} status {shlex.quote(program)} 2>&1 || true"
    else:
        status = f"systemctl show -p ActiveState -p MainPID {shlex.quote(program)}.service 2>&1 || true"
    grep = f"grep -m1 '^{META_PREFIX}' {shlex.quote(started_path)} 2>/dev/null || true"
    return f"{status}; echo '{STARTED_MARKER}'; {grep}"


def parse_service_state(output: list[str]) -> dict[str, Any]:
    """{"running", "pid", "state", "started"} from state_command's output lines."""
    state, pid, started = "UNKNOWN", None, None
    after_marker = False
    for line in output:
        if line.strip() == STARTED_MARKER:
            after_marker = True
            continue
        if after_marker:
            if line.startswith(META_PREFIX):
                try:
                    started = json.loads(line[len(META_PREFIX):])
                except ValueError:
                    started = None
            continue
        if line.startswith("ActiveState="):
            state = line.split("=", 1)[1].strip().upper()
        elif line.startswith("MainPID="):
            value = line.split("=", 1)[1].strip()
            pid = int(value) if value.isdigit() and value != "0" else None
        elif "no such process" in line:
            state = "ABSENT"
        elif "no such file" in line.lower() or "refused" in line.lower():
            state = "NO-SUPERVISORD"
        else:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isupper():
                state = parts[1]
                match = re.search(r"pid (\d+)", line)
                pid = int(match.group(1)) if match else None
    running = state in ("RUNNING", "STARTING", "ACTIVE", "ACTIVATING", "RELOADING")
    return {"running": running, "pid": pid if running else None, "state": state, "started": started}


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


def _run_local(command: str) -> list[str]:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return (done.stdout + done.stderr).splitlines()


def observe(plan: HostPlan, svc: Service) -> dict[str, Any] | None:
    """The service manager's view and started.sh's header, or None when the host is not inspectable."""
    if plan.name not in ("@local", "localhost"):
        return None
    ctl = plan.supervisor.ctl() if plan.supervisor else ""
    return parse_service_state(_run_local(state_command(svc.manager, ctl, svc.name, svc.started_path)))


def knob_differences(declared: Mapping[str, str], running: Mapping[str, str]) -> list[str]:
    out = []
    for name in sorted(set(declared) | set(running)):
        d, r = declared.get(name), running.get(name)
        if d != r:
            out.append(f"{name}: running {_show(r)}, declared {_show(d)}")
    return out


def _show(value: str | None) -> str:
    return "(unset)" if value is None else json.dumps(value) if any(c in value for c in " \n\"'$") else value


def stack_status(project: Project, inventory_path: str, data: Mapping[str, Any] | None = None) -> list[ServiceStatus]:
    stack = load_stack(project.root, inventory_path, data)
    rendered = render_stack(project, stack)
    out: list[ServiceStatus] = []
    for svc in sorted(stack.services, key=lambda s: (stack.order.index(s.role), s.host, s.name)):
        plan = stack.hosts[svc.host]
        want = rendered[(svc.host, svc.name)]
        seen = observe(plan, svc)
        if seen is None:
            out.append(ServiceStatus(svc.host, svc.name, svc.role, "unknown", None, "not inspected",
                                     want.digest, None, ["only @local hosts are inspected in this version"]))
            continue
        started = seen["started"] or {}
        running_digest = started.get("digest")
        diffs: list[str] = []
        if not seen["running"]:
            state = "down"
        else:
            diffs = knob_differences(want.knobs, started.get("knobs") or {})
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
