"""The Kubernetes target (deploy/target.py): the stack as workloads in one namespace, applied from the
host where kubectl runs (the host whose `manager` is "kubernetes"). Each role's pods are the replicas
of its Deployment; a knob change changes that role's pod template only, so only that role rolls; the
API server's controller makes the new ReplicaSet and the deploy gates each role on its rollout.

Where each part lives: the inventory's data in settings.py, the manifests in manifests.py, kubectl in
client.py, the deploy run in ops.py, the live view (plan, status, drift, started knobs) in live.py,
strict offline validation in validate.py, the local control plane the tests use in build.py and
localcluster.py.
"""

from __future__ import annotations

from typing import Any, Mapping

from knobkeeper.deploy.kube.live import kube_plan, kube_status
from knobkeeper.deploy.kube.live import started_knobs as live_started_knobs
from knobkeeper.deploy.kube.manifests import kube_commands, render_manifests
from knobkeeper.deploy.kube.ops import KubeRun
from knobkeeper.deploy.kube.settings import settings_of
from knobkeeper.deploy.kube.validate import validate_yaml_text


class KubeTarget:
    kind = "kubernetes"
    service_units = False
    repo_files = True
    # One Deployment per service: its pods share one template, so a candidate on one replica of a
    # role needs a second Deployment of that role behind the same Service, not rendered yet.
    canary_refusal = ("its roles' pods share one pod template per Deployment; a canary needs a second "
                      "Deployment of the role (one replica on the candidate, behind the role's Service), which "
                      "the Kubernetes target does not render yet: judge the knob with `knobkeeper ab run`")
    installs_engines = False  # the image carries the engine
    started_record = "the live pod template"
    placed_per_run = False
    partial_deploys = False   # only=ROLE applies that role; the others are gated through the API, not their URLs

    def __init__(self, stack: Any) -> None:
        self.stack = stack

    def check(self) -> None:
        settings_of(self.stack)

    def commands(self) -> Mapping[tuple[str, str], list[str]]:
        return kube_commands(self.stack)

    def extra_files(self, project: Any, rendered: Mapping[tuple[str, str], Any], source: Any) -> dict:
        # In place of each service's launch script: its role's manifest (the containers get the env).
        return render_manifests(project, self.stack, rendered, source)

    def lint(self, files: Mapping[str, str]) -> list[tuple[str, str]]:
        version = settings_of(self.stack).kube_version
        return [(path, ": ".join(part for part in (f"line {p.line}" if p.line else "", p.obj, p.path, p.message) if part))
                for path, text in sorted(files.items())
                for p in validate_yaml_text(text, path, **({"kube_version": version} if version else {}))]

    def begin(self, run: Any) -> KubeRun:
        return KubeRun(run)

    def placed(self, inventory: Any) -> Any:
        return self.stack

    def job_plan(self, shell: Any, rendered: Mapping[tuple[str, str], Any], restart: str) -> dict[str, Any]:
        return kube_plan(shell, self.stack, rendered, restart)

    def status(self, shell: Any, rendered: Mapping[tuple[str, str], Any], secrets: Mapping[str, list[str]]) -> list:
        return kube_status(shell, self.stack, rendered, secrets)

    def started_knobs(self, shell: Any) -> dict[str, Any]:
        return live_started_knobs(shell, self.stack)
