"""The Slurm target (deploy/target.py): the stack as one job submitted from a login host (the host
whose `manager` is "slurm"). Each job places the services on its nodes anew, so their addresses
come from the running job; a change is a new job, gated role by role, and the old job is cancelled
after every gate passed; `only=ROLE` does not apply (a job's environment cannot change).

Where each part lives: the job's settings, script and placements in job.py, the deploy run in ops.py,
status, plans and placements of the running job in status.py.
"""

from __future__ import annotations

from typing import Any, Mapping

from knobkeeper.deploy.slurm.job import render_job, runtime_commands, settings_of
from knobkeeper.deploy.slurm.ops import SlurmRun
from knobkeeper.deploy.slurm.status import job_plan, placed_stack, slurm_status
from knobkeeper.deploy.slurm.status import started_knobs as job_started_knobs


class SlurmTarget:
    kind = "slurm"
    service_units = False
    started_record = "the job's script"
    placed_per_run = True
    partial_deploys = False
    repo_files = False
    canary_refusal = None
    installs_engines = True

    def __init__(self, stack: Any) -> None:
        self.stack = stack

    def check(self) -> None:
        settings_of(self.stack)

    def commands(self) -> Mapping[tuple[str, str], list[str]]:
        return runtime_commands(self.stack)

    def extra_files(self, project: Any, rendered: Mapping[tuple[str, str], Any], source: Any) -> dict:
        job = render_job(project, self.stack, rendered, source)  # role JOB_ROLE: keyed (login host, job name)
        return {(job.service.host, job.service.name): job}

    def lint(self, files: Mapping[str, str]) -> list[tuple[str, str]]:
        return []  # its files are linted as scripts and units (review/check.py)

    def begin(self, run: Any) -> SlurmRun:
        return SlurmRun(run)

    def placed(self, inventory: Any) -> Any:
        return placed_stack(inventory, self.stack)

    def job_plan(self, shell: Any, rendered: Mapping[tuple[str, str], Any], restart: str) -> dict[str, Any]:
        return job_plan(shell, self.stack, rendered, restart)

    def status(self, shell: Any, rendered: Mapping[tuple[str, str], Any], secrets: Mapping[str, list[str]]) -> list:
        return slurm_status(shell, self.stack, rendered, secrets)

    def started_knobs(self, shell: Any) -> dict[str, Any]:
        return job_started_knobs(shell, self.stack)
