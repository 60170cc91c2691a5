"""The restart plan of a review: what a deploy of the head would restart on a stack running the base.

The rule is the deploy's own (knobkeeper.deploy.observe.decide, as `plan` and the deploy apply it),
fed with the base render as what the hosts run; the order and the gates come from the topology
(stack order, topology.downstream). Nothing here names a role. knobkeeper.deploy.plan.restart_plan
itself reads the hosts (SSH, the local supervisord), which a review must not do: when deploy/plan.py
offers its planner over given observations, `plan_inventory` becomes a call to it.

Each restart says what changed in words (`what_changed`), derived from the two renders: knob
values (observe.knob_differences), other environment, the interpreter, flags, the working
directory, and template text, never only two digests.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from knobkeeper.deploy import render as R
from knobkeeper.deploy.observe import decide, knob_differences, script_knobs
from knobkeeper.deploy.plan import VERBS
from knobkeeper.deploy.topology import downstream
from knobkeeper.review.renders import InventoryRender, RenderedFile

MAX_TEXT_LINES = 3


@dataclass
class _Rendered:
    """What `decide` reads of a rendered service."""

    digest: str
    knobs: dict[str, str]
    launch: str


def plan_inventory(base: InventoryRender, head: InventoryRender) -> dict[str, Any]:
    """The plan in deploy/plan.py's shape: {"inventory", "order", "roles": [{"role", "health", "after",
    "batches": [[{"host", "service", "action", "reason", "why", "gate"}]]}], "counts"}, plus
    "restarted" (roles with a restart or start) and "regated" (roles downstream of them)."""
    rows_by_role: dict[str, list[dict]] = {role: [] for role in head.order}
    counts = {"restart": 0, "start": 0, "unchanged": 0}
    for (host, service), digest in sorted(head.services.items()):
        new_files = head.service_files(host, service)
        old_files = base.service_files(host, service)
        first = next(iter(new_files.values()))
        launch = next((f.text for p, f in new_files.items() if p.endswith(".sh")), "")
        seen = {"running": bool(old_files), "state": "RUNNING" if old_files else "absent",
                "started": {"digest": base.services.get((host, service)), "knobs": _knobs(old_files)}}
        action, reason = decide("changed", True, None, _Rendered(digest, _knobs(new_files), launch), seen, None)
        action = VERBS[action]
        why = what_changed(old_files, new_files) if action == "restart" else []
        if action == "start":
            reason = "new at head (not rendered at base)"
        elif action == "restart":
            reason = "; ".join(why) or reason
        counts[action] += 1
        rows_by_role.setdefault(first.role, []).append(
            {"host": host, "service": service, "action": action, "reason": reason, "why": why, "digest": digest})
    restarted = [r for r in head.order if any(row["action"] != "unchanged" for row in rows_by_role.get(r, []))]
    regated = downstream(head.order, head.roles, restarted) - set(restarted) if restarted else set()
    roles = []
    for role in head.order:
        for row in rows_by_role[role]:
            row["gate"] = True  # a deploy of every role gates every role
        roles.append({"role": role, "health": head.roles[role].health, "after": list(head.roles[role].after),
                      "batches": [rows_by_role[role]]})
    return {"inventory": head.inventory, "order": list(head.order), "roles": roles, "counts": counts,
            "restarted": restarted, "regated": [r for r in head.order if r in regated],
            "summary": _summary(head, restarted, regated)}


def _summary(head: InventoryRender, restarted: list[str], regated: set[str]) -> str:
    keep = [r for r in head.order if r not in restarted]
    if not restarted:
        return "no restart: no rendered file changes"
    if not keep:
        return "full co-restart in dependency order: " + " -> ".join(restarted)
    text = f"{' and '.join(restarted)} only: {' and '.join(keep)} keep running"
    for role in head.order:
        if role in regated:
            deps = " and ".join(d for d in head.roles[role].after if d in restarted or d in regated)
            text += f"; the {role} is still gated on the restarted {deps} workers"
    return text


def _knobs(files: dict[str, RenderedFile]) -> dict[str, str]:
    for f in files.values():
        if f.knobs:
            return json.loads(f.knobs)
    return {}


# --- what changed, in words -----------------------------------------------------------------------

def what_changed(before: dict[str, RenderedFile], after: dict[str, RenderedFile]) -> list[str]:
    """Why a service's files differ between two renders, one phrase per change."""
    old_knobs, new_knobs = _knobs(before), _knobs(after)
    words = knob_differences(new_knobs, old_knobs)
    for path in sorted(set(before) | set(after), key=lambda p: (not p.endswith(".sh"), p)):  # the script first
        a, b = before.get(path), after.get(path)
        old, new = (a.body if a else ""), (b.body if b else "")
        if old == new:
            continue
        if path.endswith(".sh"):
            words += _launch_changes(old, new, set(old_knobs) | set(new_knobs))
        else:
            words += _text_changes(path, old, new)
    return words


def _launch_parts(body: str) -> dict[str, Any]:
    """A rendered launch script's parts: exported variables, unset names, working dir, argv, the rest."""
    lines = body.splitlines()
    parts: dict[str, Any] = {"unset": set(), "cd": None, "argv": [], "other": []}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("exec "):
            block = [line[len("exec "):]]
            while block[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                block[-1] = block[-1][:-1]
                block.append(lines[i])
            try:
                parts["argv"] = shlex.split(" ".join(block))
            except ValueError:
                parts["other"].append(line)
        elif line.startswith("unset "):
            parts["unset"] = set(line.split()[1:])
        elif line.startswith("cd "):
            parts["cd"] = line[len("cd "):]
        elif not (line.startswith("export ") or "=\"$(cat " in line):
            parts["other"].append(line)
        i += 1
    parts["env"] = script_knobs(body)
    return parts


def _flags(argv: list[str]) -> dict[str, str]:
    """{flag: its values} of a command line (values of a repeated flag joined)."""
    out: dict[str, list[str]] = {}
    current = None
    for arg in argv:
        if arg.startswith("-"):
            current = arg
            out.setdefault(arg, [])
        elif current is not None:
            out[current].append(arg)
    return {k: " ".join(v) for k, v in out.items()}


def _launch_changes(old_body: str, new_body: str, knob_names: set[str]) -> list[str]:
    a, b = _launch_parts(old_body), _launch_parts(new_body)
    words = []
    env_a = {k: v for k, v in a["env"].items() if k not in knob_names}
    env_b = {k: v for k, v in b["env"].items() if k not in knob_names}
    words += [f"environment {d}" for d in knob_differences(env_b, env_a)]
    unset = sorted((b["unset"] - a["unset"]) - knob_names), sorted((a["unset"] - b["unset"]) - knob_names)
    if unset[0] or unset[1]:
        words.append("catalog knobs unset by the script: " + ", ".join([f"+{n}" for n in unset[0]] +
                                                                       [f"-{n}" for n in unset[1]]))
    if a["cd"] != b["cd"]:
        words.append(f"working directory {a['cd']} -> {b['cd']}")
    if a["argv"][:1] != b["argv"][:1]:
        words.append(f"interpreter {(a['argv'] or ['(none)'])[0]} -> {(b['argv'] or ['(none)'])[0]}")
    flags_a, flags_b = _flags(a["argv"][1:]), _flags(b["argv"][1:])
    for flag in sorted(set(flags_a) | set(flags_b)):
        old, new = flags_a.get(flag), flags_b.get(flag)
        if old is None:
            words.append(f"flag {flag}{' ' + new if new else ''} added")
        elif new is None:
            words.append(f"flag {flag} removed")
        elif old != new:
            words.append(f"flag {flag} {old} -> {new}")
    if a["other"] != b["other"]:
        words += _text_changes("launch.sh", "\n".join(a["other"]), "\n".join(b["other"]), R.LAUNCH_TEMPLATE)
    return words


def _text_changes(path: str, old: str, new: str, template: str | None = None) -> list[str]:
    """Lines a template's text changed, at most MAX_TEXT_LINES of them, with the template named."""
    if template is None:
        template = R.UNIT_TEMPLATE if path.endswith(".service") else R.PROGRAM_TEMPLATE
    old_lines, new_lines = old.splitlines(), new.splitlines()
    changed = [f"-{line}" for line in old_lines if line not in new_lines] + \
              [f"+{line}" for line in new_lines if line not in old_lines]
    shown = ", ".join(f"`{line}`" for line in changed[:MAX_TEXT_LINES])
    more = f" and {len(changed) - MAX_TEXT_LINES} more line(s)" if len(changed) > MAX_TEXT_LINES else ""
    return [f"{PurePosixPath(path).name} text changed (templates/{template}): {shown or 'whitespace'}{more}"]
