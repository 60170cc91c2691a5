"""knobkeeper/deploy/kube/validate.py: strict offline validation of Kubernetes manifests.

Built-in kinds against kubernetes-validate's strict schemas; LeaderWorkerSet and DisaggregatedSet
against the lws CRDs that crds/SOURCES.toml names (tests marked `real_crds` skip where those files are
not laid out: see validate.py's docstring); the machinery of closing a CRD schema and of handing its
pod templates to the built-in PodTemplateSpec also on a small CRD made here, so it is tested
everywhere. No server, no network: the whole file takes about a second.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
import yaml

from knobkeeper.deploy.kube import validate as kv
from knobkeeper.deploy.kube.validate import Problem, crd_for_server, validate_docs, validate_yaml_text
from knobkeeper.errors import UserError

POD_SPEC = {"containers": [{"name": "engine", "image": "lmsysorg/sglang:v0.5.3",
                            "args": ["--port", "30000"], "env": [{"name": "SGLANG_X", "value": "1"}],
                            "ports": [{"containerPort": 30000, "name": "http"}],
                            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}


def pod_template(role: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": role}}, "spec": copy.deepcopy(POD_SPEC)}


def deployment(name: str = "decode") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "llm"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}, "template": pod_template(name)}}


def statefulset() -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "prefill"},
            "spec": {"replicas": 1, "serviceName": "prefill", "selector": {"matchLabels": {"app": "prefill"}},
                     "template": pod_template("prefill")}}


def service() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "decode"},
            "spec": {"selector": {"app": "decode"}, "ports": [{"name": "http", "port": 30000, "targetPort": "http"}]}}


def lws_template(role: str) -> dict[str, Any]:
    return {"size": 2, "leaderTemplate": pod_template(role), "workerTemplate": pod_template(role)}


def leaderworkerset() -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "decode"},
            "spec": {"replicas": 2, "leaderWorkerTemplate": lws_template("decode"),
                     "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxSurge": 1}}}}


def disaggregatedset() -> dict[str, Any]:
    # As the lws docs (site/content/en/docs/concepts/disaggregatedset) and config/samples have it.
    return {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet", "metadata": {"name": "pd"},
            "spec": {"roles": [{"name": role, "spec": {"replicas": 1, "leaderWorkerTemplate": lws_template(role)}}
                               for role in ("prefill", "decode")]}}


def messages(problems: list[Problem]) -> list[str]:
    return [str(p) for p in problems]


def test_good_builtin_kinds_pass():
    assert validate_docs([deployment(), statefulset(), service(), None], source="ok.yaml") == []


def test_a_typo_is_not_a_field_with_its_path():
    doc = deployment()
    doc["spec"]["template"]["spec"]["containers"][0]["envv"] = [{"name": "A", "value": "1"}]
    [p] = validate_docs([doc], source="manifests/decode.yaml", kube_version="1.31")
    assert p.path == "spec.template.spec.containers[0].envv"
    assert str(p) == ("manifests/decode.yaml: Deployment/decode: spec.template.spec.containers[0].envv: "
                      "not a field of Container, did you mean env? (strict schema of Kubernetes 1.31)")


def test_a_wrong_type_fails():
    doc = deployment()
    doc["spec"]["replicas"] = "two"
    [p] = validate_docs([doc], source="d.yaml")
    assert (p.path, p.message) == ("spec.replicas", "expected an integer, got a string 'two' "
                                                    f"(strict schema of Kubernetes {kv.DEFAULT_KUBE_VERSION})")


def test_every_error_of_a_document_and_missing_required_fields():
    doc = deployment()
    del doc["spec"]["selector"]
    doc["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    doc["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    paths = {p.path: p.message for p in validate_docs([doc], source="d.yaml")}
    assert set(paths) == {"spec.selector", "spec.template.spec.containers[0].imagePullPolicyy",
                          "spec.template.spec.containers[0].ports[0].containerPort"}
    assert paths["spec.selector"].startswith("missing: a required field of DeploymentSpec")


def test_unknown_kind_is_no_schema_never_a_pass():
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    # A custom group whose kind and version match a built-in file name is not that built-in kind either.
    fake = {**deployment(), "apiVersion": "apps.example.com/v1"}
    spec_type = {"apiVersion": "apps/v1", "kind": "DeploymentSpec", "metadata": {"name": "s"}}
    problems = validate_docs([widget, fake, spec_type], source="w.yaml")
    assert [p.obj for p in problems] == ["Widget/w", "Deployment/decode", "DeploymentSpec/s"]
    assert all(p.message.startswith("no schema for apiVersion ") for p in problems), messages(problems)


def test_documents_that_are_not_objects():
    docs = [["a"], {"kind": "Service", "metadata": {"name": "x"}}, {"apiVersion": "v1", "kind": "Service"}, "text"]
    problems = validate_docs(docs, source="x.yaml")
    assert [(p.obj, p.path) for p in problems] == [
        ("document 1", ""), ("Service/x", "apiVersion"), ("Service (document 3)", "metadata.name"), ("document 4", "")]


def test_yaml_syntax_error_names_the_line():
    text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n spec: {}\n"
    [p] = validate_yaml_text(text, "manifests/router.yaml")
    assert p.line == 5 and str(p).startswith("manifests/router.yaml:5: YAML syntax error: ")


def test_problems_name_the_line_of_the_field():
    doc = deployment()
    doc["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    text = yaml.safe_dump_all([service(), doc], sort_keys=False)
    [p] = validate_yaml_text(text, "d.yaml")
    assert text.splitlines()[p.line - 1].strip() == "envv: []"


def test_kube_version_outside_the_shipped_schemas_is_a_user_error():
    with pytest.raises(UserError, match=r"kube_version '1\.20'.*1\.25 \.\. 1\.37"):
        validate_docs([service()], source="s", kube_version="1.20")
    assert validate_docs([service()], source="s", kube_version="v1.37.2") == []


def test_a_field_newer_than_the_cluster_fails_on_the_older_schema():
    doc = deployment()
    doc["spec"]["template"]["spec"]["containers"][0]["resizePolicy"] = [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"}]  # Container.resizePolicy: Kubernetes 1.27
    assert validate_docs([doc], source="d", kube_version="1.27") == []
    [p] = validate_docs([doc], source="d", kube_version="1.26")
    assert p.path.endswith("containers[0].resizePolicy") and "not a field of Container" in p.message


# ---------------------------------------------------------------------------------------------------
# The machinery of CRD kinds, on a CRD made here (needs no fetched file)

GADGET_SCHEMA = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {
            "type": "object", "required": ["size"],
            "x-kubernetes-validations": [{"rule": "self.size > 0", "message": "size must be positive"}],
            "properties": {
                "size": {"type": "integer", "format": "int32"},
                "mode": {"type": "string", "default": ""},
                "secrets": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "properties": {"name": {"type": "string", "default": ""}}}},
                "note": {"type": "string", "nullable": True},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                         "properties": {"a": {"type": "string"}}},
                "template": {"type": "object", "properties": {
                    "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
                    "spec": {"type": "object", "properties": {"containers": {"type": "array"}}}}},
            },
        },
    },
}
GADGET_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
              "metadata": {"name": "gadgets.test.knobkeeper.dev"},
              "spec": {"group": "test.knobkeeper.dev", "scope": "Namespaced",
                       "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget", "listKind": "GadgetList"},
                       "versions": [{"name": "v1", "served": True, "storage": True,
                                     "schema": {"openAPIV3Schema": GADGET_SCHEMA}}]}}


def _clear_caches() -> None:
    for f in (kv._sources, kv._crd_index, kv._load_crd, kv._closed_schema, kv._crd_validator):
        f.cache_clear()


@pytest.fixture
def gadget_crds(tmp_path, monkeypatch):
    """SOURCES.toml and the CRD files read from tmp_path: one Gadget CRD."""
    data = yaml.safe_dump(GADGET_CRD).encode()
    (tmp_path / "gadgets.yaml").write_bytes(data)
    (tmp_path / "SOURCES.toml").write_text(
        '[[crd]]\nfile = "gadgets.yaml"\nrepo = "made here"\ncommit = "0000000000000000000000000000000000000000"\n'
        'path = "gadgets.yaml"\nversion = "test"\nname = "gadgets.test.knobkeeper.dev"\n'
        f'sha256 = "{hashlib.sha256(data).hexdigest()}"\ngroup = "test.knobkeeper.dev"\nkind = "Gadget"\n'
        'versions = ["v1"]\n')
    monkeypatch.setattr(kv, "SOURCES", tmp_path / "SOURCES.toml")
    monkeypatch.setenv(kv.CRDS_ENV, str(tmp_path))
    _clear_caches()
    yield tmp_path
    _clear_caches()


def gadget(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "test.knobkeeper.dev/v1", "kind": "Gadget", "metadata": {"name": "g"},
            "spec": {"size": 1, **spec}}


def test_crd_schema_closed_where_it_lists_properties(gadget_crds):
    good = gadget(mode="x", note=None, free={"a": "x", "anything": [1]},
                  template={"metadata": {"labels": {"a": "b"}}, "spec": copy.deepcopy(POD_SPEC)})
    assert validate_docs([good], source="g") == []
    problems = validate_docs([gadget(sizee=2, size="1"), {**gadget(), "metadata": {"name": "g", "lables": {}}}],
                             source="g")
    assert [(p.path, p.message) for p in problems] == [
        ("spec.size", "expected an integer, got a string '1' (the Gadget CRD of lws test)"),
        ("spec.sizee", "not a field of spec, did you mean size? (the Gadget CRD of lws test)"),
        ("metadata.lables", "not a field of ObjectMeta, did you mean labels? "
                            f"(strict schema of Kubernetes {kv.DEFAULT_KUBE_VERSION})")]
    [p] = validate_docs([{**gadget(), "apiVersion": "test.knobkeeper.dev/v2"}], source="g")
    assert p.path == "apiVersion" and "served as test.knobkeeper.dev/v1" in p.message


def test_crd_pod_templates_are_the_clusters_pod_template_spec(gadget_crds):
    template = {"metadata": {"labels": {"a": "b"}}, "spec": copy.deepcopy(POD_SPEC)}
    template["spec"]["containers"][0]["envv"] = []
    [p] = validate_docs([gadget(template=template)], source="g")
    assert (p.path, p.message) == ("spec.template.spec.containers[0].envv",
                                   "not a field of Container, did you mean env? "
                                   f"(strict schema of Kubernetes {kv.DEFAULT_KUBE_VERSION})")


def test_an_edited_crd_file_is_refused(gadget_crds):
    (gadget_crds / "gadgets.yaml").write_bytes((gadget_crds / "gadgets.yaml").read_bytes() + b"\n")
    [p] = validate_docs([gadget()], source="g")
    assert p.message.startswith("no schema: ") and "sha256" in p.message
    with pytest.raises(UserError, match="sha256"):
        kv.crd_manifests()


def test_a_missing_crd_file_is_a_problem_never_a_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(kv, "crd_dirs", lambda: [tmp_path])
    _clear_caches()
    try:
        [p] = validate_docs([leaderworkerset()], source="lws.yaml")
        with pytest.raises(UserError, match="is not here"):
            kv.crd_manifests()
    finally:
        _clear_caches()
    assert (p.obj, p.path) == ("LeaderWorkerSet/decode", "")
    assert p.message.startswith("no schema: the LeaderWorkerSet CRD file "
                                f"leaderworkerset.x-k8s.io_leaderworkersets.yaml is not here (looked in: {tmp_path})")


def _diff(before: Any, after: Any, path: tuple = ()) -> tuple[list, list]:
    """(removed, added): (path, value) of each dict key or list item in one and not the other; fails
    on any other difference (a changed scalar, a list whose first items differ)."""
    removed: list[tuple[tuple, Any]] = []
    added: list[tuple[tuple, Any]] = []
    if isinstance(before, dict):
        assert isinstance(after, dict), path
        removed += [(path + (k,), v) for k, v in before.items() if k not in after]
        added += [(path + (k,), v) for k, v in after.items() if k not in before]
        for k in set(before) & set(after):
            r, a = _diff(before[k], after[k], path + (k,))
            removed, added = removed + r, added + a
    elif isinstance(before, list):
        assert isinstance(after, list) and len(after) >= len(before), path
        added += [(path + (i,), v) for i, v in enumerate(after) if i >= len(before)]
        for i, (b, a) in enumerate(zip(before, after)):
            r, ad = _diff(b, a, path + (i,))
            removed, added = removed + r, added + ad
    else:
        assert before == after, path
    return removed, added


def _count(node: Any, pred) -> int:
    if isinstance(node, dict):
        return sum(pred(k, v) for k, v in node.items()) + sum(_count(v, pred) for v in node.values())
    if isinstance(node, list):
        return sum(_count(v, pred) for v in node)
    return 0


def _refused_by_1_20(key: str, value: Any) -> bool:
    return key == "x-kubernetes-validations" or (key == "default" and value == "")


def _check_for_1_20(crd: dict[str, Any]) -> tuple[int, int]:
    """crd_for_server(crd, 20) removes every CEL rule and empty default and nothing else, and adds
    only `required` entries: the list-map keys whose empty default went (what 1.20 then asks for)."""
    before = copy.deepcopy(crd)
    mended = crd_for_server(crd, 20)
    assert crd == before, "crd_for_server changed its argument"
    removed, added = _diff(crd, mended)
    assert removed and all(_refused_by_1_20(path[-1], value) for path, value in removed), removed
    assert len(removed) == _count(crd, _refused_by_1_20)
    lost_defaults = {path[:-1] for path, value in removed if path[-1] == "default"}  # (..., properties, key)
    for path, value in added:
        items = path[:path.index("required")] if "required" in path else None
        assert items is not None and items[-1] == "items", path
        keys = [value] if isinstance(value, str) else value
        list_schema = crd
        for part in items[:-1]:
            list_schema = list_schema[part]
        for key in keys:
            assert key in list_schema["x-kubernetes-list-map-keys"] and items + ("properties", key) in lost_defaults
    assert crd_for_server(crd, 26) == crd
    return len(removed), len(added)


def test_crd_for_server_removes_what_1_20_refuses_and_nothing_else():
    # What 1.20.2 said of the lws CRDs (kubectl create --dry-run=server): `x-kubernetes-validations`
    # unknown; each `default: ""` "Invalid value: null: must be of type string"; and without its
    # default, imagePullSecrets' `name` "is in x-kubernetes-list-map-keys, so it must have a default
    # or be a required property".
    assert _check_for_1_20(GADGET_CRD) == (3, 1)
    mended = crd_for_server(GADGET_CRD, 20)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert mended["properties"]["spec"]["properties"]["secrets"]["items"]["required"] == ["name"]
    removed, added = _diff(GADGET_CRD, crd_for_server(GADGET_CRD, 22))
    assert [p[-1] for p, _ in removed] == ["x-kubernetes-validations"] and added == []


# ---------------------------------------------------------------------------------------------------
# The shipped lws CRDs

def _real_crds_present() -> bool:
    return all(kv._crd_path(c) is not None for c in kv._sources())


real_crds = pytest.mark.skipif(not _real_crds_present(), reason=(
    "the lws CRD files of knobkeeper/deploy/kube/crds/SOURCES.toml are not laid out here "
    f"(looked in {', '.join(map(str, kv.crd_dirs()))})"))


@real_crds
def test_good_leaderworkerset_and_disaggregatedset_pass():
    assert validate_docs([leaderworkerset(), disaggregatedset(), deployment("router")], source="pd.yaml") == []


@real_crds
def test_typo_in_the_lws_worker_template():
    doc = leaderworkerset()
    doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["envv"] = []
    doc["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    ds = disaggregatedset()
    ds["spec"]["roles"][1]["spec"]["replicas"] = "two"
    problems = validate_docs([doc, ds], source="lws.yaml")
    assert sorted(messages(problems)) == sorted([
        "lws.yaml: LeaderWorkerSet/decode: spec.leaderWorkerTemplate.sizee: not a field of "
        "spec.leaderWorkerTemplate, did you mean size? (the LeaderWorkerSet CRD of lws v0.10.0-11-g060ab4d)",
        "lws.yaml: LeaderWorkerSet/decode: spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].envv: "
        f"not a field of Container, did you mean env? (strict schema of Kubernetes {kv.DEFAULT_KUBE_VERSION})",
        "lws.yaml: DisaggregatedSet/pd: spec.roles[1].spec.replicas: expected an integer, got a string 'two' "
        "(the DisaggregatedSet CRD of lws v0.10.0-11-g060ab4d)"])


@real_crds
def test_the_shipped_crds_pod_templates_are_where_expected():
    """The CRDs describe their pod templates in full (no preserve-unknown-fields); validate.py hands
    exactly the leader and worker templates to the built-in PodTemplateSpec."""
    for entry in kv._sources():
        crd = kv._load_crd(entry["file"])
        assert _count(crd, lambda k, v: k == "x-kubernetes-preserve-unknown-fields") == 0
        found: list[str] = []

        def walk(schema: Any, path: str) -> None:
            if isinstance(schema, dict):
                if schema.get(kv._BUILTIN_KEYWORD) == kv._POD_TEMPLATE:
                    found.append(path)
                for k, v in schema.get("properties", {}).items():
                    walk(v, f"{path}.{k}")
                walk(schema.get("items"), path + "[]")

        walk(kv._closed_schema(entry["file"], "v1"), "")
        prefix = ".spec.roles[].spec" if entry["kind"] == "DisaggregatedSet" else ".spec"
        assert found == [f"{prefix}.leaderWorkerTemplate.{t}" for t in ("leaderTemplate", "workerTemplate")]


@real_crds
def test_crd_manifests_for_1_20():
    published = kv.crd_manifests()
    assert [c["metadata"]["name"] for c in published] == [c["name"] for c in kv._sources()]
    for crd, mended in zip(published, kv.crd_manifests(server_minor=20)):
        cel = 1 if crd["spec"]["names"]["kind"] == "DisaggregatedSet" else 0  # its one rule; LWS has none
        assert _check_for_1_20(crd) == (66 + cel, 2)  # 66 empty defaults; leader and worker imagePullSecrets
        assert mended == crd_for_server(crd, 20)
