"""The local Kubernetes control plane is a real one (tests/kube.py, knobkeeper/deploy/kube/): a
server-side apply stores a Deployment, the controller-manager makes its ReplicaSet, a changed pod
template makes a second one and `rollout undo` returns to the first, and the apiserver refuses an
object whose field has the wrong type. Pods stay Pending (no scheduler, no kubelet): not looked at.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.kube import BUILD_WAIT_TIMEOUT_S, kube_cluster  # noqa: F401  (the session fixture)

# The first test's setup may wait for the background build of kube-apiserver (tests/kube.py).
pytestmark = pytest.mark.timeout(BUILD_WAIT_TIMEOUT_S)

NS = "kk-kube-test"
# Generous: the controller-manager reacts within a second on an idle machine; CI is a busy 2-core box.
DEADLINE_S = 120.0
REVISION = "deployment.kubernetes.io/revision"


def manifest(name: str, replicas: object = 1, namespace: str = NS) -> str:
    """A Namespace of its own (unless "default") and a Deployment `name` in it."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
                  "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                           "template": {"metadata": {"labels": {"app": name}},
                                        "spec": {"containers": [{"name": "main", "image": "registry.invalid/kk:1"}]}}}}
    if namespace == "default":
        return json.dumps(deployment)
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, deployment]})


def revisions(cluster, name: str) -> dict[str, str]:
    """pod-template-hash -> revision of each ReplicaSet of deployment `name`."""
    done = cluster.kubectl("get", "rs", "-n", NS, "-l", f"app={name}", "-o", "json", check=True)
    return {rs["metadata"]["labels"]["pod-template-hash"]: rs["metadata"].get("annotations", {}).get(REVISION, "")
            for rs in json.loads(done.stdout)["items"]}


def wait_for(what: str, probe):
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {DEADLINE_S:g} s")
        time.sleep(0.5)


def test_deployment_rollout_and_undo(kube_cluster):
    c = kube_cluster
    c.kubectl("apply", "--server-side", "-f", "-", input=manifest("x"), check=True)

    first = wait_for("the first ReplicaSet", lambda: (r := revisions(c, "x")) and len(r) == 1 and r)
    (h1,) = first

    c.kubectl("set", "env", "-n", NS, "deployment/x", "K=V", check=True)
    both = wait_for("a second ReplicaSet after `set env`", lambda: (r := revisions(c, "x")) and len(r) == 2 and r)
    (h2,) = set(both) - {h1}
    assert both == {h1: "1", h2: "2"}

    c.kubectl("rollout", "undo", "-n", NS, "deployment/x", check=True)
    back = wait_for("the first ReplicaSet again after `rollout undo`",
                    lambda: (r := revisions(c, "x")).get(h1) == "3" and r)
    assert set(back) == {h1, h2}, back   # the old template's ReplicaSet came back: no third one
    template = json.loads(c.kubectl("get", "deploy", "x", "-n", NS, "-o", "json", check=True).stdout)["spec"]["template"]
    assert "env" not in template["spec"]["containers"][0], template


def test_server_refuses_a_wrongly_typed_field(kube_cluster):
    # --validate=false: kubectl's own schema check is off, so the refusal is the apiserver's.
    done = kube_cluster.kubectl("apply", "--dry-run=server", "--validate=false", "-f", "-",
                                input=manifest("y", replicas="two", namespace="default"))
    assert done.returncode != 0, done.stdout
    assert "Error from server (BadRequest)" in done.stderr and "Replicas" in done.stderr, done.stderr
    assert kube_cluster.kubectl("get", "deploy", "y", "-n", "default").returncode != 0   # a dry run stores nothing


def test_the_lws_crds_load_with_the_smallest_edit_and_their_objects_dry_run(kube_cluster):
    """The CRDs as published are refused by this 1.20 server; crd_for_server's edit makes them load, and
    a LeaderWorkerSet and a DisaggregatedSet the offline validator passes pass the server's dry run."""
    from knobkeeper.deploy.kube import validate as kv
    from tests.test_kube_validate import disaggregatedset, leaderworkerset

    if not all(kv._crd_path(c) is not None for c in kv._sources()):
        pytest.skip(f"the lws CRD files are not laid out here (looked in {', '.join(map(str, kv.crd_dirs()))})")
    c = kube_cluster
    published = kv.crd_manifests()
    refused = c.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": published}))
    assert refused.returncode != 0 and ("must be of type string" in refused.stderr
                                        or "x-kubernetes-validations" in refused.stderr), refused.stderr
    mended = kv.crd_manifests(server_minor=20)
    # Server-side: a client-side apply would store the whole CRD in an annotation (over 256 KiB: refused).
    c.kubectl("apply", "--server-side", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": mended}), check=True)
    deadline = time.monotonic() + DEADLINE_S
    names = [crd["metadata"]["name"] for crd in mended]
    while time.monotonic() < deadline:
        done = c.kubectl("wait", "--for=condition=Established", "--timeout=10s", *[f"crd/{n}" for n in names])
        if done.returncode == 0:
            break
        time.sleep(1)
    else:
        pytest.fail(f"CRDs not established: {done.stderr}")
    for doc in (leaderworkerset(), disaggregatedset()):
        assert kv.validate_docs([doc], source="pd.yaml") == []
        done = c.kubectl("apply", "--dry-run=server", "-n", "default", "-f", "-", input=json.dumps(doc))
        assert done.returncode == 0, done.stderr
