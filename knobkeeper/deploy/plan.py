"""The restart plan: which services a deploy restarts, starts or leaves, in which order, and why.
The one place restart decisions are made: the deploy (operations, at run time, per host), `plan`
(`knobkeeper plan INVENTORY`, changing nothing) and `review` (`change_plan`, from two renders) use it.

    decide(options, ...)        one service: "started" | "restarted" | "unchanged", and why
    change_reasons(old, new)    what changed between two renders of one service, in words a person
                                reads: "knob SGLANG_SM120_MMA_TARGET_CTAS: 256 -> 512",
                                "flag --time-scale: 0.1 -> 0.05", "interpreter: /a/python -> /b/python",
                                "supervisor program section: startsecs: 0 -> 3" (never only digests)
    restart_plan(project, inv)  the whole plan against what the hosts run now (SSH for remote hosts)
    change_plan(...)            the plan review shows: roles to restart, roles gated again, roles kept

Role order comes from the topology (topology.deploy_order), never a fixed list. For each role, its
hosts in batches (--data batch=N: N at a time; default all). Every role in scope is gated; a role
downstream of a restarted one is gated again.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping

from knobkeeper import fmt
from knobkeeper.deploy.model import Stack
from knobkeeper.deploy.observe import (failed_gate_words, hand_edits, host_shell, parse_service_state, script_knobs,
                                      shell_lines, state_command)
from knobkeeper.deploy.options import DeployOptions
from knobkeeper.deploy.render import parse_meta, render_stack, strip_header
from knobkeeper.deploy.stack import load_inventory, stack_from_inventory
from knobkeeper.deploy.target import target_of
from knobkeeper.deploy.topology import Role, downstream
from knobkeeper.knobs.pinned import ignored_knobs
from knobkeeper.project import Project

VERBS = {"restarted": "restart", "started": "start", "unchanged": "unchanged"}


# --- batches ----------------------------------------------------------------------------------------


def role_batches(stack: Stack, role: str, size: int | None) -> list[list[str]]:
    """The role's hosts in inventory order, `size` at a time (default: one batch with all of them)."""
    hosts = [name for name, plan in stack.hosts.items() if plan.role_services(role)]
    size = size or max(len(hosts), 1)
    return [hosts[i:i + size] for i in range(0, len(hosts), size)] or [[]]


# --- what changed, in words -----------------------------------------------------------------------------


def change_reasons(old_files: Mapping[str, str], new_files: Mapping[str, str],
                   describe: Any = None) -> list[str]:
    """What differs between two renders of one service ({path: text}; headers are ignored except
    for the knob values they name, which is how a secret's new fingerprint shows). `describe(old,
    new)`: the words of a target's own file (RenderedService.describe: a Kubernetes manifest's pod
    templates), where it has one."""
    out: list[str] = []
    for path in sorted(set(old_files) | set(new_files)):
        old, new = old_files.get(path), new_files.get(path)
        name = Path(path).name
        if old is None or new is None:
            out.append(f"{name}: {'new file' if old is None else 'no longer rendered'}")
        elif describe is not None:
            out += describe(old, new) if strip_header(old) != strip_header(new) else []
        elif _is_launch_script(new):
            out += _launch_changes(old, new)
        elif strip_header(old) != strip_header(new):
            out += _section_changes(strip_header(old), strip_header(new), _kind(path))
    return out


def _is_launch_script(text: str) -> bool:
    return text.startswith("#!") and any(line.startswith("exec ") for line in text.splitlines())


def _kind(path: str) -> str:
    return "systemd unit" if path.endswith(".service") else "supervisor program section"


def _launch_changes(old: str, new: str) -> list[str]:
    out: list[str] = []
    old_knobs = (parse_meta(old) or {}).get("knobs") or {}
    new_knobs = (parse_meta(new) or {}).get("knobs") or {}
    old_body, new_body = strip_header(old), strip_header(new)
    old_exports, new_exports = script_knobs(old_body), script_knobs(new_body)
    for name in sorted(set(old_exports) | set(new_exports) | set(old_knobs) | set(new_knobs)):
        knob = name in old_knobs or name in new_knobs
        a, b = old_exports.get(name), new_exports.get(name)
        if knob and (a == "(secret)" or b == "(secret)" or a is None and b is None):
            a, b = old_knobs.get(name), new_knobs.get(name)  # a secret: its fingerprint
        if a != b:
            out.append(f"{'knob' if knob else 'environment'} {name}: {fmt.change(a, b)}")
    old_cmd, new_cmd = _exec_argv(old_body), _exec_argv(new_body)
    out += _command_changes(old_cmd, new_cmd)
    old_rest, new_rest = _template_lines(old_body), _template_lines(new_body)
    if old_rest != new_rest:
        added = [line for line in new_rest if line not in old_rest]
        removed = [line for line in old_rest if line not in new_rest]
        sample = (f"+ {added[0]}" if added else f"- {removed[0]}") if added or removed else "lines reordered"
        out.append(f"launch script template: {len(added)} line(s) added, {len(removed)} removed ({fmt.short(sample, 60)})")
    return out


def _exec_argv(body: str) -> list[str]:
    lines = shell_lines(body)
    for i, line in enumerate(lines):
        if line.startswith("exec "):
            text = line
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i]
            try:
                return shlex.split(text)[1:]
            except ValueError:
                return text.split()[1:]
    return []


def _template_lines(body: str) -> list[str]:
    """The launch script's lines that come from the template alone (not exports, unset, exec)."""
    out, in_exec = [], False
    for line in shell_lines(body):
        if line.startswith("exec "):
            in_exec = line.endswith("\\")
            continue
        if in_exec:
            in_exec = line.endswith("\\")
            continue
        bare = line.strip()
        name = bare.removeprefix("export ").partition("=")[0]
        if bare.startswith(("export ", "unset ")) or ("=" in bare and name.isidentifier() and '"$(cat ' in bare):
            continue
        out.append(line)
    return out


def _flags(argv: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(leading words before the first flag, {flag: its values joined, one entry per occurrence})."""
    lead: list[str] = []
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for arg in argv:
        if arg.startswith("--"):
            current = arg
            flags.setdefault(arg, []).append("")
        elif current is None:
            lead.append(arg)
        else:
            values = flags[current]
            values[-1] = f"{values[-1]} {arg}".strip()
    return lead, flags


def _command_changes(old: list[str], new: list[str]) -> list[str]:
    if old == new:
        return []
    out = []
    if old[:1] != new[:1]:
        out.append(f"interpreter: {old[0] if old else '(none)'} -> {new[0] if new else '(none)'}")
    old_lead, old_flags = _flags(old[1:])
    new_lead, new_flags = _flags(new[1:])
    if old_lead != new_lead:
        out.append(f"command: {shlex.join(old_lead) or '(none)'} -> {shlex.join(new_lead) or '(none)'}")
    for flag in sorted(set(old_flags) | set(new_flags)):
        a, b = old_flags.get(flag), new_flags.get(flag)
        if a == b:
            continue
        show = lambda v: ", ".join(x or "(on)" for x in v)  # noqa: E731
        if a is None:
            out.append(f"flag {flag}: added ({show(b)})")
        elif b is None:
            out.append(f"flag {flag}: removed (was {show(a)})")
        else:
            out.append(f"flag {flag}: {show(a)} -> {show(b)}")
    if not out:
        out.append("engine command: arguments reordered")
    return out


def _section_changes(old: str, new: str, kind: str) -> list[str]:
    def pairs(text: str) -> tuple[dict[str, str], list[str]]:
        keyed, other, section = {}, [], ""
        for line in text.splitlines():
            bare = line.strip()
            if bare.startswith("[") and bare.endswith("]"):
                section = bare
            elif "=" in bare and not bare.startswith(("#", ";")):
                key, _, value = bare.partition("=")
                keyed[f"{section} {key.strip()}".strip()] = value.strip()
            elif bare:
                other.append(bare)
        return keyed, other

    (a, a_other), (b, b_other) = pairs(old), pairs(new)
    out = [f"{kind}: {key.split(' ', 1)[-1]}: {fmt.change(a.get(key), b.get(key))}"
           for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    if a_other != b_other or not out:
        out.append(f"{kind}: template changed")
    return out


# --- one service's decision -----------------------------------------------------------------------------


def decide(options: DeployOptions, in_scope: bool, rendered: Any, observed: Mapping[str, Any],
           host_launch: str | None = None) -> tuple[str, str, list[str]]:
    """What a deploy does to one service, why, and what changed: (action, reason, changes).

        not in only=ROLE                        -> unchanged
        restart=none                            -> unchanged
        not running                             -> started   (a rerun repairs what a failed run left down,
                                                              and says when its gate failed)
        restart=co                              -> restarted (co-restart)
        running, its last gate failed (marked)  -> restarted (it never passed a gate: started by
                                                              hand or by its manager since)
        digest of started.sh != rendered digest -> restarted (files changed: change_reasons)
        the host's launch script was edited     -> restarted (what the edit changed)
        otherwise                               -> unchanged
    `rendered` is a RenderedService; `observed` parse_service_state's dict (with the started files'
    texts and the failed gate's mark); `host_launch` the host's launch script before this deploy
    uploaded anything (a deploy uploads a service's files in the step that restarts it).
    """
    started = observed.get("started") or {}
    before = started.get("digest")
    failed = observed.get("failed_gate")
    if not in_scope:
        return "unchanged", f"not in only={options.only}", []
    if options.restart == "none":
        return "unchanged", "restart=none" + ("" if observed["running"] else " (not running)"), []
    if not observed["running"]:
        return "started", f"not running ({str(observed['state']).lower()})" + (
            f"; {failed_gate_words(failed)}" if failed else ""), []
    if options.restart == "co":
        return "restarted", "co-restart", []
    if failed:
        return "restarted", f"running without a passed gate: {failed_gate_words(failed)}", []
    if before != rendered.digest:
        if not before:
            return "restarted", "files changed (no started.sh: started outside knobkeeper)", []
        old = {path: text for path, text in ((rendered.service.launch_path, observed.get("started_text")),
                                             (rendered.service.manager_file, observed.get("started_manager")))
               if text is not None}
        new = {path: text for path, text in rendered.files.items() if path in old} or dict(rendered.files)
        changes = change_reasons(old, new) or [f"rendered digest {before} -> {rendered.digest}"]
        return "restarted", "files changed: " + "; ".join(changes), changes
    edits = hand_edits(rendered.launch, host_launch)
    if edits:
        return "restarted", "launch script edited on the host: " + "; ".join(edits), edits
    return "unchanged", "files unchanged and running", []


# --- the plan of a whole deploy ----------------------------------------------------------------------


def restart_plan(project: Project, inventory_path: str, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`knobkeeper plan`: per role in order, per batch, per service: the action, why, whether gated."""
    options = DeployOptions.from_data(data)
    inventory = load_inventory(project.root, inventory_path, data)
    stack = stack_from_inventory(inventory, Path(inventory_path).stem)
    options.check_roles(list(stack.order), inventory_path)
    rendered = render_stack(project, stack, knob_overrides=options.knob_overrides)
    scope = options.scope(stack.order)
    gated = set(scope) | downstream(stack.order, stack.roles, scope)
    roles = []
    counts = {"restart": 0, "start": 0, "unchanged": 0, "unknown": 0}
    target = target_of(stack)
    with host_shell(inventory) as shell:  # a Slurm stack: one job, a new one (and why) or the running one kept
        job = target.job_plan(shell, rendered, options.restart)
    if job is not None:                  # the unit restarts every role, gated
        scope, gated = list(stack.order), set(stack.order)
    with host_shell(inventory) as shell:
        for role in stack.order:
            batches = []
            for hosts in role_batches(stack, role, options.batch):
                batch = []
                for host in hosts:
                    plan = stack.hosts[host]
                    for svc in plan.role_services(role):
                        changes: list[str] = []
                        if job is not None:
                            action, reason, changes = job["services"][svc.name]
                            action = VERBS.get(action, action)
                            counts[action] += 1
                            batch.append({"host": host, "service": svc.name, "action": action, "reason": reason,
                                          "changes": changes, "gate": options.restart != "none",
                                          "digest": rendered[(host, svc.name)].digest})
                            continue
                        lines = shell.run(host, state_command(svc, plan.ctl, with_launch=True))
                        if lines is None:
                            action, reason = "unknown", shell.errors.get(host, "could not connect")
                        else:
                            seen = parse_service_state(lines)
                            action, reason, changes = decide(options, role in scope, rendered[(host, svc.name)],
                                                             seen, seen["launch"])
                            action = VERBS[action]
                        counts[action] += 1
                        batch.append({"host": host, "service": svc.name, "action": action, "reason": reason,
                                      "changes": changes, "gate": role in gated and options.restart != "none",
                                      "digest": rendered[(host, svc.name)].digest})
                batches.append(batch)
            roles.append({"role": role, "health": stack.roles[role].health, "after": list(stack.roles[role].after),
                          "batches": batches})
    return {"inventory": str(inventory_path), "order": list(stack.order),
            "options": {"restart": options.restart, "only": options.only, "batch": options.batch,
                        "knob_overrides": options.knob_overrides},
            "counts": counts, "roles": roles, "unreachable": dict(shell.errors),
            "engine_warnings": engine_warnings(project, str(inventory_path)), "target": target.kind,
            **({target.kind: {k: v for k, v in job.items() if k != "services"}} if job is not None else {})}


def engine_warnings(project: Project, inventory_path: str) -> list[str]:
    """Declared knobs that the engine version this inventory pins would ignore (forks included: a
    deploy should say what it ships that the engine may not read)."""
    where = f"pinned in {Path(inventory_path).as_posix()}"
    return [line for line in ignored_knobs(project, include_other_origin=True) if where in line]


def change_plan(inventory: str, order: list[str], roles: Mapping[str, Role], services: Mapping[str, set[str]],
                hosts: Mapping[str, set[str]]) -> dict[str, Any]:
    """The plan `review` shows for a change: `services`/`hosts` per role are those whose rendered
    files changed. Roles to restart in topology order, roles gated again (downstream of a restart),
    roles that keep running; `restart` and `keep` list them, `summary` says it in one line."""
    restart = [r for r in order if r in services]
    gated = downstream(order, roles, restart) - set(restart) if restart else set()
    steps: list[dict[str, Any]] = []
    for role in order:
        if role in services:
            steps.append({"role": role, "action": "restart", "services": sorted(services[role]),
                          "hosts": sorted(hosts.get(role, ())), "health": roles[role].health})
        elif role in gated:
            deps = [d for d in roles[role].after if d in restart]
            steps.append({"role": role, "action": "gate", "after": deps, "health": roles[role].health})
        else:
            steps.append({"role": role, "action": "keep"})
    keep = [r for r in order if r not in services]
    if not restart:
        summary = "no restart: no rendered file changes"
    elif not keep:
        summary = "full co-restart in dependency order: " + " -> ".join(restart)
    else:
        summary = f"{' and '.join(restart)} only: {' and '.join(keep)} keep running"
        if gated:
            summary += "; " + "; ".join(
                f"the {g} is still gated on the restarted {' and '.join(d for d in roles[g].after if d in restart)} workers"
                for g in order if g in gated)
    return {"inventory": inventory, "order": list(order), "steps": steps, "summary": summary,
            "restart": restart, "keep": keep}


def plan_text(plan: Mapping[str, Any]) -> str:
    opts = plan["options"]
    counts = plan["counts"]
    lines = [f"plan for {plan['inventory']} (restart={opts['restart']}, batch={opts['batch'] or 'all'}"
             + (f", only={opts['only']}" if opts["only"] else "") + "): "
             + f"{counts['restart']} to restart, {counts['start']} to start, {counts['unchanged']} unchanged"
             + (f", {counts['unknown']} unreachable" if counts["unknown"] else "")]
    job = plan.get(plan.get("target", ""))
    if job:  # a target whose deploy is one unit (a Slurm job): the unit is what restarts, in its words
        lines += job["lines"]
    for number, role in enumerate(plan["roles"], 1):
        after = f", after {', '.join(role['after'])}" if role["after"] else ""
        lines.append(f"{number}. {role['role']} (gate {role['health']}{after})")
        for b, batch in enumerate(role["batches"], 1):
            for i, svc in enumerate(batch):
                label = f"batch {b}:" if i == 0 else ""
                gate = "" if svc["gate"] else ", not gated"
                action = svc["action"].upper() if svc["action"] != "unchanged" else "unchanged"
                lines.append(f"   {label:<9} {svc['host']}/{svc['service']}: {action} ({fmt.safe(svc['reason'])}{gate})")
    for host, why in plan["unreachable"].items():
        lines.append(f"unreachable: {host}: {why}")
    for line in plan.get("engine_warnings") or []:
        lines.append(f"warning: {fmt.safe(line)}")
    return "\n".join(lines)
