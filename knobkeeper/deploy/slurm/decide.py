"""The one restart decision of a Slurm stack, used by the deploy (ops.submit, at run time) and by
`knobkeeper plan` (changing nothing): keep the job that runs, or submit a new one, and why in words.

    restart=none                                   -> none      (nothing submitted)
    a job runs (or is pending with) this digest    -> keep      (a no-op deploy submits nothing)
    restart=co                                     -> new job   (co-restart)
    no job of this stack                           -> new job   (every component: started)
    otherwise                                      -> new job   (every component: restarted; each says
                                                                 what changed in its launch script, or
                                                                 that only the job is new)

A job's environment cannot change (`scontrol update Environment=` is refused; requeue keeps the old
environment), so "what changed" for one component restarts them all: they are one job.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from knobkeeper.deploy.plan import change_reasons
from knobkeeper.deploy.render import strip_header
from knobkeeper.deploy.slurm.client import Job
from knobkeeper.deploy.slurm.job import DELIMITER, component_scripts, job_meta


@dataclass
class Decision:
    action: str  # "new job" | "keep" | "none"
    why: list[str]
    services: dict[str, tuple[str, str, list[str]]] = field(default_factory=dict)  # name -> (action, reason, changes)
    keep: Job | None = None  # the job that keeps serving (keep), or the one serving now (none)
    replace: list[Job] = field(default_factory=list)  # cancelled once the serving job passed its gates
    previous: Job | None = None  # the job a new one replaces (its script is the "before" of the reasons)
    old_digests: dict[str, str] = field(default_factory=dict)  # service -> digest in the previous job


def decide(restart: str, jobs: list[Job], digest: str, services: list[Any], rendered: Mapping[tuple[str, str], Any],
           script: str, job_name: str, batch_script: Callable[[str], str | None]) -> Decision:
    """`jobs`: this stack's pending and running jobs, newest first; `batch_script(id)` reads a job's
    stored script (only called for a new job that replaces one)."""
    current = next((j for j in jobs if j.digest == digest), None)
    previous = next((j for j in jobs if j.state == "RUNNING"), jobs[0] if jobs else None)
    if restart == "none":
        serving = current or previous
        return Decision("none", ["restart=none: nothing submitted"], keep=serving, previous=previous, services={
            s.name: ("unchanged", "restart=none" + ("" if serving else " (no job running)"), []) for s in services})
    if current is not None and restart != "co":
        return Decision("keep", [f"job {current.id} runs this stack's digest {digest}: nothing to submit"],
                        keep=current, replace=[j for j in jobs if j is not current], previous=previous,
                        services={s.name: ("unchanged", f"job {current.id} runs it unchanged", []) for s in services})
    if previous is None:
        why = f"no job {job_name} is running"
        return Decision("new job", [why], services={s.name: ("started", why, []) for s in services})
    if restart == "co":
        return Decision("new job", [f"co-restart (replaces job {previous.id})"], replace=list(jobs), previous=previous,
                        services={s.name: ("restarted", "co-restart", []) for s in services})
    old_script = batch_script(previous.id)
    old_parts = component_scripts(old_script)
    old_digests = {c["service"]: c.get("digest") for c in (job_meta(old_script) or {}).get("components", [])}
    changes: dict[str, list[str]] = {}
    for svc in services:
        old = old_parts.get(svc.name)
        new = rendered[(svc.host, svc.name)].launch
        changes[svc.name] = ["new component"] if old is None else change_reasons({svc.launch_path: old},
                                                                                  {svc.launch_path: new})
    changed = [name for name, lines in changes.items() if lines]
    why = [f"{name}: " + "; ".join(changes[name]) for name in changed] + job_changes(old_script, script)
    if not why:
        why = [f"job {previous.id} runs digest {previous.digest or '(none)'}, rendered {digest}"]
    out = {}
    for svc in services:
        mine = changes[svc.name]
        reason = ("files changed: " + "; ".join(mine)) if mine else (
            "its files are unchanged; the job is new because " + (", ".join(changed) or "the job script")
            + " changed (a job's environment cannot change)")
        out[svc.name] = ("restarted", reason, mine)
    return Decision("new job", [f"replaces job {previous.id}: " + w for w in why], services=out, replace=list(jobs),
                    previous=previous, old_digests={k: v for k, v in old_digests.items() if v})


def job_changes(old: str | None, new: str) -> list[str]:
    """What changed in the job script outside the components' launch scripts (allocations, layout)."""
    if not old:
        return []
    def outside(text: str) -> list[str]:
        out, inside = [], False  # the job-level lines: not the embedded launch scripts, not blank lines
        for line in strip_header(text).splitlines():
            if inside:
                inside = line != DELIMITER
            elif line.endswith(f"<<'{DELIMITER}'") and line.startswith("sed "):
                inside = True
            elif line.strip():
                out.append(line)
        return out

    a, b = outside(old), outside(new)
    if a == b:
        return []
    diff = list(difflib.unified_diff(a, b, lineterm="", n=0))
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    removed = [line[1:] for line in diff if line.startswith("-") and not line.startswith("---")]
    sample = f"+ {added[0]}" if added else f"- {removed[0]}"
    return [f"job script: {len(added)} line(s) added, {len(removed)} removed ({sample.strip()[:80]})"]
