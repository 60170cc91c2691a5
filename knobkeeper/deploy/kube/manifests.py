"""A Kubernetes stack's manifests: one file per role (manifests/<inventory>/<role>.yaml), rendered from
the same knobs, catalog and changelog as every other target's files (deploy/render.py renders each
service first; this module turns what it rendered into objects). The file is the service's rendered
file: `review` diffs it, `check` validates it strictly and compares it with the committed copy, the
deploy applies it (server-side), `knobkeeper render --write` writes it for Argo CD or Flux.

    decode.yaml   # header: source commit, digest, the changelog entry behind each knob
                  Service knobkeeper-decode            (ports: http; prefill also its bootstrap port)
                  Deployment knobkeeper-decode         (replicas from decode_kube; its pod template:)
                      env         the knobs of the role, byte for byte as a launch script exports them,
                                  then the inventory's fixed environment; a secret knob from a Secret
                      command     the engine family's command line, peers by their Service names
                      annotations knobkeeper.dev/knobs: the changelog entry behind each knob;
                                  knobkeeper.dev/digest: the template's own digest

What rolls, and what does not (the rule `plan` and a golden test state): only what a pod sees is in
its template: its env, command, image, resources and the entries behind its knobs. The source commit
is in the file's header only (comments: no object carries it), so a new commit that changes nothing a
pod sees rolls nothing and leaves the committed manifests as they are, and `replicas` is outside the
template, so scaling rolls nothing (llm-d's users
saw the opposite: an injected variable changed the hash and rolled every role, dynamo #9366). A
knob of decode changes decode's template only: prefill and the router keep their ReplicaSets.

The template's digest (sha256 of its canonical JSON, before the digest annotation is added) is the
service's digest: `plan` compares it with the live template's annotation, and `status` also compares
the live env with the declared one (a `kubectl set env` by hand is drift, not a new declared state).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping

import yaml

from knobkeeper import fmt
from knobkeeper.deploy.engines import engine_command, workers_of
from knobkeeper.deploy.kube.settings import Settings, settings_of
from knobkeeper.deploy.observe import knob_differences
from knobkeeper.deploy.render import RenderedService
from knobkeeper.errors import UserError

GROUP = "knobkeeper.dev"
DIGEST = f"{GROUP}/digest"
KNOBS = f"{GROUP}/knobs"
SECRETS = f"{GROUP}/secret-fingerprints"
SERVICE = f"{GROUP}/service"
CONTAINER = "engine"
# Linux's MAX_ARG_STRLEN: one "NAME=value" string of a process's environment is at most 128 KiB
# (execve fails with E2BIG above it), whatever Kubernetes stores.
MAX_ENV_STRING = 131072
# The API server refuses a request over etcd's 1.5 MiB; a manifest of one role stays well under it.
MAX_MANIFEST = 1024 * 1024


def required_crds(shape: str) -> list[str]:
    """The CRDs a shape's objects need on the API server (the deploy checks before it applies)."""
    return {"deployments": []}.get(shape, [])


def labels_of(stack: Any, svc: Any) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "knobkeeper",
        "app.kubernetes.io/instance": (stack.stack or stack.inventory)[:63],
        "app.kubernetes.io/component": svc.role,
        "app.kubernetes.io/managed-by": "knobkeeper",
        SERVICE: svc.name,
    }


def selector_of(stack: Any, svc: Any) -> dict[str, str]:
    return {"app.kubernetes.io/instance": (stack.stack or stack.inventory)[:63], SERVICE: svc.name}


def in_cluster(svc: Any, settings: Settings) -> Any:
    """The service as its peers reach it in the cluster: its Service's name in the namespace."""
    return dataclasses.replace(svc, address=f"{svc.name}.{settings.namespace}.svc", listen_host="0.0.0.0")


def kube_commands(stack: Any) -> dict[tuple[str, str], list[str]]:
    """Every service's engine command as its container runs it: peers by Service name (the engine
    families build the commands; only the addresses they are given differ)."""
    settings = settings_of(stack)
    placed = [in_cluster(svc, settings) for svc in stack.services]
    workers = workers_of(placed)
    return {(svc.host, svc.name): engine_command(svc, stack.hosts[svc.host].data, workers) for svc in placed}


def template_digest(template: Mapping[str, Any]) -> str:
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def entry_words(provenance: str) -> str:
    """'entry 1a2b3c4d (set 2026-12-01 by ana)' -> 'entry 1a2b3c4d': what the pod template carries
    (the id names the entry; its time and author are in the header and in git)."""
    return provenance.split(" (", 1)[0] if provenance.startswith("entry ") else provenance


def knob_secret_name(stack: Any, role: str) -> str:
    return f"{(stack.stack or stack.inventory).replace('_', '-')[:40]}-{role}-knobs".lower()


def check_env(svc: Any, environment: Mapping[str, str]) -> None:
    for name, value in environment.items():
        if "\0" in value:
            raise UserError(f"{svc.key}: knob {name}: a value with a NUL byte cannot be an environment variable")
        size = len(name.encode()) + 1 + len(value.encode()) + 1
        if size > MAX_ENV_STRING:
            raise UserError(f"{svc.key}: knob {name}: {size} bytes as NAME=value; a process's environment takes "
                            f"at most {MAX_ENV_STRING} bytes per variable (Linux MAX_ARG_STRLEN)")


def ports_of(svc: Any) -> list[tuple[str, int]]:
    """(name, port) of everything the service listens on: http, prefill's bootstrap, the router's
    metrics, the family's per-instance ports (an IANA_SVC_NAME: at most 15 characters, no '_')."""
    out = [("http", svc.port)]
    if svc.bootstrap_port:
        out.append(("bootstrap", svc.bootstrap_port))
    if svc.metrics_port:
        out.append(("metrics", svc.metrics_port))
    return out + [(name.replace("_", "-")[:15], port) for name, port in svc.ports]


def pod_template(stack: Any, settings: Settings, svc: Any, rendered: RenderedService,
                 command: list[str]) -> dict[str, Any]:
    """The pod template of one service: everything its pods see, and nothing else."""
    check_env(svc, rendered.environment)
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in rendered.environment.items()]
    secret_knobs = sorted({knob for _, knob in rendered.secrets.values()})
    env += [{"name": knob, "valueFrom": {"secretKeyRef": {"name": knob_secret_name(stack, svc.role), "key": knob}}}
            for knob in secret_knobs]
    spec = settings.roles[svc.role]
    # protocol spelled out: it is a key of these lists for server-side apply, and an API server before
    # 1.20.? refuses an apply whose element omits it ("associative list ... omits key field protocol").
    ports = [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in ports_of(svc)]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.images[svc.role],
        "command": [str(a) for a in command],
        "env": env,
        "ports": ports,
        "readinessProbe": {"httpGet": {"path": svc.health_path, "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3},
    }
    if spec.resources:
        container["resources"] = spec.resources
    annotations = {KNOBS: json.dumps({n: entry_words(p) for n, p in sorted(rendered.provenance.items())},
                                     sort_keys=True)}
    if secret_knobs:
        # A new secret value changes no manifest text; its fingerprint in the template rolls the role.
        annotations[SECRETS] = json.dumps({k: rendered.knobs[k] for k in secret_knobs}, sort_keys=True)
    pod_spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": svc.stop_timeout}
    if spec.node_selector:
        pod_spec["nodeSelector"] = spec.node_selector
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    template = {"metadata": {"labels": labels_of(stack, svc), "annotations": annotations}, "spec": pod_spec}
    template["metadata"]["annotations"][DIGEST] = template_digest(template)
    return template


def service_object(stack: Any, settings: Settings, svc: Any) -> dict[str, Any]:
    ports = [{"name": name, "port": port, "targetPort": name, "protocol": "TCP"} for name, port in ports_of(svc)]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc.name, "namespace": settings.namespace, "labels": labels_of(stack, svc)},
            "spec": {"selector": selector_of(stack, svc), "ports": ports}}


def deployment_object(stack: Any, settings: Settings, svc: Any, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": svc.name, "namespace": settings.namespace, "labels": labels_of(stack, svc)},
        "spec": {
            "replicas": settings.roles[svc.role].replicas,
            "selector": {"matchLabels": selector_of(stack, svc)},
            # A serving role never has fewer ready pods than its replicas while it rolls.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": int(settings.rollout_timeout),
            "template": template,
        },
    }


def header_lines(stack: Any, svc: Any, rendered: RenderedService, source: Any, digest: str,
                 settings: Settings) -> list[str]:
    lines = [f"{svc.name} (role {svc.role}) of inventory {stack.inventory}, namespace {settings.namespace}: rendered "
             f"by knobkeeper; edit knobs.toml and run `knobkeeper render --write`, not this file",
             f"source: {source.label}", f"digest: {digest}"]
    lines += [f"knob {n}: {' '.join(p.split()) or 'declared, no changelog entry'}"
              for n, p in sorted(rendered.provenance.items())]
    return lines


def dump(docs: list[dict[str, Any]], header: list[str]) -> str:
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False, width=10**6,
                                       allow_unicode=True) for d in docs)
    return "".join(f"# {line}\n" for line in header) + "\n" + body


def render_manifests(project: Any, stack: Any, rendered: Mapping[tuple[str, str], RenderedService],
                     source: Any) -> dict[tuple[str, str], RenderedService]:
    """Each service's rendered entry with its role's manifest file in place of a launch script:
    files {manifests/<inventory>/<role>.yaml: text}, digest the pod template's."""
    settings = settings_of(stack)
    commands = kube_commands(stack)
    out: dict[tuple[str, str], RenderedService] = {}
    for role in stack.order:
        services = [svc for svc in stack.services if svc.role == role]
        docs: list[dict[str, Any]] = []
        header: list[str] = []
        digests = {}
        for svc in services:
            want = rendered[(svc.host, svc.name)]
            template = pod_template(stack, settings, svc, want, commands[(svc.host, svc.name)])
            digests[svc.name] = template["metadata"]["annotations"][DIGEST]
            docs += [service_object(stack, settings, svc), deployment_object(stack, settings, svc, template)]
            header += header_lines(stack, svc, want, source, digests[svc.name], settings)
        path = settings.manifest_path(role)
        text = dump(docs, header)
        if len(text.encode()) > MAX_MANIFEST:
            raise UserError(f"{path}: {len(text.encode())} bytes; the API server takes at most {MAX_MANIFEST} "
                            f"in one object (etcd's limit): its largest knob value is too large for Kubernetes")
        for svc in services:
            want = rendered[(svc.host, svc.name)]
            out[(svc.host, svc.name)] = dataclasses.replace(
                want, files={path: text}, modes={path: "0644"}, digest=digests[svc.name], templates={}, reviewed={},
                describe=manifest_changes)
    return out


def objects_of(text: str) -> list[dict[str, Any]]:
    """The objects of a rendered manifest file (its header is YAML comments)."""
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


# --- what a pod template says, and what differs between two ------------------------------------------

def container_of(template: Mapping[str, Any]) -> dict[str, Any]:
    containers = (template.get("spec") or {}).get("containers") or []
    return next((c for c in containers if c.get("name") == CONTAINER), containers[0] if containers else {})
def env_of(template: Mapping[str, Any]) -> dict[str, str]:
    """{NAME: value} of the engine container; a variable from a Secret as '(Secret NAME key KEY)'."""
    out = {}
    for item in container_of(template).get("env") or []:
        if "value" in item:
            out[item["name"]] = str(item["value"])
        elif "valueFrom" in item:
            ref = (item["valueFrom"] or {}).get("secretKeyRef") or {}
            out[item["name"]] = f"(Secret {ref.get('name')} key {ref.get('key')})"
        else:
            out[item["name"]] = ""
    return out
def template_changes(live: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    """What differs between two pod templates, in words: each variable, the image, the command."""
    out = [line.replace(": running ", ": live ") for line in knob_differences(env_of(want), env_of(live))]
    live_c, want_c = container_of(live), container_of(want)
    if live_c.get("image") != want_c.get("image"):
        out.append(f"image: live {live_c.get('image')}, declared {want_c.get('image')}")
    if live_c.get("command") != want_c.get("command"):
        out.append("command: " + fmt.safe(" ".join(str(a) for a in want_c.get("command") or [])))
    if live_c.get("resources") != want_c.get("resources") and (live_c.get("resources") or want_c.get("resources")):
        out.append(f"resources: live {json.dumps(live_c.get('resources') or {})}, "
                   f"declared {json.dumps(want_c.get('resources') or {})}")
    live_keys, want_keys = annotation_json(_ann(live, KNOBS)), annotation_json(_ann(want, KNOBS))
    if not out and live_keys != want_keys:
        out.append("the changelog entries behind its knobs")
    return out or ["its pod template"]
def _ann(template: Mapping[str, Any], key: str) -> Any:
    return ((template.get("metadata") or {}).get("annotations") or {}).get(key)
def annotation_json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def manifest_changes(old_text: str, new_text: str) -> list[str]:
    """What differs between two renders of one role's manifest, in the words `review` uses for a
    launch script ("knob SGLANG_SM120_MMA_TARGET_CTAS: set to 512 (was unset)"): each Deployment's
    pod template, then its replicas (which roll nothing)."""
    old = {d["metadata"]["name"]: d for d in objects_of(old_text) if d.get("kind") == "Deployment"}
    new = {d["metadata"]["name"]: d for d in objects_of(new_text) if d.get("kind") == "Deployment"}
    out: list[str] = []
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            out.append(f"Deployment {name}: {'new' if name not in old else 'no longer rendered'}")
            continue
        a, b = old[name]["spec"]["template"], new[name]["spec"]["template"]
        if a != b:
            knobs = set(annotation_json(_ann(a, KNOBS))) | set(annotation_json(_ann(b, KNOBS)))
            env_a, env_b = env_of(a), env_of(b)
            changed = [f"{'knob' if n in knobs else 'environment'} {n}: {fmt.change(env_a.get(n), env_b.get(n))}"
                       for n in sorted(set(env_a) | set(env_b)) if env_a.get(n) != env_b.get(n)]
            rest = [line for line in template_changes(a, b) if not line.startswith(tuple(f"{n}:" for n in env_a | env_b))]
            out += changed + [line for line in rest if line != "its pod template" or not changed]
        replicas = (old[name]["spec"].get("replicas"), new[name]["spec"].get("replicas"))
        if replicas[0] != replicas[1]:
            out.append(f"Deployment {name}: replicas {replicas[0]} -> {replicas[1]} (scaling rolls nothing)")
    return out
