"""The restart plan of a review: what a deploy of the head would restart on a stack running the base.

Every restart decision and every "what changed" phrase comes from knobkeeper.deploy.plan, the one
place the deploy and `plan` use too: `change_reasons` over the two renders of each service, and
`change_plan` for the roles to restart, to gate again and to keep (topology order; nothing here
names a role). The base render stands for what the hosts run: a review never reads the hosts.
"""

from __future__ import annotations

from typing import Any

from knobkeeper.deploy.plan import change_plan, change_reasons
from knobkeeper.deploy.render import WholeStack
from knobkeeper.review.renders import InventoryRender


def plan_inventory(base: InventoryRender, head: InventoryRender) -> dict[str, Any]:
    """The plan in deploy/plan.py's shape: {"inventory", "order", "roles": [{"role", "health", "after",
    "batches": [[{"host", "service", "action", "reason", "why", "gate"}]]}], "counts"}, plus
    "restarted" (roles with a restart or start) and "regated" (roles downstream of them)."""
    rows_by_role: dict[str, list[dict]] = {role: [] for role in head.order}
    counts = {"restart": 0, "start": 0, "unchanged": 0}
    changed: dict[str, set[str]] = {}
    hosts: dict[str, set[str]] = {}
    whole: list[tuple[WholeStack, dict]] = []   # the rows of files that carry every component
    for (host, service), digest in sorted(head.services.items()):
        new_files = head.service_files(host, service)
        old_files = base.service_files(host, service)
        role = next(iter(new_files.values())).role
        why: list[str] = []
        if not old_files:
            action, reason = "start", "new at head (not rendered at base)"
        elif base.services.get((host, service)) == digest:
            action, reason = "unchanged", "files unchanged"
        else:
            describe = next((f.describe for f in new_files.values() if f.describe), None)
            why = change_reasons({p: f.text for p, f in old_files.items()}, {p: f.text for p, f in new_files.items()},
                                 describe)
            action, reason = "restart", "; ".join(why) or "files changed"
        row = {"host": host, "service": service, "action": action, "reason": reason, "why": why, "digest": digest,
               "gate": True}
        unit = next((f.whole_stack for f in new_files.values() if f.whole_stack), None)
        if unit is not None:
            whole.append((unit, row))
            continue
        counts[action] += 1
        if action != "unchanged":
            changed.setdefault(role, set()).add(service)
            hosts.setdefault(role, set()).add(host)
        rows_by_role.setdefault(role, []).append(row)
    unit = _whole_stack_changed(whole, rows_by_role, counts, changed, hosts)
    decided = change_plan(head.inventory, list(head.order), head.roles, changed, hosts)
    if unit is not None:
        decided["summary"] = f"{unit.unit}: {' -> '.join(head.order)} {unit.how}"
    regated = [step["role"] for step in decided["steps"] if step["action"] == "gate"]
    roles = [{"role": role, "health": head.roles[role].health, "after": list(head.roles[role].after),
              "batches": [rows_by_role[role]]} for role in head.order]
    return {"inventory": head.inventory, "order": list(head.order), "roles": roles, "counts": counts,
            "restarted": decided["restart"], "regated": regated, "summary": decided["summary"]}


def _whole_stack_changed(whole: list[tuple[WholeStack, dict]], rows_by_role: dict[str, list[dict]],
                         counts: dict[str, int], changed: dict[str, set[str]],
                         hosts: dict[str, set[str]]) -> WholeStack | None:
    """A file that carries every component (RenderedService.whole_stack: a Slurm job script) that
    changed restarts each component with it, its own files changed or not; the file itself is no
    service of the plan. Its WholeStack, or None when no such file changed."""
    unit = next((unit for unit, row in whole if row["action"] != "unchanged"), None)
    if unit is None:
        return None
    for role, rows in rows_by_role.items():
        for row in rows:
            if row["action"] == "unchanged":
                counts["unchanged"] -= 1
                counts["restart"] += 1
                row.update(action="restart", reason=f"{unit.unit} ({unit.why})")
            changed.setdefault(role, set()).add(row["service"])
            hosts.setdefault(role, set()).add(row["host"])
    return unit
