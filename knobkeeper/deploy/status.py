"""`knobkeeper status INVENTORY`: per host and service, declared vs running.

Running = the header of started.sh (the copy of the launch script taken when the service was last
started; it names the knob values and the digest the process was started with) + the process state
from the service manager. Declared = a fresh render of knobs.toml. Each service is:

    in sync   running, started from what is declared now
    drifted   running, but knobs (listed) or other rendered content differ: a deploy would restart it;
              or the stored secret is not the declared one; or the installed engine version is not
              the pinned one; or it never passed a gate (its last gate failed and it was started since
              by hand or by its manager)
    down      not running (a deploy that stopped it after its gate failed is named, with the gate's status)
    unknown   the host could not be inspected (it could not be reached: the reason is given)

Hosts are inspected where they are: @local on this machine, every other host over SSH with its
inventory data (pyinfra's connector: ssh_hostname, ssh_port, ssh_user, ssh_key, ...). The launch
script on the host is read too: a hand edit of it (what the service manager runs) shows as drift,
naming the knobs whose exported values differ from the declared ones.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from knobkeeper import fmt
from knobkeeper.deploy.engines import (engine_requirements, engine_venv, managed_drift, parse_versions,
                                      pinned_versions, version_drift, versions_command)
from knobkeeper.deploy.model import HostPlan, Service
from knobkeeper.deploy.observe import (HostShell, failed_gate_words, hand_edits, host_shell, knob_differences,
                                       manager_status_command, parse_manager_status, parse_service_state,
                                       state_command)
from knobkeeper.deploy.plan import change_reasons
from knobkeeper.changelog.secrets import secret_mismatch
from knobkeeper.deploy.render import render_stack
from knobkeeper.deploy.stack import load_inventory, stack_from_inventory
from knobkeeper.deploy.target import target_of
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.state import read_declared
from knobkeeper.project import Project

# Two looks at each running service's PID, this far apart: a PID that changed is a restart loop.
LOOP_CHECK_S = 1.0


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
    job: str | None = None  # Slurm: the serving job, the node and URL of this component (else None)
    node: str | None = None
    url: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def detail(self) -> str:
        where = f"job {self.job} on {self.node} at {self.url}" if self.job and self.node else ""
        text = "; ".join(self.differences) if self.differences else (
            self.manager_state.lower() if self.state == "down" else "")
        return f"{where}: {text}" if where and text else where or text


def observe(shell: HostShell, plan: HostPlan, svc: Service) -> dict[str, Any] | None:
    """The service manager's view, the started files and the launch script on the host, or None
    when the host cannot be reached (shell.errors says why)."""
    lines = shell.run(plan.name, state_command(svc, plan.ctl, with_launch=True))
    return None if lines is None else parse_service_state(lines)


def _merge(diffs: list[str], edits: list[str] | None) -> list[str]:
    """Knob differences from started.sh, overridden per knob by those read from the host's launch script."""
    by_name = {d.split(":", 1)[0]: d for d in diffs}
    for line in edits or []:
        by_name[line.split(":", 1)[0] if ": running " in line else line] = line
    return [by_name[k] for k in sorted(by_name)]


def secret_problems(project: Project, stack: Any) -> dict[str, list[str]]:
    """{role: [one line per declared secret whose stored value is missing or is not the declared one]}."""
    catalog = load_catalog(project.catalog_path)
    declared = read_declared(project.knobs_path, catalog)
    out: dict[str, list[str]] = {}
    for role in stack.order:
        key = stack.scope(role)
        for name, value in sorted(declared.get(key, {}).items()):
            problem = secret_mismatch(project, key, name, value) if catalog.get(name).secret else None
            if problem:
                out.setdefault(role, []).append(problem)
    return out


def knob_drift(declared: Mapping[str, str], started: Mapping[str, str]) -> list[str]:
    """How the knobs a service was started with differ from those a deploy would start it with now
    (`declared_knobs_now`: knobs.toml's values for its role and stack, and the inventory's
    knob_defaults), one line per knob; [] when none does. What `status` calls drifted knobs, and
    what the report calls "declared knobs changed since" a deploy."""
    return knob_differences(declared, started)


def declared_knobs_now(project: Project, inventory_path: str,
                       data: Mapping[str, Any] | None = None) -> dict[tuple[str, str], dict[str, str]]:
    """{(host, service): the knob values a deploy of the inventory would start it with now}, from the
    render `status` compares the running services with."""
    inventory = load_inventory(project.root, inventory_path, data)
    stack = stack_from_inventory(inventory, Path(inventory_path).stem)
    return {key: dict(svc.knobs) for key, svc in render_stack(project, stack).items()}


def stack_status(project: Project, inventory_path: str, data: Mapping[str, Any] | None = None) -> list[ServiceStatus]:
    inventory = load_inventory(project.root, inventory_path, data)
    stack = stack_from_inventory(inventory, Path(inventory_path).stem)
    rendered = render_stack(project, stack)
    secrets = secret_problems(project, stack)
    with host_shell(inventory) as shell:
        return target_of(stack).status(shell, rendered, secrets)


def hosts_status(shell: HostShell, stack: Any, rendered: Mapping[tuple[str, str], Any],
                 secrets: Mapping[str, list[str]]) -> list[ServiceStatus]:
    """The hosts target's status (deploy/hosts.py): each service's manager state, started.sh and files
    on its host, against the fresh render."""
    out: list[ServiceStatus] = []
    services = sorted(stack.services, key=lambda s: (stack.order.index(s.role), s.host, s.name))
    seen = {svc.key: observe(shell, stack.hosts[svc.host], svc) for svc in services}
    _mark_restart_loops(shell, stack, services, seen)
    engines = {name: engine_drift(shell, plan) for name, plan in stack.hosts.items() if name not in shell.errors}
    for svc in services:
        want = rendered[(svc.host, svc.name)]
        look = seen[svc.key]
        if look is None:
            out.append(ServiceStatus(svc.host, svc.name, svc.role, "unknown", None, "unreachable",
                                     want.digest, None, [shell.errors.get(svc.host, "could not connect")]))
            continue
        started = look["started"] or {}
        running_digest = started.get("digest")
        diffs: list[str] = []
        failed = look.get("failed_gate")
        if not look["running"]:
            state = "down"
            if failed:
                diffs = [f"{str(look['state']).lower()}: {failed_gate_words(failed)}"]
        else:
            diffs = knob_drift(want.knobs, started.get("knobs") or {})
            edits = hand_edits(want.launch, look["launch"])
            if edits and (any(": running " in e for e in edits) or running_digest == want.digest):
                diffs = _merge(diffs, edits)
            if running_digest != want.digest and not diffs:
                diffs = _file_changes(svc, want, look) if running_digest else ["started outside knobkeeper (no started.sh)"]
            if failed:
                diffs.append(f"running without a passed gate ({failed_gate_words(failed)}): a deploy restarts it")
            state = "drifted" if diffs else "in sync"
        problems = secrets.get(svc.role, []) + engines.get(svc.host, [])
        if problems:
            diffs = diffs + problems
            state = "drifted" if state == "in sync" else state
        out.append(ServiceStatus(
            host=svc.host, service=svc.name, role=svc.role, state=state, pid=look["pid"],
            manager_state=look["state"], declared_digest=want.digest, running_digest=running_digest,
            differences=diffs, started_from=started.get("source"),
        ))
    return out


def engine_drift(shell: HostShell, plan: HostPlan) -> list[str]:
    """The host's pinned engine packages whose installed version is another (one line each)."""
    managed = managed_drift(plan, lambda command: shell.run(plan.name, command))
    if managed is not None:
        return managed
    venv = engine_venv(plan)
    pinned = pinned_versions(engine_requirements(plan)) if venv else {}
    if not pinned:
        return []
    lines = shell.run(plan.name, versions_command(venv, pinned))
    return [] if lines is None else version_drift(pinned, parse_versions(lines, pinned))


def _file_changes(svc: Service, want: Any, look: Mapping[str, Any]) -> list[str]:
    """What a deploy would change for a running service whose knobs are as declared."""
    old = {svc.launch_path: look["started_text"]}
    if look["started_manager"] is not None:
        old[svc.manager_file] = look["started_manager"]
    new = {path: text for path, text in want.files.items() if path in old}
    return change_reasons(old, new) or ["rendered files differ (knobs are the same)"]


def _mark_restart_loops(shell: HostShell, stack: Any, services: list[Service], seen: dict[str, Any]) -> None:
    """A service whose PID changes between two looks is crash-looping: it is down, whatever its
    service manager calls it."""
    running = [svc for svc in services if seen[svc.key] is not None and seen[svc.key]["running"]]
    if not running:
        return
    time.sleep(LOOP_CHECK_S)
    for svc in running:
        lines = shell.run(svc.host, manager_status_command(svc, stack.hosts[svc.host].ctl))
        if lines is None:
            continue
        state, pid = parse_manager_status(lines)
        first = seen[svc.key]
        if pid != first["pid"]:
            first.update(running=False, state=f"RESTART-LOOP (pid {first['pid']} -> {fmt.value(pid)})", pid=pid)


def status_table(rows: list[ServiceStatus]):
    """The rich table `knobkeeper status` and the demo print (terminal-safe details)."""
    # rich (~18 ms) for the table only: `status --json` and the deploy's checks never draw it
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("HOST", "SERVICE", "ROLE", "STATE", "PID", "DETAIL"):
        table.add_column(col)
    for r in rows:
        colour = {"in sync": "green", "drifted": "yellow", "down": "red"}.get(r.state, "")
        table.add_row(escape(r.host), escape(r.service), escape(r.role), f"[{colour}]{r.state}[/]" if colour else r.state,
                      str(r.pid or "-"), escape(fmt.safe(r.detail)))
    return table


def started_knobs(project: Project, inventory_path: str, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{service key: the knob values it was started with, or None when it does not run}: started.sh
    on its host, or (Slurm) the serving job's script. What `ab run` checks after each switch."""
    inventory = load_inventory(project.root, inventory_path, data)
    stack = stack_from_inventory(inventory, Path(inventory_path).stem)
    with host_shell(inventory) as shell:
        return target_of(stack).started_knobs(shell)


def hosts_started_knobs(shell: HostShell, stack: Any) -> dict[str, Any]:
    """The hosts target's started knobs: each running service's started.sh record on its host."""
    out: dict[str, Any] = {}
    for svc in stack.services:
        seen = observe(shell, stack.hosts[svc.host], svc)
        started = (seen or {}).get("started") if seen and seen.get("running") else None
        out[svc.key] = started.get("knobs") if isinstance(started, dict) else None
    return out
