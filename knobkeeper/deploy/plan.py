"""`knobkeeper plan INVENTORY`: the restart plan of a deploy, computed from the rendered files and
what the hosts have, changing nothing.

For each role in deploy order, its hosts in batches (--data batch=N: N at a time; default all), and
per service what the deploy would do and why, with the same rule the deploy applies
(observe.decide): restart (files changed: the knobs that differ; co-restart; launch script edited on
the host), start (not running), or leave it. Every role in scope is gated; a role downstream of
`only=ROLE` is gated again. Hosts are read where they are (SSH for remote hosts, as `status`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from knobkeeper.deploy.observe import decide, host_shell, parse_service_state, state_command
from knobkeeper.deploy.render import render_stack
from knobkeeper.deploy.stack import Stack, load_inventory, stack_from_inventory
from knobkeeper.deploy.topology import downstream
from knobkeeper.errors import UserError
from knobkeeper.project import Project

RESTART_MODES = ("changed", "co", "none")
VERBS = {"restarted": "restart", "started": "start", "unchanged": "unchanged"}


def parse_batch(value: Any) -> int | None:
    """--data batch=N: hosts per batch (None: the whole role at once)."""
    if value is None or value == "" or value == "all":
        return None
    if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
        raise UserError(f"--data batch={value!r}: expected a number of hosts (1 or more) per batch")
    return int(value)


def role_batches(stack: Stack, role: str, size: int | None) -> list[list[str]]:
    """The role's hosts in inventory order, `size` at a time (default: one batch with all of them)."""
    hosts = [name for name, plan in stack.hosts.items() if plan.role_services(role)]
    size = size or max(len(hosts), 1)
    return [hosts[i:i + size] for i in range(0, len(hosts), size)] or [[]]


def restart_plan(project: Project, inventory_path: str, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    data = dict(data or {})
    mode = str(data.get("restart", "changed"))
    if mode not in RESTART_MODES:
        raise UserError(f"--data restart={mode}: expected one of {', '.join(RESTART_MODES)}")
    only = data.get("only") or None
    size = parse_batch(data.get("batch"))
    overrides = data.get("knob_overrides") or None
    inventory = load_inventory(project.root, inventory_path, data)
    stack = stack_from_inventory(inventory, Path(inventory_path).stem)
    if only is not None and only not in stack.roles:
        raise UserError(f"--data only={only}: not a role of this inventory (roles: {', '.join(stack.order)})")
    rendered = render_stack(project, stack, knob_overrides=overrides)
    scope = [only] if only else list(stack.order)
    gated = set(scope) | downstream(stack.order, stack.roles, scope)
    roles = []
    counts = {"restart": 0, "start": 0, "unchanged": 0, "unknown": 0}
    with host_shell(inventory) as shell:
        for role in stack.order:
            batches = []
            for hosts in role_batches(stack, role, size):
                batch = []
                for host in hosts:
                    plan = stack.hosts[host]
                    ctl = plan.supervisor.ctl() if plan.supervisor else ""
                    for svc in plan.role_services(role):
                        lines = shell.run(host, state_command(svc.manager, ctl, svc.name, svc.started_path,
                                                              svc.launch_path))
                        if lines is None:
                            action, reason = "unknown", shell.errors.get(host, "could not connect")
                        else:
                            seen = parse_service_state(lines)
                            action, reason = decide(mode, role in scope, only, rendered[(host, svc.name)], seen,
                                                    seen["launch"])
                            action = VERBS[action]
                        counts[action] += 1
                        batch.append({"host": host, "service": svc.name, "action": action, "reason": reason,
                                      "gate": role in gated and mode != "none",
                                      "digest": rendered[(host, svc.name)].digest})
                batches.append(batch)
            roles.append({"role": role, "health": stack.roles[role].health, "after": list(stack.roles[role].after),
                          "batches": batches})
    return {"inventory": str(inventory_path), "order": list(stack.order),
            "options": {"restart": mode, "only": only, "batch": size, "knob_overrides": overrides},
            "counts": counts, "roles": roles, "unreachable": dict(shell.errors)}


def plan_text(plan: Mapping[str, Any]) -> str:
    opts = plan["options"]
    counts = plan["counts"]
    lines = [f"plan for {plan['inventory']} (restart={opts['restart']}, batch={opts['batch'] or 'all'}"
             + (f", only={opts['only']}" if opts["only"] else "") + "): "
             + f"{counts['restart']} to restart, {counts['start']} to start, {counts['unchanged']} unchanged"
             + (f", {counts['unknown']} unreachable" if counts["unknown"] else "")]
    for number, role in enumerate(plan["roles"], 1):
        after = f", after {', '.join(role['after'])}" if role["after"] else ""
        lines.append(f"{number}. {role['role']} (gate {role['health']}{after})")
        for b, batch in enumerate(role["batches"], 1):
            for i, svc in enumerate(batch):
                label = f"batch {b}:" if i == 0 else ""
                gate = "" if svc["gate"] else ", not gated"
                lines.append(f"   {label:<9} {svc['host']}/{svc['service']}: {svc['action'].upper() if svc['action'] != 'unchanged' else 'unchanged'}"
                             f" ({svc['reason']}{gate})")
    for host, why in plan["unreachable"].items():
        lines.append(f"unreachable: {host}: {why}")
    return "\n".join(lines)
