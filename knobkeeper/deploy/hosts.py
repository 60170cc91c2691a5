"""The hosts target (deploy/target.py): a stack on pyinfra's hosts, over SSH or @local, a supervisord
or systemd service per engine process on each, at the address and ports the inventory gives.

A deploy run, per host: the service manager (supervisord), the files, then role by role in the
stack's order, batch by batch, the restarts and their gates; after the last role the PD proof
(knobkeeper/deploy/operations.py holds each step and its ordering rules, deploy/gates.py the gates).
"""

from __future__ import annotations

from typing import Any, Mapping

from pyinfra import host as current_host

from knobkeeper.deploy import operations as kk
from knobkeeper.errors import UserError
from knobkeeper.deploy.status import ServiceStatus, hosts_started_knobs, hosts_status


class HostsTarget:
    kind = "hosts"
    service_units = True
    started_record = "started.sh"
    placed_per_run = False
    partial_deploys = True
    repo_files = False
    canary_refusal = None
    installs_engines = True

    def __init__(self, stack: Any) -> None:
        self.stack = stack

    def check(self) -> None:
        """No two services of a host on one port (a Slurm job's components pick free ports on their nodes)."""
        seen: dict[tuple[str, int], str] = {}
        for svc in self.stack.services:
            for port in (svc.port, svc.bootstrap_port, svc.metrics_port, *(p for _, p in svc.ports)):
                if port is None:
                    continue
                other = seen.get((svc.address, port))
                if other:
                    raise UserError(f"port {port} on {svc.address}: used by both {other} and {svc.key}")
                seen[(svc.address, port)] = svc.key

    def commands(self) -> Mapping[tuple[str, str], list[str]]:
        return self.stack.commands

    def extra_files(self, project: Any, rendered: Mapping[tuple[str, str], Any], source: Any) -> dict:
        return {}

    def lint(self, files: Mapping[str, str]) -> list[tuple[str, str]]:
        return []  # its files are linted as scripts and units (review/check.py)

    def begin(self, run: Any) -> HostsRun:
        return HostsRun(run)

    def placed(self, inventory: Any) -> Any:
        return self.stack

    def job_plan(self, shell: Any, rendered: Mapping[tuple[str, str], Any], restart: str) -> None:
        return None

    def status(self, shell: Any, rendered: Mapping[tuple[str, str], Any],
               secrets: Mapping[str, list[str]]) -> list[ServiceStatus]:
        return hosts_status(shell, self.stack, rendered, secrets)

    def started_knobs(self, shell: Any) -> dict[str, Any]:
        return hosts_started_knobs(shell, self.stack)


class HostsRun:
    """The hosts' part of one deploy run: the same steps on every host, role by role."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def operations(self, plan: Any) -> None:
        run = self.run
        kk.supervisord(run, plan)
        kk.upload(run, plan)
        for role in current_host.loop(run.order):
            for batch in current_host.loop(run.batch_numbers(role)):
                kk.restart(run, plan, role, batch)
                kk.gate(run, plan, role, batch)
        kk.pd_proof(run)
