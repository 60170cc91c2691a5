"""The restart plan of a review: what a deploy of the head would restart on a stack running the base.

Every restart decision and every "what changed" phrase comes from knobkeeper.deploy.plan, the one
place the deploy and `plan` use too: `change_reasons` over the two renders of each service, and
`change_plan` for the roles to restart, to gate again and to keep (topology order; nothing here
names a role). The base render stands for what the hosts run: a review never reads the hosts.
"""

from __future__ import annotations

from typing import Any

from knobkeeper.deploy.plan import change_plan, change_reasons
from knobkeeper.review.renders import InventoryRender


def plan_inventory(base: InventoryRender, head: InventoryRender) -> dict[str, Any]:
    """The plan in deploy/plan.py's shape: {"inventory", "order", "roles": [{"role", "health", "after",
    "batches": [[{"host", "service", "action", "reason", "why", "gate"}]]}], "counts"}, plus
    "restarted" (roles with a restart or start) and "regated" (roles downstream of them)."""
    rows_by_role: dict[str, list[dict]] = {role: [] for role in head.order}
    counts = {"restart": 0, "start": 0, "unchanged": 0}
    changed: dict[str, set[str]] = {}
    hosts: dict[str, set[str]] = {}
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
            why = change_reasons({p: f.text for p, f in old_files.items()}, {p: f.text for p, f in new_files.items()})
            action, reason = "restart", "; ".join(why) or "files changed"
        counts[action] += 1
        if action != "unchanged":
            changed.setdefault(role, set()).add(service)
            hosts.setdefault(role, set()).add(host)
        rows_by_role.setdefault(role, []).append({"host": host, "service": service, "action": action,
                                                  "reason": reason, "why": why, "digest": digest, "gate": True})
    new_job = _slurm_job(rows_by_role, counts, changed, hosts)
    decided = change_plan(head.inventory, list(head.order), head.roles, changed, hosts)
    if new_job:
        decided["summary"] = (f"new Slurm job: {' -> '.join(head.order)} gated in it, then the old job is cancelled "
                              "(one job carries every component)")
    regated = [step["role"] for step in decided["steps"] if step["action"] == "gate"]
    roles = [{"role": role, "health": head.roles[role].health, "after": list(head.roles[role].after),
              "batches": [rows_by_role[role]]} for role in head.order]
    return {"inventory": head.inventory, "order": list(head.order), "roles": roles, "counts": counts,
            "restarted": decided["restart"], "regated": regated, "summary": decided["summary"]}


def _slurm_job(rows_by_role: dict[str, list[dict]], counts: dict[str, int], changed: dict[str, set[str]],
               hosts: dict[str, set[str]]) -> bool:
    """A Slurm stack's job script (role JOB_ROLE) is one job for every component: when it changes,
    each component restarts in the new job, its own files changed or not (knobkeeper/deploy/slurm)."""
    from knobkeeper.deploy.slurm.job import JOB_ROLE

    job_rows = rows_by_role.pop(JOB_ROLE, [])
    changed.pop(JOB_ROLE, None)
    hosts.pop(JOB_ROLE, None)
    for row in job_rows:
        counts[row["action"]] -= 1
    if not any(row["action"] != "unchanged" for row in job_rows):
        return False
    for role, rows in rows_by_role.items():
        for row in rows:
            if row["action"] == "unchanged":
                counts["unchanged"] -= 1
                counts["restart"] += 1
                row.update(action="restart", reason="new Slurm job (its own files are unchanged; a job's "
                                                    "environment cannot change)")
            changed.setdefault(role, set()).add(row["service"])
            hosts.setdefault(role, set()).add(row["host"])
    return True
