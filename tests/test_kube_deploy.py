"""The Kubernetes target against a real API server (tests/kube.py: kube-apiserver and
kube-controller-manager 1.20.2, etcd): `knobkeeper deploy inventory/local_k8s.py` applies the stack
role by role, a decode knob makes a new decode ReplicaSet and none for prefill or the router, its
revert goes back to the first ReplicaSet, `status` sees a hand edit, a failed gate rolls back, bad
input is one line with nothing applied.

What this control plane cannot show: no pod runs (no scheduler, kubelet or runtime), so each gate
says "applied; rollout not observable: no nodes" (asserted), and the failed gate is made by a Node
object that no kubelet backs: pods wait for a scheduler that never comes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.kube.ops import NO_NODES
from knobkeeper.deploy.options import DeployOptions
from knobkeeper.deploy.plan import restart_plan
from knobkeeper.deploy.status import stack_status
from tests.infra import git, kk, make_infra_repo
from tests.kube import BUILD_WAIT_TIMEOUT_S, kube_cluster  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.timeout(BUILD_WAIT_TIMEOUT_S)

INV = "inventory/local_k8s.py"
NS = "knobkeeper-local"
KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
NAMES = {"prefill": "knobkeeper-prefill", "decode": "knobkeeper-decode", "router": "knobkeeper-router"}
HASH = "pod-template-hash"


class Site:
    def __init__(self, project, cluster):
        self.project, self.cluster = project, cluster

    def deploy(self, **kwargs):
        kwargs.setdefault("timeout", 300)
        return run_deploy(self.project, INV, **kwargs)

    def kubectl(self, *args, check=True):
        return self.cluster.kubectl(*args, check=check)

    def replica_sets(self, role: str) -> dict[str, str]:
        """{pod-template-hash: revision} of the role's ReplicaSets."""
        out = json.loads(self.kubectl("get", "rs", "-n", NS, "-l", f"knobkeeper.dev/service={NAMES[role]}",
                                      "-o", "json").stdout)
        return {rs["metadata"]["labels"][HASH]: rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                for rs in out["items"]}

    def current_hash(self, role: str) -> str:
        """The pod-template-hash of the ReplicaSet of the Deployment's current revision."""
        dep = json.loads(self.kubectl("get", "deployment", NAMES[role], "-n", NS, "-o", "json").stdout)
        revision = dep["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        return next(h for h, r in self.replica_sets(role).items() if r == revision)


@pytest.fixture(scope="module")
def site(kube_cluster):
    tmp = Path(tempfile.mkdtemp(prefix="kk", dir="/tmp"))  # short: the repo's other inventories have sockets
    project = make_infra_repo(tmp)
    saved = os.environ.get("KNOBKEEPER_KUBECONFIG")
    os.environ["KNOBKEEPER_KUBECONFIG"] = kube_cluster.kubeconfig
    try:
        yield Site(project, kube_cluster)
    finally:
        kube_cluster.kubectl("delete", "namespace", NS, "--wait=false")
        shutil.rmtree(tmp, ignore_errors=True)
        if saved is None:
            os.environ.pop("KNOBKEEPER_KUBECONFIG", None)
        else:
            os.environ["KNOBKEEPER_KUBECONFIG"] = saved


@pytest.fixture(scope="module")
def first(site):
    """The stack's first deploy: created, each role one ReplicaSet, recorded."""
    result = site.deploy()
    assert result.ok, result.error
    return result


def test_the_first_deploy_creates_each_role_gated_and_recorded(site, first):
    record = first.record
    assert [r.action for r in record.services] == ["started"] * 3
    for row in record.services:
        assert row.gate.result == "unobservable" and row.gate.status.startswith(NO_NODES), row.gate
    kube = record.kubernetes
    assert kube.namespace == NS and kube.nodes == 0
    assert [(a.role, a.decision, a.revision, a.rollout) for a in kube.applies] == [
        (role, "created", 1, NO_NODES) for role in ("prefill", "decode", "router")]
    for a in kube.applies:
        assert a.replica_set.startswith(a.service + "-") and a.applied_at <= a.observed_at
    for role in NAMES:
        assert list(site.replica_sets(role).values()) == ["1"]
    # The record is committed, with its Kubernetes part, readable with plain git.
    assert "Kubernetes namespace knobkeeper-local:" in git(site.project.root, "log", "-1", "--format=%B")


def test_a_decode_knob_rolls_decode_only_and_its_revert_goes_back_to_the_first_replicaset(site, first):
    before = {role: site.current_hash(role) for role in NAMES}
    set_ = kk(site.project, "set", f"{KNOB}=512", "--role", "decode", "--reason", "A/B +12.8% @64",
              "--allow-undeclared")
    assert set_.exit_code == 0, set_.output
    plan = restart_plan(site.project, INV)
    assert plan["kubernetes"]["lines"][0] == f"kubernetes namespace {NS}: rolls decode"
    assert [s["action"] for r in plan["roles"] for b in r["batches"] for s in b] == ["unchanged", "restart", "unchanged"]
    rolled = site.deploy()
    assert rolled.ok, rolled.error
    assert [r.action for r in rolled.record.services] == ["unchanged", "restarted", "unchanged"]
    decode = rolled.record.kubernetes.apply_of(NAMES["decode"])
    assert (decode.decision, decode.revision_before, decode.revision) == ("rolls", 1, 2)
    assert f"{KNOB}: live (unset), declared 512" in rolled.record.service("@local", NAMES["decode"]).reason
    assert len(site.replica_sets("decode")) == 2 and site.current_hash("decode") != before["decode"]
    for role in ("prefill", "router"):
        assert site.replica_sets(role) == {before[role]: "1"}, role
    env = json.loads(site.kubectl("get", "deployment", NAMES["decode"], "-n", NS, "-o", "json").stdout)
    env = env["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": KNOB, "value": "512"} in env

    revert = kk(site.project, "revert", KNOB, "--role", "decode", "--reason", "suspect in INC-7")
    assert revert.exit_code == 0, revert.output
    back = site.deploy()
    assert back.ok, back.error
    # The first template again: the controller takes its ReplicaSet back as revision 3, makes no new one.
    assert site.current_hash("decode") == before["decode"]
    assert sorted(site.replica_sets("decode").values()) == ["2", "3"]
    assert back.record.kubernetes.apply_of(NAMES["decode"]).revision == 3


def test_a_replica_change_rolls_nothing_and_status_sees_a_hand_edit(site, first):
    sets = {role: site.replica_sets(role) for role in NAMES}
    scaled = site.deploy(extra_data={"decode_kube": {"replicas": 2}})
    assert scaled.ok, scaled.error
    assert "replicas 1 -> 2 (scaling rolls nothing)" in scaled.record.service("@local", NAMES["decode"]).reason
    assert {role: site.replica_sets(role) for role in NAMES} == sets
    assert [r.state for r in stack_status(site.project, INV, {"decode_kube": {"replicas": 2}})] == ["in sync"] * 3
    site.kubectl("set", "env", f"deployment/{NAMES['decode']}", "-n", NS, f"{KNOB}=64")
    rows = {r.service: r for r in stack_status(site.project, INV)}
    assert rows[NAMES["decode"]].state == "drifted"
    assert rows[NAMES["decode"]].differences == [f"{KNOB}: running 64, declared (unset)"]
    assert rows[NAMES["prefill"]].state == "in sync"
    fixed = site.deploy()
    assert fixed.ok, fixed.error
    assert fixed.record.service("@local", NAMES["decode"]).reason.startswith("its live pod template was edited by hand")
    assert [r.state for r in stack_status(site.project, INV)] == ["in sync"] * 3


def test_a_secret_knob_reaches_its_pods_from_a_secret_never_from_a_manifest(site, first, tmp_path):
    token = "hf_s3cr3t-value-" + "x" * 20
    (tmp_path / "token").write_text(token)
    done = kk(site.project, "set", "HF_TOKEN", "--role", "decode", "--reason", "gated weights",
              "--value-file", str(tmp_path / "token"))
    assert done.exit_code == 0, done.output
    for path in (site.project.root / "manifests").rglob("*.yaml"):
        assert token not in path.read_text()
    result = site.deploy()
    assert result.ok, result.error
    assert [r.action for r in result.record.services] == ["unchanged", "restarted", "unchanged"]
    secret = json.loads(site.kubectl("get", "secret", "local-k8s-decode-knobs", "-n", NS, "-o", "json").stdout)
    assert base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == token
    dep = json.loads(site.kubectl("get", "deployment", NAMES["decode"], "-n", NS, "-o", "json").stdout)
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "local-k8s-decode-knobs",
                                                                                  "key": "HF_TOKEN"}}}
    assert token not in json.dumps(dep) and "HF_TOKEN" in dep["spec"]["template"]["metadata"]["annotations"][
        "knobkeeper.dev/secret-fingerprints"]
    unset = kk(site.project, "unset", "HF_TOKEN", "--role", "decode", "--reason", "weights public now")
    assert unset.exit_code == 0, unset.output
    assert site.deploy().ok


def test_the_rendered_manifests_pass_the_servers_dry_run(site, first):
    for role in NAMES:
        done = site.kubectl("apply", "--server-side", "--dry-run=server", "-f",
                            str(site.project.root / f"manifests/local_k8s/{role}.yaml"), check=False)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("edit, words", [
    ("server", "the API server is unreachable on @local"),
    ("token", "the API server refused the credentials on @local"),
])
def test_an_unreachable_or_unauthorised_api_server_is_one_line_and_nothing_applied(site, first, tmp_path, edit, words):
    config = Path(site.cluster.kubeconfig).read_text()
    if edit == "server":
        config = config.replace(site.cluster.server, "https://127.0.0.1:9")
    else:
        config = config.replace(site.cluster.token, "not-the-token")
    bad = tmp_path / "kubeconfig"
    bad.write_text(config)
    sets = {role: site.replica_sets(role) for role in NAMES}
    head = git(site.project.root, "rev-parse", "HEAD")
    result = site.deploy(extra_data={"kubeconfig": str(bad)})
    assert not result.ok and result.returncode == 2, (result.returncode, result.error)
    assert words in result.error and "\n" not in result.error, result.error
    assert {role: site.replica_sets(role) for role in NAMES} == sets
    assert git(site.project.root, "rev-parse", "HEAD") == head


def test_zz_a_rollout_that_never_completes_fails_its_gate_and_rolls_back(site, first):
    """Last in the module: a Node object makes rollouts observable (and never complete: no scheduler)."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "kk-no-kubelet"}}
    site.cluster.kubectl("apply", "-f", "-", input=json.dumps(node), check=True)
    try:
        before = site.current_hash("decode")
        options = DeployOptions(only="decode", rollback=True, knob_overrides={"decode": {KNOB: 256}})
        result = site.deploy(options=options, extra_data={"kube_rollout_timeout": 3})
        assert not result.ok
        assert "gate failed: decode: Deployment knobkeeper-decode" in result.error
        # Whichever sees it first: the gate's own deadline, or the controller's progressDeadlineSeconds
        # (the manifest's, from the same kube_rollout_timeout).
        assert ("rollout not complete after 3 s" in result.error
                or "its controller says the rollout is stuck" in result.error), result.error
        assert "rolled back: `kubectl rollout undo` to revision" in result.error, result.error
        row = result.record.service("@local", NAMES["decode"])
        assert row.gate.result == "failed" and row.rollback.result == "rolled back"
        applied = result.record.kubernetes.apply_of(NAMES["decode"])
        assert applied.rolled_back_to == applied.revision_before and applied.rollout.startswith("failed:")
        deadline = time.monotonic() + 60
        while site.current_hash("decode") != before and time.monotonic() < deadline:
            time.sleep(0.5)
        assert site.current_hash("decode") == before
        # Nothing downstream was applied: the router's Deployment is as it was.
        assert result.record.service("@local", NAMES["router"]).gate.result in ("not-run", "skipped")
    finally:
        site.cluster.kubectl("delete", "node", "kk-no-kubelet", "--wait=false")
