"""A Kubernetes stack seen from the controller: each workload as the API server has it (kubectl get),
compared with what the knobs render. `plan`, `status` and `ab run`'s probe read it through the
target (deploy/kube/target.py); the deploy reads it before and after each apply.

    look = observe(kube, stack)             # {service name: Live}: the Deployment, its ReplicaSets
    role_plan(look, stack, rendered)        # per service: ("restart" | "start" | "unchanged", why, changes)
    kube_status(shell, stack, rendered)     # [ServiceStatus]: in sync / drifted / down / unknown
    started_knobs(shell, stack)             # {service key: the knob values its live pod template has}

What a live pod template says is read from the template itself: its env (the values its pods get),
its knobkeeper.dev/digest annotation (the render it came from) and its entries annotation. A
template changed by hand (`kubectl set env`) keeps the annotation but not the env: that is drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from knobkeeper import fmt
from knobkeeper.deploy.kube.client import Kubectl, KubeError
from knobkeeper.deploy.kube.manifests import (DIGEST, KNOBS, SECRETS, annotation_json, container_of, env_of,
                                            objects_of, selector_of, template_changes)
from knobkeeper.deploy.kube.settings import settings_of
from knobkeeper.deploy.observe import host_runner, knob_differences
from knobkeeper.deploy.status import ServiceStatus

REVISION = "deployment.kubernetes.io/revision"


@dataclass
class Live:
    """One workload as the API server has it (None fields: absent)."""

    deployment: dict[str, Any] | None = None
    replica_sets: list[dict[str, Any]] = field(default_factory=list)

    @property
    def template(self) -> dict[str, Any]:
        return ((self.deployment or {}).get("spec") or {}).get("template") or {}

    @property
    def digest(self) -> str | None:
        return ((self.template.get("metadata") or {}).get("annotations") or {}).get(DIGEST)

    @property
    def revision(self) -> int | None:
        value = ((self.deployment or {}).get("metadata") or {}).get("annotations", {}).get(REVISION)
        return int(value) if value and str(value).isdigit() else None

    @property
    def generation(self) -> int:
        return int(((self.deployment or {}).get("metadata") or {}).get("generation") or 0)

    @property
    def observed(self) -> int:
        return int(((self.deployment or {}).get("status") or {}).get("observedGeneration") or 0)

    def replica_set(self, revision: int | None) -> dict[str, Any] | None:
        for rs in self.replica_sets:
            if str((rs.get("metadata") or {}).get("annotations", {}).get(REVISION)) == str(revision):
                return rs
        return None


def knobs_of(template: Mapping[str, Any]) -> dict[str, str]:
    """The knob values a pod template gives its pods, as shown (a secret: its fingerprint)."""
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    names = annotation_json(annotations.get(KNOBS))
    secrets = annotation_json(annotations.get(SECRETS))
    env = env_of(template)
    return {name: str(secrets.get(name, env.get(name, ""))) for name in names}


def wanted_objects(rendered_service: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """{(kind, name): object} of a service's rendered manifest file."""
    text = next(iter(rendered_service.files.values()))
    return {(d["kind"], d["metadata"]["name"]): d for d in objects_of(text)}


def wanted_deployment(rendered_service: Any) -> dict[str, Any]:
    return wanted_objects(rendered_service)[("Deployment", rendered_service.service.name)]


def observe(kube: Kubectl, stack: Any, services: list[Any] | None = None) -> dict[str, Live]:
    """{service name: Live} of `services` (default: the stack's)."""
    out: dict[str, Live] = {}
    for svc in stack.services if services is None else services:
        deployment = kube.get("deployment", svc.name)
        sets = kube.objects("replicaset", selector_of(stack, svc)) if deployment else []
        out[svc.name] = Live(deployment=deployment, replica_sets=sets)
    return out


def decide(live: Live, want: dict[str, Any], restart: str) -> tuple[str, str, list[str]]:
    """(action, why, changes) for one workload: what an apply of `want` does to it."""
    if restart == "none":
        return "unchanged", "restart=none: manifests uploaded, nothing applied", []
    if live.deployment is None:
        return "start", "new: no such Deployment in the namespace (created, its first ReplicaSet rolls out)", []
    template = want["spec"]["template"]
    want_digest = template["metadata"]["annotations"][DIGEST]
    replicas = ((live.deployment.get("spec") or {}).get("replicas"), want["spec"]["replicas"])
    scaled = f"; replicas {replicas[0]} -> {replicas[1]} (scaling rolls nothing)" if replicas[0] != replicas[1] else ""
    if restart == "co":
        return "restart", "co-restart (restart=co): a new ReplicaSet of the same template" + scaled, []
    if live.digest != want_digest:
        changes = template_changes(live.template, template)
        return "restart", "pod template changed: " + "; ".join(changes) + scaled, changes
    if env_of(live.template) != env_of(template):  # the render's annotation, not its env: a hand edit
        changes = template_changes(live.template, template)
        return "restart", "its live pod template was edited by hand: " + "; ".join(changes) + scaled, changes
    return "unchanged", "pod template unchanged" + scaled, []


def role_plan(look: Mapping[str, Live], services: list[Any], rendered: Mapping[tuple[str, str], Any],
              restart: str) -> dict[str, tuple[str, str, list[str]]]:
    return {svc.name: decide(look[svc.name], wanted_deployment(rendered[(svc.host, svc.name)]), restart)
            for svc in services}


def kube_plan(shell: Any, stack: Any, rendered: Mapping[tuple[str, str], Any], restart: str) -> dict[str, Any]:
    """`knobkeeper plan` for a Kubernetes stack: per workload, whether it rolls, and why in words."""
    settings = settings_of(stack)
    kube = Kubectl(settings, _runner(shell, settings))
    try:
        look = observe(kube, stack)
        services = role_plan(look, stack.services, rendered, restart)
    except KubeError as exc:
        services = {s.name: ("unknown", str(exc), []) for s in stack.services}
    rolls = [s.role for s in stack.services if services[s.name][0] in ("restart", "start")]
    lines = [f"kubernetes namespace {settings.namespace}: "
             + (f"rolls {', '.join(dict.fromkeys(rolls))}" if rolls else "nothing rolls")]
    for svc in stack.services:
        action, why, _ = services[svc.name]
        lines.append(f"   {svc.role}: Deployment {svc.name}: {action}: {fmt.safe(why)}")
    return {"namespace": settings.namespace, "services": services, "lines": lines}


def _runner(shell: Any, settings: Any):
    return host_runner(shell, settings.host, lambda why: KubeError(
        f"kubernetes: cannot reach {settings.host}, where kubectl runs: {why}"))


def readiness(live: Live) -> str:
    spec = (live.deployment or {}).get("spec") or {}
    status = (live.deployment or {}).get("status") or {}
    return (f"{status.get('readyReplicas') or 0}/{spec.get('replicas', 0)} ready, "
            f"{status.get('updatedReplicas') or 0} updated, revision {live.revision or '?'}")


def kube_status(shell: Any, stack: Any, rendered: Mapping[tuple[str, str], Any],
                problems: Mapping[str, list[str]] | None = None) -> list[ServiceStatus]:
    settings = settings_of(stack)
    kube = Kubectl(settings, _runner(shell, settings))
    try:
        look = observe(kube, stack)
        error = None
    except KubeError as exc:
        look, error = {}, str(exc)
    out = []
    for svc in sorted(stack.services, key=lambda s: (stack.order.index(s.role), s.name)):
        want = rendered[(svc.host, svc.name)]
        row = ServiceStatus(svc.host, svc.name, svc.role, "unknown", None, "", want.digest, None)
        if error:
            row.manager_state, row.differences = "API server unreachable", [error]
        elif look[svc.name].deployment is None:
            row.state, row.manager_state = "down", "no deployment"
            row.differences = [f"no Deployment {svc.name} in namespace {settings.namespace} (`knobkeeper deploy` applies it)"]
        else:
            live = look[svc.name]
            row.running_digest, row.manager_state = live.digest, readiness(live)
            wanted = wanted_deployment(want)["spec"]["template"]
            if live.digest != want.digest or env_of(live.template) != env_of(wanted):
                row.state = "drifted"  # each variable as `status` says it on hosts, else what else differs
                row.differences = (knob_differences(env_of(wanted), env_of(live.template))
                                   or template_changes(live.template, wanted))
            else:
                row.state = "in sync"
        row.differences += list((problems or {}).get(svc.role, []))
        out.append(row)
    return out


def started_knobs(shell: Any, stack: Any) -> dict[str, Any]:
    """{service key: the knob values of its live pod template, or None when it has none}."""
    settings = settings_of(stack)
    kube = Kubectl(settings, _runner(shell, settings))
    look = observe(kube, stack)
    return {svc.key: knobs_of(look[svc.name].template) if look[svc.name].deployment else None
            for svc in stack.services}
