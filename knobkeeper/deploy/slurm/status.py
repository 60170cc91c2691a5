"""A Slurm stack seen from the controller, outside a deploy: which job serves (squeue), what it was
started with (the script Slurm stored: `scontrol write batch_script`), where each component listens
(its placement), and whether it answers. `status`, `plan`, `ab run` and `incident snapshot` read it
through deploy/status.py, deploy/plan.py and deploy/stack.running_stack.

    view = observe(shell, stack)          # JobView: serving job, its script and placements, or the error
    slurm_status(shell, stack, rendered)  # [ServiceStatus]: in sync / drifted / pending / down / unknown
    placed_stack(inventory, stack)        # the stack with each service where the job placed it
    job_plan(...)                         # `knobkeeper plan` for a Slurm stack: "new job" and why
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from knobkeeper import fmt
from knobkeeper.deploy.health import healthy_now
from knobkeeper.deploy.observe import host_runner, host_shell
from knobkeeper.deploy.plan import change_reasons
from knobkeeper.deploy.slurm.client import Client, Job, SlurmError
from knobkeeper.deploy.slurm.decide import decide, job_changes
from knobkeeper.deploy.status import ServiceStatus, knob_drift
from knobkeeper.deploy.slurm.job import (Placement, Settings, component_scripts, job_meta, parse_placement,
                                         settings_of)


@dataclass
class JobView:
    settings: Settings
    jobs: list[Job] = field(default_factory=list)  # this stack's pending and running jobs, newest first
    serving: Job | None = None  # the newest running job (else the newest pending one)
    ended: Job | None = None  # with none serving: the newest one slurmctld still remembers (MinJobAge)
    script: str | None = None  # what Slurm stored for it
    placements: dict[str, Placement] = field(default_factory=dict)
    error: str | None = None  # slurmctld or the login host could not be asked

    @property
    def meta(self) -> dict[str, Any]:
        return job_meta(self.script) or {}

    def component(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.meta.get("components", []) if c.get("service") == name), None)


def client_for(shell: Any, settings: Settings) -> Client:
    return Client(settings, host_runner(shell, settings.host, lambda why: SlurmError(
        f"slurm: cannot reach the login host {settings.host}: {why}")))


def observe(shell: Any, stack: Any) -> JobView:
    settings = settings_of(stack)
    view = JobView(settings)
    client = client_for(shell, settings)
    try:
        known = client.jobs()
        view.jobs = [j for j in known if j.pending or j.state == "RUNNING"]
        view.serving = next((j for j in view.jobs if j.state == "RUNNING"), view.jobs[0] if view.jobs else None)
        view.ended = None if view.serving else next(iter(known), None)
        if view.serving is not None and view.serving.state == "RUNNING":
            view.script = client.batch_script(view.serving.id)
            folder = settings.job_dir(view.serving.id)
            names = " ".join(f"{folder}/{s.name}.placement" for s in stack.services)
            lines = client.run(f"for f in {names}; do [ -e \"$f\" ] && cat \"$f\"; done; true")
            for line in lines:
                placement = parse_placement(line)
                if placement is not None:
                    view.placements[placement.service] = placement
    except SlurmError as exc:
        view.error = str(exc)
    return view


def placed_stack(inventory: Any, stack: Any) -> Any:
    """The stack with every service of the serving job at the address and ports it published."""
    with host_shell(inventory) as shell:
        view = observe(shell, stack)
    return with_placements(stack, view.placements)


def with_placements(stack: Any, placements: Mapping[str, Placement]) -> Any:
    hosts = {}
    for name, plan in stack.hosts.items():
        services = [placements[s.name].place(s) if s.name in placements else s for s in plan.services]
        hosts[name] = dataclasses.replace(plan, services=services)
    return dataclasses.replace(stack, hosts=hosts)


def slurm_status(shell: Any, stack: Any, rendered: Mapping[tuple[str, str], Any],
                 problems: Mapping[str, list[str]] | None = None) -> list[Any]:
    """Per component: in sync / drifted (what differs) / pending (Slurm's reason) / down / unknown."""
    view = observe(shell, stack)
    settings = view.settings
    job_entry = rendered[(settings.host, settings.job_name)]
    expected = sum(1 for s in stack.services if s.role in ("prefill", "decode"))
    embedded = component_scripts(view.script)
    out = []
    for svc in sorted(stack.services, key=lambda s: (stack.order.index(s.role), s.name)):
        want = rendered[(svc.host, svc.name)]
        row = ServiceStatus(svc.host, svc.name, svc.role, "unknown", None, "", want.digest, None)
        job = view.serving
        if view.error:
            row.manager_state, row.differences = "slurm unreachable", [view.error]
        elif job is None:
            row.state, row.manager_state = "down", "no job"
            gone = view.ended
            why = "" if gone is None else f"; job {gone.id} ended {gone.state}" + (
                f" ({gone.reason})" if gone.reason else "") + f" (its output: {settings.output_of(gone.id)})"
            row.differences = [f"no job {settings.job_name} in squeue{why} (`knobkeeper deploy` submits one)"]
        elif job.state != "RUNNING":
            row.state, row.manager_state, row.job = "pending", f"job {job.id} {job.state}", job.id
            row.differences = [f"job {job.id} {job.state.lower()}: {job.reason or 'no reason given'}"]
        else:
            row.job, row.manager_state = job.id, f"job {job.id} RUNNING"
            mine = view.component(svc.name)
            placement = view.placements.get(svc.name)
            row.running_digest = (mine or {}).get("digest")
            row.started_from = view.meta.get("source")
            if placement is None:
                row.state = "down"
                row.differences = [f"job {job.id} runs, but {svc.name} has not published where it listens "
                                   f"(starting, or it exited: {settings.output_of(job.id)})"]
            else:
                placed = placement.place(svc)
                row.pid, row.node, row.url = placement.pid, placement.node, placed.url
                ok, health = healthy_now(placed, expected)
                if not ok:
                    row.state, row.differences = "down", [f"{placed.health_url}: {health}"]
                else:
                    row.state = "in sync"
                    if mine is None:
                        row.differences = [f"job {job.id} has no component {svc.name}"]
                    elif row.running_digest != want.digest:
                        row.differences = knob_drift(want.knobs, mine.get("knobs") or {}) or change_reasons(
                            {svc.launch_path: embedded.get(svc.name, "")}, {svc.launch_path: want.launch}) or [
                            f"rendered digest {row.running_digest} -> {want.digest}"]
                    else:
                        # Its own files are as declared; the job's own lines (allocations) may not be.
                        job_lines = job_changes(view.script, next(iter(job_entry.files.values())))
                        row.differences = [f"job {job.id}: {line} (a deploy submits a new job)" for line in job_lines]
                    if row.differences:
                        row.state = "drifted"
        extra = list((problems or {}).get(svc.role, []))
        if extra:
            row.differences += extra
            row.state = "drifted" if row.state == "in sync" else row.state
        out.append(row)
    return out


def started_knobs(shell: Any, stack: Any) -> dict[str, dict[str, str] | None]:
    """{service key: the knob values the serving job started it with} (None: not running)."""
    view = observe(shell, stack)
    out: dict[str, dict[str, str] | None] = {}
    for svc in stack.services:
        mine = view.component(svc.name) if view.serving and view.serving.state == "RUNNING" else None
        out[svc.key] = dict(mine.get("knobs") or {}) if mine is not None and svc.name in view.placements else None
    return out


def job_plan(shell: Any, stack: Any, rendered: Mapping[tuple[str, str], Any], restart: str) -> dict[str, Any]:
    """What a deploy would do with the stack's jobs now: {"action": "new job" | "keep" | "none" |
    "unknown", "why": [...], "running": job id or None, "services": {name: (action, reason, changes)},
    "lines": what `plan` prints of it}."""
    settings = settings_of(stack)
    entry = rendered[(settings.host, settings.job_name)]
    client = client_for(shell, settings)
    try:
        jobs = [j for j in client.jobs() if j.pending or j.state == "RUNNING"]
        d = decide(restart, jobs, entry.digest, list(stack.services), rendered, next(iter(entry.files.values())),
                   settings.job_name, client.batch_script)
    except SlurmError as exc:
        return _with_lines({"action": "unknown", "why": [str(exc)], "running": None, "job": settings.job_name,
                            "services": {s.name: ("unknown", str(exc), []) for s in stack.services}})
    running = d.keep or d.previous
    return _with_lines({"action": d.action, "why": d.why, "running": running.id if running else None,
                        "replaces": [j.id for j in d.replace], "services": d.services, "job": settings.job_name})


def _with_lines(job: dict[str, Any]) -> dict[str, Any]:
    """The job plan with the lines `plan` prints of it (the job is what restarts)."""
    words = {"new job": "NEW JOB", "keep": f"keep job {job['running']}", "none": "nothing submitted"}
    replaces = job.get("replaces")
    lines = [f"slurm job {job['job']}: {words.get(job['action'], job['action'])}"
             + (f" (cancels job {', '.join(replaces)} after every gate passed)"
                if job["action"] == "new job" and replaces else "")]
    return {**job, "lines": lines + [f"   why: {fmt.safe(w)}" for w in job["why"]]}
