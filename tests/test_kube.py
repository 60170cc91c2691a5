"""The Kubernetes target offline (knobkeeper/deploy/kube/): what its manifests say and what rolls.
No API server: render, validate, plan's words, the GitOps files, bad input. The real API server is
tests/test_kube_deploy.py's.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from knobkeeper.deploy import canary_state, repo_files
from knobkeeper.deploy.kube.live import decide, Live, template_changes
from knobkeeper.deploy.kube.manifests import DIGEST, KNOBS, objects_of
from knobkeeper.deploy.render import Source, render_stack, strip_header
from knobkeeper.deploy.stack import load_stack
from knobkeeper.deploy.target import target_of
from knobkeeper.errors import UserError
from tests.infra import cli, git, kk, make_infra_repo, one_line_exit_2, snapshot

INV = "inventory/example_k8s.py"
KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
ROLES = ("prefill", "decode", "router")

# The pod-template digest of each role of inventory/example_k8s.py with no knob declared. A change
# of one of these is a roll of every pod of that role in every cluster on its next deploy: a change
# to the manifests' shape must mean to do that (and say so in its commit), never do it by accident.
GOLDEN = {
    "prefill": "sha256:6f477988af885671",
    "decode": "sha256:08ac41598e5bad3c",
    "router": "sha256:3eaf62d387fe79ed",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_infra_repo(tmp_path_factory.mktemp("kube"))


@pytest.fixture
def fresh(short_tmp):
    """A repo of its own for a test that commits or edits files (the module's `project` is shared):
    conftest's `project`, which this module's name hides."""
    return make_infra_repo(short_tmp)


def rendered(project, data=None, **kwargs):
    stack = load_stack(project.root, INV, data)
    return stack, render_stack(project, stack, **kwargs)


def by_role(stack, out):
    return {svc.role: out[(svc.host, svc.name)] for svc in stack.services}


def deployment(entry):
    return next(d for d in objects_of(next(iter(entry.files.values()))) if d["kind"] == "Deployment")


def test_each_role_is_a_service_and_a_deployment_whose_pods_get_the_knobs_as_env(project):
    stack, out = rendered(project, knob_overrides={"decode": {KNOB: 512}})
    roles = by_role(stack, out)
    assert target_of(stack).kind == "kubernetes"
    for role, entry in roles.items():
        (path,) = entry.files
        assert path == f"manifests/example_k8s/{role}.yaml"
        kinds = [(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in objects_of(entry.files[path])]
        assert kinds == [("Service", f"knobkeeper-{role}", "llm"), ("Deployment", f"knobkeeper-{role}", "llm")]
    decode = deployment(roles["decode"])["spec"]["template"]
    container = decode["spec"]["containers"][0]
    assert {"name": KNOB, "value": "512"} in container["env"]
    assert json.loads(decode["metadata"]["annotations"][KNOBS]) == {KNOB: "override (A/B run)"}
    assert container["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    # Peers by their Service names, not by the kubectl host's address.
    router = deployment(roles["router"])["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "http://knobkeeper-prefill.llm.svc:30000" in router and "http://knobkeeper-decode.llm.svc:30001" in router
    assert KNOB not in json.dumps(deployment(roles["prefill"]))


def test_golden_the_pod_template_digest_of_each_role(project):
    stack, out = rendered(project)
    digests = {role: e.digest for role, e in by_role(stack, out).items()}
    assert digests == GOLDEN, "the pod templates changed: every pod of these roles rolls on the next deploy"


def test_a_decode_knob_rolls_decode_only_and_replicas_or_a_new_commit_roll_nothing(project):
    stack, base = rendered(project)
    base = by_role(stack, base)
    _, knob = rendered(project, knob_overrides={"decode": {KNOB: 512}})
    knob = by_role(stack, knob)
    assert {r for r in ROLES if knob[r].digest != base[r].digest} == {"decode"}
    # The whole decode_kube as the inventory has it, replicas changed (data replaces a key's value whole).
    _, scaled = rendered(project, data={"decode_kube": {"replicas": 7, "resources": {"limits": {"nvidia.com/gpu": 8}}}})
    scaled = by_role(stack, scaled)
    assert all(scaled[r].digest == base[r].digest for r in ROLES)
    assert deployment(scaled["decode"])["spec"]["replicas"] == 7
    # The source commit is in the header only: a commit that changes nothing a pod sees changes no object.
    _, later = rendered(project, source=Source("f" * 40))
    later = by_role(stack, later)
    for r in ROLES:
        assert later[r].files != base[r].files
        assert strip_header(next(iter(later[r].files.values()))) == strip_header(next(iter(base[r].files.values())))
    # What plan says of each, from the live template (here: the base render as the live one).
    live = {r: Live(deployment={**deployment(base[r]), "metadata": {"name": r, "generation": 1}}) for r in ROLES}
    said = {r: decide(live[r], deployment(knob[r]), "changed") for r in ROLES}
    assert said["prefill"][0] == said["router"][0] == "unchanged"
    assert said["decode"][0] == "restart" and f"{KNOB}: live (unset), declared 512" in said["decode"][1]
    action, why, _ = decide(live["decode"], deployment(scaled["decode"]), "changed")
    assert action == "unchanged" and "replicas 2 -> 7 (scaling rolls nothing)" in why


def test_a_hand_edit_of_the_live_env_is_a_roll_back_to_the_declared_one(project):
    stack, out = rendered(project)
    want = deployment(by_role(stack, out)["decode"])
    edited = json.loads(json.dumps(want))
    edited["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": KNOB, "value": "64"})
    assert edited["spec"]["template"]["metadata"]["annotations"][DIGEST] == want["spec"]["template"]["metadata"]["annotations"][DIGEST]
    action, why, changes = decide(Live(deployment=edited), want, "changed")
    assert action == "restart" and why.startswith("its live pod template was edited by hand")
    assert changes == [f"{KNOB}: live 64, declared (unset)"]
    assert template_changes(edited["spec"]["template"], want["spec"]["template"]) == changes


def test_the_manifests_pass_strict_validation_and_a_server_would_take_them(project):
    stack, out = rendered(project)
    files = {p: t for e in out.values() for p, t in e.files.items()}
    assert target_of(stack).lint(files) == []
    for text in files.values():
        for doc in objects_of(text):
            assert yaml.safe_load(yaml.safe_dump(doc)) == doc


@pytest.mark.parametrize("data, words", [
    ({"kube_namespace": "Prod_NS"}, "data kube_namespace = 'Prod_NS': expected a DNS label"),
    ({"kube_image": None}, "data kube_image = None: expected an image reference"),
    ({"kube_image": {"prefill": "a:1"}}, "data kube_image['decode']: missing"),
    ({"kube_shape": "helm"}, "data kube_shape = 'helm': expected one of deployments"),
    ({"decode_kube": {"replicaz": 2}}, "data decode_kube['replicaz']: no such key"),
    ({"decode_kube": {"replicas": "two"}}, "data decode_kube['replicas'] = 'two': expected a whole number"),
    ({"decode_workers": 2}, "data decode_workers: a Kubernetes role's pods are its workload's replicas"),
    ({"kube_manifests": "/abs"}, "data kube_manifests = '/abs': expected a folder of the repo"),
])
def test_bad_kubernetes_data_is_one_line_naming_the_key(project, data, words):
    with pytest.raises(UserError) as exc:
        rendered(project, data=data)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_knob_value_a_process_environment_cannot_carry_is_refused_where_it_renders(project):
    big = "x" * (128 * 1024)
    with pytest.raises(UserError) as exc:
        rendered(project, knob_overrides={"decode": {"KNOBKEEPER_SIM_EXTRA_ARGS": big}})
    assert "knob KNOBKEEPER_SIM_EXTRA_ARGS" in str(exc.value) and "MAX_ARG_STRLEN" in str(exc.value)


def test_check_names_a_wrong_field_in_a_rendered_and_in_a_committed_manifest(fresh):
    project = fresh
    assert kk(project, "check").exit_code == 0
    # Rendered: data that settings accepts and the schema does not (a quantity must be a string or number).
    inv = project.root / INV
    inv.write_text(inv.read_text().replace('"router_kube": {"replicas": 1, "resources": {"requests": {"cpu": "2"',
                                           '"router_kube": {"replicas": 1, "resources": {"requests": {"cpu": {"n": 2}'))
    result = kk(project, "check")
    assert result.exit_code == 1
    assert ("manifests/example_k8s/router.yaml: as inventory/example_k8s.py renders it: line" in result.output
            and "spec.template.spec.containers[0].resources.requests.cpu" in result.output), result.output
    git(project.root, "checkout", "--", INV)
    # Committed: a typo'd field in the file Argo CD would apply.
    path = project.root / "manifests/example_k8s/decode.yaml"
    path.write_text(path.read_text().replace("        env:\n", "        envv:\n", 1))
    result = kk(project, "check")
    assert result.exit_code == 1
    assert ("manifests/example_k8s/decode.yaml: committed copy: line" in result.output
            and "containers[0].envv: not a field of Container" in result.output), result.output
    assert "differs from what inventory/example_k8s.py renders" in result.output


def test_a_knob_change_commits_the_manifests_it_changes_in_the_same_commit(fresh):
    project = fresh
    result = kk(project, "set", f"{KNOB}=512", "--role", "decode", "--reason", "A/B +12.8% @64", "--allow-undeclared")
    assert result.exit_code == 0, result.output
    changed = set(git(project.root, "show", "--name-only", "--format=", "HEAD").split())
    assert {"manifests/example_k8s/decode.yaml", "manifests/local_k8s/decode.yaml", "inventory/knobs.toml"} <= changed
    assert not {p for p in changed if p.startswith("manifests/") and not p.endswith("decode.yaml")}
    text = (project.root / "manifests/example_k8s/decode.yaml").read_text()
    entry = next(p for p in changed if p.startswith("changelog/entries/")).rsplit("-", 1)[1].removesuffix(".toml")
    assert f"entry {entry}" in text and "value: '512'" in text
    assert kk(project, "check").exit_code == 0
    assert repo_files.stale(project, INV) == []


def test_render_prints_or_writes_the_repo_files_and_refuses_a_target_that_keeps_none(fresh):
    project = fresh
    printed = kk(project, "render", INV)
    assert printed.exit_code == 0 and printed.output.count("kind: Deployment") == 3
    (project.root / "manifests/example_k8s/router.yaml").unlink()
    written = kk(project, "render", INV, "--write", "--json")
    assert json.loads(written.output)["files"] == {"manifests/example_k8s/decode.yaml": "up to date",
                                                   "manifests/example_k8s/prefill.yaml": "up to date",
                                                   "manifests/example_k8s/router.yaml": "written"}
    # Written as committed but for the header's source line (the commit that will hold it is not known yet).
    assert repo_files.stale(project, INV) == []
    one_line_exit_2(cli(project, "render", "inventory/local.py"), "keeps no rendered file in the repo")


def test_the_record_keeps_what_each_workload_rolled_to(tmp_path):
    from knobkeeper.deploy.record import DeployRecord, KubeApply, KubeRecord

    record = DeployRecord(id="x", inventory="k", inventory_path=INV, commit="c", dirty=False, allow_dirty=False,
                          options={}, order=list(ROLES), started_at="2026-12-04T00:00:00Z",
                          kubernetes=KubeRecord(namespace="llm", nodes=0, applies=[
                              KubeApply(role="decode", service="knobkeeper-decode", decision="rolls",
                                        revision_before=1, revision=2, replica_set="knobkeeper-decode-abc",
                                        rollout="applied; rollout not observable: no nodes")]))
    again = DeployRecord.from_json(json.loads(record.text()))
    assert again.kubernetes == record.kubernetes
    assert dataclasses.asdict(again.kubernetes.applies[0])["revision"] == 2


def test_a_canary_on_a_kubernetes_stack_is_refused_in_words_before_anything_runs(project):
    from knobkeeper.evidence.canary import canary

    before = snapshot(project)
    with pytest.raises(UserError) as exc:
        canary(project, "SGLANG_DISAGGREGATION_QUEUE_SIZE=8", role="decode", inventory=INV)
    assert str(exc.value).startswith(f"canary: {INV}: its roles' pods share one pod template per Deployment")
    assert snapshot(project) == before and canary_state.read_marker(project) is None
