"""Strict, offline validation of Kubernetes manifests: every field of every object is checked against
a schema, and a field the schema does not name (`envv` for `env`) is an error, never silently dropped.

    problems = validate_file(Path("manifests/prod/decode.yaml"))          # or validate_yaml_text(text, source)
    problems = validate_docs(docs, source="decode", kube_version="1.30")   # objects already loaded
    for p in problems: print(p)
    # manifests/prod/decode.yaml:14: Deployment/decode: spec.template.spec.containers[0].envv:
    #     not a field of Container, did you mean env? (strict schema of Kubernetes 1.26)
    crd_manifests(server_minor=20)        # the CRD objects to install, mended for that server

What is checked, and how:
- Built-in kinds (Deployment, StatefulSet, Service, ...): the *strict* JSON schemas of the Kubernetes
  release `kube_version` that PyPI's kubernetes-validate ships (1.25-1.37; strict: every object closed
  with additionalProperties false), found as its `validate(..., strict=True)` finds them (the kind
  and apiVersion name the file; the file's x-kubernetes-group-version-kind must name the same group,
  version and kind), loaded once per process and run with jsonschema's iter_errors, so every error of
  a document is reported, not only the first. No schema for a kind is a Problem, never a pass
  (kubernetes-validate's own CLI only warns and exits 0 there).
- LeaderWorkerSet and DisaggregatedSet (by apiVersion group/version and kind): the `openAPIV3Schema`
  of that version of the CRD as kubernetes-sigs/lws publishes it (crds/SOURCES.toml: repo, commit,
  path, sha256), closed here: `additionalProperties: false` wherever `properties` are listed and
  neither additionalProperties nor x-kubernetes-preserve-unknown-fields is given (not inside
  allOf/anyOf/oneOf/not, whose branches only restrict values), `nullable` as a null type; run as JSON
  Schema draft 4 (OpenAPI 3.0's dialect). The shipped CRDs do describe their pod templates in full
  (controller-gen embeds the PodTemplateSpec of the k8s.io/api the LWS release builds against, none of
  it x-kubernetes-preserve-unknown-fields); even so each embedded pod template (an object of exactly
  `metadata` and `spec`, whose spec has `containers`: leaderTemplate and workerTemplate) is validated
  against kubernetes-validate's strict PodTemplateSpec of `kube_version` instead, and the object's own
  `metadata` against its ObjectMeta: the pods are made by the cluster's own API server, so a field
  newer than the cluster passes the CRD's schema and is then dropped or refused when the controller
  creates the pod. A typo there therefore reads like one in a Deployment ("not a field of Container").
- Every document: a mapping with apiVersion, kind and metadata.name (what `kubectl apply` needs).
  A YAML syntax error is one Problem naming the file and line; schema problems name the line too.

What is not checked: CEL rules (`x-kubernetes-validations`, e.g. DisaggregatedSet's "replicas zero for
all roles or for none"), list-map key uniqueness (`x-kubernetes-list-type: map`), string formats
(int32 ranges, quantities, dates), admission webhooks and policies, and anything only a server knows
(quotas, existing objects, names in use, RBAC, immutable fields on update, defaulting). In an LWS pod
template's metadata, ObjectMeta's fields pass where the CRD lists only labels, annotations, name,
namespace and finalizers (the server prunes the others, e.g. generateName).

`kube_version` (default DEFAULT_KUBE_VERSION = 1.26): the oldest release LWS supports (its
installation guide requires Kubernetes >= 1.26). Validate against the oldest server the manifests must
run on: a GA API never loses a field in a later release, while a field newer than the server passes a
newer schema and is then dropped or refused (a 1.20 server, past kubectl's client-side check, drops
`envv` silently). Pass the
cluster's version for a newer cluster's fields.

Where the CRD files come from: crds/SOURCES.toml names each file, its source and its sha256 (a file
that differs is refused). Files fetched from a public repository are data the project's developers
do not commit, so they are read from, first found wins: $KNOBKEEPER_KUBE_CRDS, crds/ beside this
module, shared/kube/crds/ in the repo or beside it (where the workplace lays shared/). Without them a
LeaderWorkerSet or DisaggregatedSet is a Problem ("its CRD file is not here"), never a pass.

crd_for_server(crd, server_minor): the published CRDs are refused by an old API server (the 1.20.2 one
the tests run); it removes exactly what that version refuses (CEL rules, empty defaults) and marks the
two list-map keys that lose their default required, nothing else (a test checks the diff). Checked
once by hand against that server (kubectl create --dry-run=server, then create): the published CRDs
refused, each of the two removals alone still refused, crd_for_server(crd, 20) created; then the
tests' minimal LeaderWorkerSet and DisaggregatedSet pass a server dry run.

Cost (measured on the project's kind of machine, 2 cores, others' tests running): a whole process
(`python -c` importing this module and validating one file of 6 documents: Deployment, StatefulSet,
Service, router Deployment, LeaderWorkerSet, DisaggregatedSet): median of 5 runs 0.39 s and 0.45 s in
two sets (0.50 s with one core kept busy), 42 MB peak RSS; of that, the import is 0.12 s and reading,
checking and closing the two CRD files (1.3 and 1.5 MB of YAML, libyaml) ~0.25 s: the 4 built-in
documents alone take 0.13-0.18 s, 28 MB. In process,
after warm-up (the schemas of each version and the closed CRD schemas are cached per process): 0.36 ms
a built-in document, 0.84 ms a LeaderWorkerSet, 1.4 ms a DisaggregatedSet of two roles.
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import jsonschema
import yaml
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

from knobkeeper.errors import UserError

DEFAULT_KUBE_VERSION = "1.26"

CRDS_DIR = Path(__file__).resolve().parent / "crds"
SOURCES = CRDS_DIR / "SOURCES.toml"
CRDS_ENV = "KNOBKEEPER_KUBE_CRDS"

_DEFS_ID = "https://kubernetes.io/api/_definitions.json"
_POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_BUILTIN_KEYWORD = "x-knobkeeper-builtin"  # in a closed CRD schema: validate here with that built-in definition


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one document: `source` (the file or label), `obj` (Kind/name, or
    "document N" where it has none), `path` (spec.template.spec.containers[0].envv; "" for the whole
    document), `message`, and the `line` of the file where known."""

    source: str
    obj: str
    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return ": ".join(part for part in (where, self.obj, self.path, self.message) if part)


# ---------------------------------------------------------------------------------------------------
# Reading YAML


def validate_file(path: Path, *, kube_version: str | None = DEFAULT_KUBE_VERSION,
                  source: str | None = None) -> list[Problem]:
    """The problems of a multi-document YAML file (`source`: how to name it, default the path)."""
    path = Path(path)
    label = source if source is not None else str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(label, "", "", f"cannot read: {exc}")]
    return validate_yaml_text(text, label, kube_version=kube_version)


def validate_yaml_text(text: str, source: str, *,
                       kube_version: str | None = DEFAULT_KUBE_VERSION) -> list[Problem]:
    """The problems of multi-document YAML text (yaml.safe_load_all's loader, SafeLoader, one document
    at a time so that each keeps its nodes for line numbers); empty documents are skipped. A syntax
    error is the one problem."""
    loaded: list[tuple[Any, yaml.Node]] = []
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            loaded.append((loader.construct_document(node), node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        what = ": ".join(str(s) for s in (getattr(exc, "context", None), getattr(exc, "problem", None)) if s)
        at = f" (column {mark.column + 1})" if mark is not None else ""
        return [Problem(source, "", "", f"YAML syntax error: {what or exc}{at}",
                        line=mark.line + 1 if mark is not None else None)]
    finally:
        loader.dispose()
    return _validate_all(((doc, node) for doc, node in loaded), source, kube_version)


def validate_docs(docs: list[Any], *, source: str,
                  kube_version: str | None = DEFAULT_KUBE_VERSION) -> list[Problem]:
    """The problems of already-loaded documents (None, an empty YAML document, is skipped)."""
    return _validate_all(((doc, None) for doc in docs), source, kube_version)


def _validate_all(docs: Iterable[tuple[Any, yaml.Node | None]], source: str,
                  kube_version: str | None) -> list[Problem]:
    schema_dir, minor = _schema_dir(kube_version)
    problems: list[Problem] = []
    for number, (doc, node) in enumerate(docs, 1):
        if doc is None:
            continue
        found = list(dict.fromkeys(_validate_doc(doc, number, node, source, schema_dir, minor)))
        problems += sorted(found, key=lambda p: p.line or 0)  # in the file's order; stable within a line
    return problems


# ---------------------------------------------------------------------------------------------------
# One document


def _validate_doc(doc: Any, number: int, node: yaml.Node | None, source: str, schema_dir: str,
                  minor: str) -> Iterator[Problem]:
    def line(path: Iterable[Any] = ()) -> int | None:
        return _line_of(node, list(path))

    if not isinstance(doc, dict):
        yield Problem(source, f"document {number}", "",
                      f"not a mapping but {_describe(doc)}: every document must be one Kubernetes object",
                      line())
        return
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    obj = f"{kind}/{name}" if isinstance(kind, str) and isinstance(name, str) and name else (
        f"{kind} (document {number})" if isinstance(kind, str) and kind else f"document {number}")
    bad_head = False
    for field, value in (("apiVersion", api_version), ("kind", kind)):
        if not isinstance(value, str) or not value:
            bad_head = True
            yield Problem(source, obj, field, "missing: every object needs apiVersion and kind"
                          if value is None else f"expected a non-empty string, got {_describe(value)}",
                          line([field] if field in doc else []))
    if bad_head:
        return
    if not isinstance(name, str) or not name:
        yield Problem(source, obj, "metadata.name", "missing: every object needs a name to be applied",
                      line(["metadata"] if isinstance(meta, dict) else []))
    group, _, version = api_version.rpartition("/")
    crd = _crd_index().get((group, kind))
    if crd is not None:
        errors, label, names = _crd_errors(doc, crd, version, schema_dir, minor)
        if isinstance(errors, str):
            field = "" if errors.startswith("no schema") else "apiVersion"
            yield Problem(source, obj, field, errors, line([field] if field else []))
            return
    else:
        validator, names = _builtin_validator(schema_dir, api_version, kind)
        if validator is None:
            yield Problem(source, obj, "", _no_schema(api_version, kind, minor), line())
            return
        errors, label = validator.iter_errors(doc), f"strict schema of Kubernetes {minor}"
    for error in errors:
        yield from _problems_of(error, source, obj, label, names, line)


def _no_schema(api_version: str, kind: str, minor: str) -> str:
    crds = ", ".join(f"{c['group']}/{v} {c['kind']}" for c in _crd_index().values() for v in c["versions"])
    return (f"no schema for apiVersion {api_version} kind {kind}: not a built-in kind of Kubernetes {minor} "
            f"(kubernetes-validate {kv.__version__}) nor a kind of the CRDs knobkeeper ships ({crds})")


# ---------------------------------------------------------------------------------------------------
# Errors to problems


def _problems_of(error: jsonschema.ValidationError, source: str, obj: str, label: str,
                 names: dict[int, str], line: Callable[[Iterable[Any]], int | None]) -> Iterator[Problem]:
    label = getattr(error, "kk_label", label)
    names = getattr(error, "kk_names", names)
    path = list(error.absolute_path)
    kw = error.validator
    if kw == "additionalProperties" and error.validator_value is False and isinstance(error.instance, dict):
        known = list(error.schema.get("properties", {}))
        patterns = list(error.schema.get("patternProperties", {}))
        owner = names.get(id(error.schema)) or (_dotted(path) or obj.split("/")[0])
        for extra in error.instance:
            if extra in known or any(re.search(p, extra) for p in patterns):
                continue
            close = difflib.get_close_matches(str(extra), known, n=1, cutoff=0.7)
            hint = f", did you mean {close[0]}?" if close else ""
            yield Problem(source, obj, _dotted(path + [extra]), f"not a field of {owner}{hint} ({label})",
                          line(path + [extra]))
        return
    if kw == "required":
        for field in error.validator_value:
            if isinstance(error.instance, dict) and field not in error.instance and repr(field) in error.message:
                owner = names.get(id(error.schema)) or (_dotted(path) or obj.split("/")[0])
                yield Problem(source, obj, _dotted(path + [field]), f"missing: a required field of {owner} ({label})",
                              line(path))
        return
    yield Problem(source, obj, _dotted(path), f"{_message(error)} ({label})", line(path))


def _message(error: jsonschema.ValidationError) -> str:
    kw, value, inst = error.validator, error.validator_value, error.instance
    if kw == "type":
        return f"expected {_types(value)}, got {_describe(inst)}"
    if kw == "enum":
        return f"{_short(inst)} is not one of {', '.join(_short(v) for v in value)}"
    if kw == "pattern":
        return f"{_short(inst)} does not match {value}"
    if kw in ("anyOf", "oneOf") and error.context:
        if all(e.validator == "type" and not e.relative_path for e in error.context):
            return f"expected {' or '.join(_types(e.validator_value) for e in error.context)}, got {_describe(inst)}"
        return _message(jsonschema.exceptions.best_match(error.context))
    text = error.message.replace("\n", " ")
    return text if len(text) <= 200 else text[:197] + "..."


def _types(value: Any) -> str:
    types = [value] if isinstance(value, str) else [t for t in value if t != "null"] or list(value)
    return " or ".join({"object": "a mapping", "array": "a list", "integer": "an integer"}.get(t, f"a {t}")
                       for t in types)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{'a string' if isinstance(value, str) else 'a number'} {_short(value)}"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_PLAIN = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")


def _dotted(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN.match(str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{json.dumps(str(part))}]"
    return out


def _line_of(node: yaml.Node | None, path: list[Any]) -> int | None:
    """The 1-based line of the deepest node of `path` that exists (a key's line for its last part)."""
    if node is None:
        return None
    best = node.start_mark.line + 1
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    best, node = key.start_mark.line + 1, value
                    break
            else:
                return best
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node.start_mark.line + 1
        else:
            return best
    return best


# ---------------------------------------------------------------------------------------------------
# Built-in kinds: kubernetes-validate's strict schemas


def _schema_dir(kube_version: str | None) -> tuple[str, str]:
    """("v1.26.0-local-strict", "1.26") for "1.26", "v1.26" or "1.26.3"; UserError outside 1.25-1.37."""
    wanted = kube_version or DEFAULT_KUBE_VERSION
    match = re.fullmatch(r"v?(\d+)\.(\d+)(\.\d+)?", str(wanted).strip())
    shipped = {kv.major_minor(v): v for v in kv.all_versions()}
    minor = f"{match.group(1)}.{match.group(2)}" if match else None
    if minor not in shipped:
        raise UserError(f"kube_version {wanted!r}: expected a Kubernetes version whose strict schemas "
                        f"kubernetes-validate {kv.__version__} ships: {min(shipped, key=_key)} .. "
                        f"{max(shipped, key=_key)}")
    return f"v{shipped[minor]}-local-strict", minor


def _key(minor: str) -> tuple[int, ...]:
    return tuple(int(x) for x in minor.split("."))


@functools.lru_cache(maxsize=None)
def _definitions(schema_dir: str) -> tuple[Registry, dict[int, str], dict[str, Any]]:
    """The release's _definitions.json as a registry, with the short name of each definition by the
    identity of its schema (what "not a field of Container" names)."""
    defs = kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", schema_dir)
    names = {id(schema): full.rsplit(".", 1)[-1] for full, schema in defs["$defs"].items()}
    return Resource.from_contents(defs) @ Registry(), names, defs


@functools.lru_cache(maxsize=None)
def _builtin_validator(schema_dir: str, api_version: str, kind: str
                       ) -> tuple[jsonschema.protocols.Validator | None, dict[int, str]]:
    """The strict validator of a built-in kind, found as kubernetes_validate.validate finds it; None
    where the release has no schema for it (or the file found is not that group/version/kind)."""
    file_api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{file_api}.json",
                                    schema_dir)
    except (FileNotFoundError, kv.InvalidSchemaError):
        return None, {}
    group, _, version = api_version.rpartition("/")
    gvks = schema.get("x-kubernetes-group-version-kind") or []
    if not any(g.get("group", "") == group and g.get("version") == version and g.get("kind") == kind
               for g in gvks):
        return None, {}
    registry, names, _ = _definitions(schema_dir)
    names = {**names, id(schema): kind}
    return jsonschema.Draft202012Validator(schema, registry=Resource.from_contents(schema) @ registry), names


@functools.lru_cache(maxsize=None)
def _definition_validator(schema_dir: str, definition: str) -> jsonschema.protocols.Validator:
    registry, _, _ = _definitions(schema_dir)
    return jsonschema.Draft202012Validator({"$ref": f"{_DEFS_ID}#/$defs/{definition}"}, registry=registry)


# ---------------------------------------------------------------------------------------------------
# CRD kinds: the shipped CRDs' schemas, closed


@functools.lru_cache(maxsize=1)
def _sources() -> list[dict[str, Any]]:
    with open(SOURCES, "rb") as f:
        return tomllib.load(f)["crd"]


@functools.lru_cache(maxsize=1)
def _crd_index() -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["group"], c["kind"]): c for c in _sources()}


def crd_dirs() -> list[Path]:
    """Where the CRD files are looked for, in order (see the module's docstring)."""
    dirs = [Path(os.environ[CRDS_ENV])] if os.environ.get(CRDS_ENV) else []
    repo = Path(__file__).resolve().parents[3]
    return dirs + [CRDS_DIR, repo / "shared" / "kube" / "crds", repo.parent / "shared" / "kube" / "crds"]


def _crd_path(entry: dict[str, Any]) -> Path | None:
    for folder in crd_dirs():
        if (folder / entry["file"]).is_file():
            return folder / entry["file"]
    return None


@functools.lru_cache(maxsize=None)
def _load_crd(file: str) -> dict[str, Any]:
    """The CRD object of SOURCES.toml's `file`, checked against its sha256 (cached: callers copy)."""
    entry = next(c for c in _sources() if c["file"] == file)
    path = _crd_path(entry)
    if path is None:
        raise UserError(f"the {entry['kind']} CRD file {file} is not here (looked in: "
                        f"{', '.join(str(d) for d in crd_dirs())}): it is {entry['path']} of {entry['repo']} "
                        f"at {entry['commit'][:12]} ({SOURCES.name})")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise UserError(f"{path}: sha256 {digest[:12]}..., not the {entry['sha256'][:12]}... of {entry['path']} "
                        f"at {entry['commit'][:12]} that {SOURCES.name} names: fetch that file unchanged")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = [d for d in yaml.load_all(data, Loader=loader) if d]
    if len(docs) != 1 or docs[0].get("kind") != "CustomResourceDefinition":
        raise UserError(f"{path}: expected one CustomResourceDefinition")
    return docs[0]


def crd_manifests(server_minor: int | None = None) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions to install (copies), through crd_for_server for that server."""
    crds = [_load_crd(c["file"]) for c in _sources()]
    if server_minor is None:
        return [copy.deepcopy(c) for c in crds]
    return [crd_for_server(c, server_minor) for c in crds]


def crd_for_server(crd: dict[str, Any], server_minor: int) -> dict[str, Any]:
    """A copy of `crd` without what a Kubernetes 1.<server_minor> API server refuses in it."""
    # Measured against the 1.20.2 API server the tests run (`kubectl create --dry-run=server`): it refuses
    # the published LWS and DisaggregatedSet CRDs for `x-kubernetes-validations` (CEL rules, a field of
    # the CRD schema only since 1.23: kubectl's check from the server's OpenAPI refuses it, the server
    # itself would drop it) and for each of the 66 `default: ""` (controller-gen's, on LocalObjectReference
    # `name` and the gRPC probe's `service`: 1.20 reads an empty default as null, "must be of type
    # string"). Without its default, imagePullSecrets' map key `name` must be required instead ("this
    # property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
    # and upstream calls it "effectively required"), so it is made so. The empty defaults only below
    # 1.21, as measured (1.21-1.25 unmeasured; LWS itself requires 1.26). CEL rules are not run here
    # either, and an absent "" default reads the same to a pod.
    def refused(key: str, value: Any) -> bool:
        return (key == "x-kubernetes-validations" and server_minor < 23) or (
            key == "default" and value == "" and server_minor < 21)

    def without(node: Any) -> Any:
        if isinstance(node, list):
            return [without(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: without(v) for k, v in node.items() if not refused(k, v)}
        items = node.get("items")
        if isinstance(items, dict) and isinstance(out.get("items"), dict):
            props = items.get("properties", {})
            lost = [key for key in node.get("x-kubernetes-list-map-keys", [])
                    if isinstance(props.get(key), dict) and "default" in props[key]
                    and "default" not in out["items"]["properties"][key] and key not in items.get("required", [])]
            if lost:
                out["items"]["required"] = [*items.get("required", []), *lost]
        return out

    return without(crd)


def _is_pod_template(schema: dict[str, Any]) -> bool:
    props = schema.get("properties")
    return (isinstance(props, dict) and set(props) == {"metadata", "spec"}
            and isinstance(props["spec"], dict) and "containers" in props["spec"].get("properties", {}))


def _close(schema: Any) -> Any:
    """A copy of a structural schema with additionalProperties false wherever properties are listed
    and nothing says more fields may come; pod templates handed to the built-in PodTemplateSpec."""
    if not isinstance(schema, dict):
        return schema
    if _is_pod_template(schema):
        return {_BUILTIN_KEYWORD: _POD_TEMPLATE}
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _close(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
            if out.get("x-kubernetes-embedded-resource"):
                for field, kind in (("apiVersion", "string"), ("kind", "string"), ("metadata", "object")):
                    out["properties"].setdefault(field, {"type": kind})
    if isinstance(out.get("items"), dict):
        out["items"] = _close(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _close(out["additionalProperties"])
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


@functools.lru_cache(maxsize=None)
def _closed_schema(file: str, version: str) -> dict[str, Any] | None:
    crd = _load_crd(file)
    for v in crd["spec"]["versions"]:
        if v.get("name") == version and v.get("served", True):
            root = _close(v["schema"]["openAPIV3Schema"])
            root["properties"] = {**root.get("properties", {}), "metadata": {_BUILTIN_KEYWORD: _OBJECT_META}}
            return root
    return None


@functools.lru_cache(maxsize=None)
def _crd_validator(file: str, version: str, schema_dir: str) -> jsonschema.protocols.Validator | None:
    schema = _closed_schema(file, version)
    if schema is None:
        return None
    _, names, _ = _definitions(schema_dir)
    minor = schema_dir[1:].split(".0-")[0]

    def builtin(validator: Any, definition: str, instance: Any, schema: Any) -> Iterator[Any]:
        for error in _definition_validator(schema_dir, definition).iter_errors(instance):
            error.kk_label, error.kk_names = f"strict schema of Kubernetes {minor}", names
            yield error

    cls = jsonschema.validators.extend(jsonschema.Draft4Validator, {_BUILTIN_KEYWORD: builtin})
    return cls(schema)


def _crd_errors(doc: dict[str, Any], crd: dict[str, Any], version: str, schema_dir: str, minor: str):
    """(errors, label, names), or (a message, "", {}) where the CRD is missing or not served at that version."""
    if version not in crd["versions"]:
        return (f"{crd['kind']} is served as {', '.join(crd['group'] + '/' + v for v in crd['versions'])} "
                f"by the shipped CRD ({crd['version']}), not as {doc['apiVersion']}"), "", {}
    try:
        validator = _crd_validator(crd["file"], version, schema_dir)
    except UserError as exc:
        return f"no schema: {exc}", "", {}
    if validator is None:
        return f"the shipped {crd['kind']} CRD does not serve {version}", "", {}
    label = f"the {crd['kind']} CRD of lws {crd['version']}"
    return validator.iter_errors(doc), label, {}


__all__ = ["DEFAULT_KUBE_VERSION", "Problem", "crd_dirs", "crd_for_server", "crd_manifests", "validate_docs",
           "validate_file", "validate_yaml_text"]
