"""What a Kubernetes stack's inventory says: the data of its one host, the machine kubectl runs on
(@local, or a bastion over SSH), whose `service_manager` is "kubernetes". Checked when the stack
loads, one line per problem (UserError: exit 2, nothing applied).

    kube_namespace       the namespace every object of the stack lives in (required; a DNS label)
    kube_image           the engine image: one for every role, or {"prefill": ..., "decode": ..., "router": ...}
    kube_shape           "deployments" (default: one Deployment per service, as llm-d's kustomize variant
                         patches `prefill` and `decode`) or "disaggregatedset" (prefill and decode as the
                         roles of one LWS DisaggregatedSet, as llm-d's guide does; the router a Deployment)
    <role>_kube          {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}, "node_selector": {...},
                         "service_account": "..."}: each pod of the role; replicas default 1
    kubeconfig           the kubeconfig kubectl reads on that host (default: kubectl's own: $KUBECONFIG, ~/.kube/config)
    kube_context         the context in it (default: its current context)
    kubectl              kubectl's path on that host (default "kubectl")
    kube_timeout         seconds each kubectl call may take (default 30): an API server that does not
                         answer fails the deploy with one line instead of hanging it
    kube_rollout_timeout seconds a role's rollout may take before its gate fails (default 900)
    kube_manifests       the folder of the repo the manifests are written to (`knobkeeper render --write`,
                         for Argo CD or Flux; `check` compares them), default manifests/<inventory>
    kube_version         the Kubernetes version whose strict schemas `check` validates against (default
                         knobkeeper/deploy/kube/validate.py's)

A role's services are the workloads: `role_decode = {"services": ["knobkeeper-decode"]}` makes one
Deployment `knobkeeper-decode`; more pods of it are `decode_kube = {"replicas": N}`, not more services.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from knobkeeper.errors import UserError

MANAGER = "kubernetes"
SHAPES = ("deployments", "disaggregatedset")
ROLE_KEYS = ("replicas", "resources", "node_selector", "service_account")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PATH = re.compile(r"^[^\s]+$")


@dataclass(frozen=True)
class RoleSpec:
    """What each pod of one role gets."""

    replicas: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None


@dataclass(frozen=True)
class Settings:
    host: str  # the inventory host kubectl runs on
    inventory: str
    namespace: str
    shape: str
    images: dict[str, str]  # role -> image
    roles: dict[str, RoleSpec]
    prefix: str
    manifests_dir: str  # repo-relative
    kubeconfig: str | None = None
    context: str | None = None
    kubectl: str = "kubectl"
    timeout: float = 30.0
    rollout_timeout: float = 900.0
    kube_version: str | None = None

    @property
    def upload_dir(self) -> str:
        """Where the deploy puts the manifests on the kubectl host before it applies them."""
        return f"{self.prefix}/kubernetes"

    def manifest_path(self, role: str) -> str:
        return f"{self.manifests_dir}/{role}.yaml"


def _where(stack: Any, host: str) -> str:
    return f"inventory {stack.inventory}, host {host}"


def _dns_label(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not DNS_LABEL.match(value):
        raise UserError(f"{where}: data {key} = {value!r}: expected a DNS label (lower-case letters, digits and "
                        f"'-', at most 63, starting and ending with a letter or digit)")
    return value


def _image(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise UserError(f"{where}: data {key} = {value!r}: expected an image reference such as "
                        f"\"lmsysorg/sglang:v0.5.23\"")
    return value


def _seconds(where: str, key: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UserError(f"{where}: data {key} = {value!r}: expected a number of seconds above 0")
    return float(value)


def _role_spec(where: str, role: str, spec: Any) -> RoleSpec:
    key = f"{role}_kube"
    if spec is None:
        return RoleSpec()
    if not isinstance(spec, Mapping):
        raise UserError(f"{where}: data {key} = {spec!r}: expected a dict such as {{\"replicas\": 2, \"resources\": "
                        f"{{\"limits\": {{\"nvidia.com/gpu\": 8}}}}}}")
    unknown = sorted(set(spec) - set(ROLE_KEYS))
    if unknown:
        raise UserError(f"{where}: data {key}[{unknown[0]!r}]: no such key (keys: {', '.join(ROLE_KEYS)})")
    replicas = spec.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise UserError(f"{where}: data {key}['replicas'] = {replicas!r}: expected a whole number (0 or more)")
    resources = spec.get("resources") or {}
    if not isinstance(resources, Mapping) or set(resources) - {"limits", "requests"} or not all(
            isinstance(v, Mapping) for v in resources.values()):
        raise UserError(f"{where}: data {key}['resources'] = {resources!r}: expected {{\"limits\": {{...}}, "
                        f"\"requests\": {{...}}}}")
    selector = spec.get("node_selector") or {}
    if not isinstance(selector, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise UserError(f"{where}: data {key}['node_selector'] = {selector!r}: expected {{\"label\": \"value\"}}")
    account = spec.get("service_account")
    if account is not None:
        _dns_label(where, f"{key}['service_account']", account)
    return RoleSpec(replicas=replicas, resources={k: dict(v) for k, v in resources.items()},
                    node_selector=dict(selector), service_account=account)


def settings_of(stack: Any) -> Settings:
    """The Settings of a Kubernetes stack: exactly one host (where kubectl runs), every role's spec."""
    hosts = [plan for plan in stack.hosts.values() if plan.manager == MANAGER]
    others = [plan.name for plan in stack.hosts.values() if plan.manager != MANAGER]
    if others or len(hosts) != 1:
        raise UserError(f"inventory {stack.inventory}: a Kubernetes stack is applied from ONE host (where kubectl "
                        f"runs, in every role's group; service_manager = \"kubernetes\"), not {', '.join(sorted(stack.hosts))}")
    plan = hosts[0]
    data = plan.data
    where = _where(stack, plan.name)
    for key in data:
        if key.endswith("_workers") and key[:-len("_workers")] in stack.roles:
            raise UserError(f"{where}: data {key}: a Kubernetes role's pods are its workload's replicas; use "
                            f"{key[:-len('_workers')]}_kube = {{\"replicas\": N}}")
    namespace = _dns_label(where, "kube_namespace", data.get("kube_namespace"))
    shape = data.get("kube_shape") or "deployments"
    if shape not in SHAPES:
        raise UserError(f"{where}: data kube_shape = {shape!r}: expected one of {', '.join(SHAPES)}")
    image = data.get("kube_image")
    if isinstance(image, Mapping):
        missing = [r for r in stack.order if r not in image]
        if missing:
            raise UserError(f"{where}: data kube_image[{missing[0]!r}]: missing (an image per role, or one for all)")
        images = {r: _image(where, f"kube_image[{r!r}]", image[r]) for r in stack.order}
    else:
        images = {r: _image(where, "kube_image", image) for r in stack.order}
    for svc in plan.services:
        _dns_label(where, f"role_{svc.role}['services']", svc.name)
    manifests = data.get("kube_manifests") or f"manifests/{stack.inventory}"
    if not isinstance(manifests, str) or manifests.startswith("/") or ".." in manifests.split("/") \
            or not _PATH.match(manifests):
        raise UserError(f"{where}: data kube_manifests = {manifests!r}: expected a folder of the repo, relative, "
                        f"without spaces (e.g. manifests/prod)")
    for key in ("kubeconfig", "kubectl", "kube_context", "kube_version"):
        value = data.get(key)
        if value is not None and (not isinstance(value, str) or not _PATH.match(value)):
            raise UserError(f"{where}: data {key} = {value!r}: expected a string without spaces")
    return Settings(
        host=plan.name, inventory=stack.inventory, namespace=namespace, shape=shape, images=images,
        roles={r: _role_spec(where, r, data.get(f"{r}_kube")) for r in stack.order}, prefix=plan.prefix,
        manifests_dir=manifests.rstrip("/"), kubeconfig=data.get("kubeconfig"), context=data.get("kube_context"),
        kubectl=str(data.get("kubectl") or "kubectl"),
        timeout=_seconds(where, "kube_timeout", data.get("kube_timeout"), 30.0),
        rollout_timeout=_seconds(where, "kube_rollout_timeout", data.get("kube_rollout_timeout"), 900.0),
        kube_version=data.get("kube_version"),
    )
