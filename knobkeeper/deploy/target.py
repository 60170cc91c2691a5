"""A stack's deploy target: where its services run and how a deploy reaches them.

Three kinds, one interface:

    hosts   pyinfra's hosts (over SSH, or @local): a supervisord or systemd service per engine process
            on each, addressed as the inventory says (knobkeeper/deploy/hosts.py)
    slurm   the whole stack as one Slurm job submitted from a login host; each job places the
            services on its allocation's nodes anew (knobkeeper/deploy/slurm/target.py)
    kubernetes  each role a workload in one namespace, applied from where kubectl runs; a change rolls
            only the role whose pod template it changes (knobkeeper/deploy/kube/target.py)

The rest of the controller asks `target_of(stack)` and calls a method; it never asks which kind it
holds. Another kind is a class with these members and a row in TARGETS.

    >>> target_of(stack).kind, target_of(stack).started_record
    ('slurm', "the job's script")

TARGETS names the implementations by module path, imported on first use (as pyinfra names its
connectors): they import the modules that call them (render, plan, status, operations), so this
module imports none of them and no import circle hides behind a function-level import.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Protocol

# A host's `manager` (inventory data) -> the target that deploys a stack with such a host. A stack
# whose hosts name no manager here is deployed to its hosts (supervisord, systemd).
TARGETS = {"slurm": "knobkeeper.deploy.slurm.target:SlurmTarget",
           "kubernetes": "knobkeeper.deploy.kube.target:KubeTarget"}
HOSTS = "knobkeeper.deploy.hosts:HostsTarget"

Key = tuple[str, str]  # (host, service name), as render_stack keys its output


class TargetRun(Protocol):
    """A target's part of one deploy run, built while deploy.py loads (bad input: UserError, exit 2)."""

    def operations(self, plan: Any) -> None:
        """The pyinfra operations for `plan`'s host: upload, restart in order, gate (deploy.py)."""


class Target(Protocol):
    kind: str
    service_units: bool    # each service has its manager's file (a supervisord program, a systemd unit); else
                           # the target starts the launch scripts itself (a Slurm job's script holds them)
    started_record: str    # what holds a running service's started knob values (ab run's probe says it)
    placed_per_run: bool   # each deploy places the services anew: their addresses come from the running stack
    partial_deploys: bool  # `only=ROLE` restarts that role while the others keep serving (checked up first)
    installs_engines: bool # the deploy's engine step builds the host's engine environment (a container
                           # image carries its own)
    repo_files: bool       # some rendered files live in the repo, for a GitOps controller (deploy/repo_files.py)
    canary_refusal: str | None  # why a canary (the candidate on some of a role's services) cannot run
                           # on this target, in words; None: it can

    def check(self) -> None:
        """The target's own inventory data, checked when the stack loads (UserError naming the key)."""

    def commands(self) -> Mapping[Key, list[str]]:
        """Each service's engine command line as its launch script runs it."""

    def extra_files(self, project: Any, rendered: Mapping[Key, Any], source: Any) -> dict[Key, Any]:
        """Rendered files beyond the services' own (a job script holding them), or in their place under
        the same keys (a Kubernetes role's manifest): review shows them, check lints them."""

    def lint(self, files: Mapping[str, str]) -> list[tuple[str, str]]:
        """(path, problem) of the target's own rendered files, {path: text} (a Kubernetes manifest
        against the strict schema of its kind); check runs it on the rendered and the committed copy."""

    def begin(self, run: Any) -> TargetRun:
        """This target's part of the deploy run `run` (operations.DeployRun)."""

    def placed(self, inventory: Any) -> Any:
        """The stack with every service where it runs now (a Stack)."""

    def job_plan(self, shell: Any, rendered: Mapping[Key, Any], restart: str) -> dict[str, Any] | None:
        """A target that decides from its own state plans the stack whole (a Slurm job, Kubernetes
        workloads): {"services": {name: (action, reason, changes)}, "lines": what `plan` prints, ...};
        None: each service is planned on its host."""

    def status(self, shell: Any, rendered: Mapping[Key, Any], secrets: Mapping[str, Any]) -> list[Any]:
        """`knobkeeper status`'s rows (deploy.status.ServiceStatus), in the stack's order."""

    def started_knobs(self, shell: Any) -> dict[str, Any]:
        """{service key: the knob values it was started with, or None when it does not run}."""


def target_of(stack: Any) -> Target:
    """The target that deploys `stack` (deploy.model.Stack)."""
    managers = sorted({plan.manager for plan in stack.hosts.values()})
    path = next((TARGETS[m] for m in managers if m in TARGETS), HOSTS)
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)(stack)
