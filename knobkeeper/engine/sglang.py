"""SGLang: everything knobkeeper knows about the engine, in one place.

    registry   sglang/srt/environ.py, read with ast (never executed): `class Envs` declares every
               variable the engine reads as `NAME = EnvInt(4)` (EnvBool, EnvInt, EnvFloat, EnvStr,
               EnvTuple, EnvJSON and *WithAlias variants whose second argument is the old name);
               the comments above a field are its only documentation. A default that is not a
               literal (a lambda, a function, a path computed at import) is recorded as "computed"
               with its source text. `_DEPRECATED_ENVS` names removed variables with their
               replacement or a note, carried into `set`'s refusal.
    command    {venv}/bin/python -m sglang.launch_server --model-path M --served-model-name N
               --host H --port P --disaggregation-mode prefill|decode
               --disaggregation-transfer-backend B [--disaggregation-bootstrap-port BP] [--tp-size T]
    parser     sglang.srt.server_args.prepare_server_args(argv) of the pinned version, in a side
               environment with the few small packages it imports (measured on 0.5.23)
    pairing    prefill and decode agree on model path, served name, page size, KV cache dtype and
               transfer backend; every bootstrap port the router names is one a prefill listens on
    endpoints  /health; metrics need --enable-metrics (sglang:* names below, label model_name)
    bench      `python -m sglang.bench_serving` JSONL lines (evidence importer format "sglang")
"""

from __future__ import annotations

import ast
from typing import Any, Mapping

from knobkeeper.engine.family import (PARSER_CHILD_END, Endpoints, Family, Metrics, Parsed, ParserSpec,
                                      RegistryReader, Series, Workers, engine_args, model_name)
from knobkeeper.engine.source import EngineSource, NotLiteral, comments, doc_above, int_enums, literal, segment
from knobkeeper.errors import UserError

LAUNCH_MODULE = "sglang.launch_server"
REGISTRY_FILE = "sglang/srt/environ.py"
# The engine field classes, most specific first, to the catalog's types. EnvTuple (a comma-separated
# list the engine splits and strips) and EnvJSON (JSON text, or a path to a JSON file) are strings
# to the catalog: the process only ever sees text, and the kind is kept next to the type.
FIELD_TYPES = (("EnvBool", "bool"), ("EnvInt", "int"), ("EnvFloat", "float"), ("EnvTuple", "string"),
               ("EnvJSON", "string"), ("EnvStr", "string"))


# --- the registry ---------------------------------------------------------------------------------


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _mro(name: str, classes: dict[str, ast.ClassDef]) -> list[str]:
    """Base names depth first, left to right (enough to find the most specific field class)."""
    out: list[str] = []

    def visit(cls: str, depth: int = 0) -> None:
        if cls in out or depth > 50:
            return
        out.append(cls)
        node = classes.get(cls)
        for base in (node.bases if node else []):
            visit(ast.unparse(base).rsplit(".", 1)[-1], depth + 1)

    visit(name)
    return out


def _init_params(mro: list[str], classes: dict[str, ast.ClassDef]) -> list[str]:
    """The positional parameter names (without self) of the first __init__ along the MRO."""
    for cls in mro:
        node = classes.get(cls)
        for stmt in (node.body if node else []):
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                return [a.arg for a in stmt.args.args[1:]]
    return ["default"]


def _bind(call: ast.Call, params: list[str], what: str) -> dict[str, ast.AST]:
    bound: dict[str, ast.AST] = {}
    for name, arg in zip(params, call.args):
        bound[name] = arg
    for kw in call.keywords:
        if kw.arg is None:
            raise UserError(f"{what}: line {call.lineno}: `**{ast.unparse(kw.value)}` in a field: the reader knows "
                            f"literal arguments only")
        bound[kw.arg] = kw.value
    return bound


def _field_type(mro: list[str], secret: bool) -> str:
    for cls in mro:
        for base, kk_type in FIELD_TYPES:
            if cls == base:
                return "secret" if secret and kk_type == "string" else kk_type
    return "secret" if secret else "string"


def _module_constants(tree: ast.Module, enums: dict) -> dict[str, Any]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = literal(node.value, enums)
            except NotLiteral:
                pass
    return out


def read_environ(source: EngineSource) -> dict[str, Any]:
    """{"knobs", "deprecated"} of sglang/srt/environ.py (see the module docstring)."""
    text, tree, what = source.registry_file(REGISTRY_FILE)
    classes = _classes(tree)
    envs = classes.get("Envs")
    if envs is None:
        raise UserError(f"{what}: no `class Envs` (is this the engine's variable registry?)")
    enums = int_enums(tree)
    constants = _module_constants(tree, enums)
    notes, lines = comments(text), text.splitlines()
    knobs: dict[str, dict[str, Any]] = {}
    for stmt in envs.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        if not isinstance(target, ast.Name) or not isinstance(stmt.value, ast.Call):
            continue
        call = stmt.value
        cls = ast.unparse(call.func).rsplit(".", 1)[-1]
        mro = _mro(cls, classes)
        if "EnvField" not in mro:
            continue
        bound = _bind(call, _init_params(mro, classes), what)
        secret = _literal_or(bound.get("secret"), enums, False) is True
        entry: dict[str, Any] = {"type": _field_type(mro, secret), "kind": cls, "default": None}
        default = bound.get("default")
        if default is not None:
            try:
                entry["default"] = _resolve(default, enums, constants)
            except NotLiteral:
                # A callable or run-time default (platform- or path-dependent): computed by the engine.
                entry["default_computed"] = segment(lines, default)
        if secret:
            entry["secret"] = True
        alias = _literal_or(bound.get("deprecated_name"), enums, None)
        if isinstance(alias, str):
            entry["alias"] = alias
        entry["doc"] = doc_above(stmt, lines, notes)
        knobs[target.id] = entry
    if not knobs:
        raise UserError(f"{what}: declares no variables (no EnvField in class Envs)")
    return {"knobs": knobs, "deprecated": _deprecated(tree, classes, enums, what)}


def _resolve(node: ast.AST, enums: dict, constants: dict) -> Any:
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    return literal(node, enums)


def _literal_or(node: ast.AST | None, enums: dict, fallback: Any) -> Any:
    if node is None:
        return fallback
    try:
        return literal(node, enums)
    except NotLiteral:
        return fallback


def _deprecated(tree: ast.Module, classes: dict, enums: dict, what: str) -> dict[str, dict[str, str]]:
    """`_DEPRECATED_ENVS = {"OLD": _DeprecatedEnv(replacement=..., note=...)}`: {old: {replacement, note}}."""
    table = None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "_DEPRECATED_ENVS" and isinstance(node.value, ast.Dict):
            table = node.value
    out: dict[str, dict[str, str]] = {}
    if table is None:
        return out
    for key, value in zip(table.keys, table.values):
        name = _literal_or(key, enums, None) if key is not None else None
        if not isinstance(name, str) or not isinstance(value, ast.Call):
            continue
        cls = ast.unparse(value.func).rsplit(".", 1)[-1]
        bound = _bind(value, _init_params(_mro(cls, classes), classes), what)
        fields = {f: _literal_or(bound.get(f), enums, None) for f in ("replacement", "note")}
        out[name] = {f: v for f, v in fields.items() if isinstance(v, str) and v}
    return dict(sorted(out.items()))


# --- the parser -----------------------------------------------------------------------------------

# The child's side: parse each argv with the engine's own parser; argparse's message on rejection.
_PARSE = r"""
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args
FIELDS = ("model_path", "served_model_name", "page_size", "kv_cache_dtype", "disaggregation_transfer_backend",
          "disaggregation_mode", "disaggregation_bootstrap_port", "host", "port", "tp_size")
argvs = json.load(open(sys.argv[1]))
out = []
for argv in argvs:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parsed = prepare_server_args(list(argv))
        out.append({"ok": True, "args": {f: getattr(parsed, f, None) for f in FIELDS}})
""" + PARSER_CHILD_END

# What must agree between prefill and decode, as the parser resolved it.
PAIRED = (("model_path", "model path"), ("served_model_name", "served model name"), ("page_size", "page size"),
          ("kv_cache_dtype", "KV cache dtype"), ("disaggregation_transfer_backend", "transfer backend"))

SGLANG_METRICS = Metrics(
    tokens="sglang:generation_tokens_total", running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs",
    ttft="sglang:time_to_first_token_seconds", itl="sglang:inter_token_latency_seconds",
    # sglang 0.5.23 renamed the TPOT histogram; older versions export the second name.
    tpot=("sglang:request_time_per_output_token_seconds", "sglang:time_per_output_token_seconds"),
    requests=Series("sglang:num_requests_total"), aborted=Series("sglang:num_aborted_requests_total"),
    prompt_tokens="sglang:prompt_tokens_total")


class SGLang(Family):
    name = "sglang"
    package = "sglang[all]"
    distribution = "sglang"
    version_key = "sglang_version"
    venv_default = True
    runs_kernels = True
    uses_bootstrap = True
    endpoints = Endpoints(health="/health", readiness="/health")
    metrics = SGLANG_METRICS
    bench_format = "sglang"
    registry = RegistryReader(file=REGISTRY_FILE, top="sglang", wheels=("sglang",), read=read_environ)
    parser = ParserSpec(wheels=("sglang",), child=_PARSE,
                        deps=("psutil", "pybase64", "requests", "urllib3", "certifi", "idna", "charset-normalizer",
                              "pyzmq", "tqdm", "ipython", "traitlets", "msgspec"))

    def command(self, svc: Any, data: Mapping[str, Any], workers: Workers) -> list[str]:
        model = data.get("model")
        if not model:
            raise UserError(f"host {svc.host}: data model: the sglang engine needs a model path")
        cmd = [self.interpreter(data, svc.prefix), "-m", LAUNCH_MODULE, "--model-path", str(model),
               "--served-model-name", model_name(data), "--host", svc.listen_host, "--port", str(svc.port),
               "--disaggregation-mode", svc.role,
               "--disaggregation-transfer-backend", str(data.get("transfer_backend") or "mooncake")]
        if svc.bootstrap_port is not None:
            cmd += ["--disaggregation-bootstrap-port", str(svc.bootstrap_port)]
        if data.get("tp_size"):
            cmd += ["--tp-size", str(data["tp_size"])]
        return cmd + engine_args(svc, data)

    def parser_argv(self, command: list[str]) -> list[str]:
        for i, arg in enumerate(command[:-1]):
            if arg == "-m" and command[i + 1] == LAUNCH_MODULE:
                return list(command[i + 2:])
        raise UserError(f"{' '.join(command[:3])} ...: not a `python -m {LAUNCH_MODULE}` command")

    def pairing_problems(self, label, parsed, routers, unparsed=frozenset()):
        workers = [p for p in parsed if p.ok and p.role in ("prefill", "decode")]
        prefills = [p for p in workers if p.role == "prefill"]
        problems = _agree(label, workers, PAIRED)
        for router, (family, command) in sorted(routers.items()):
            for url, port in family.named_workers(command)["prefill"]:
                target = next((p for p in prefills if p.url == url.rstrip("/")), None)
                if target is None and url.rstrip("/") in unparsed:
                    continue
                if target is None:
                    problems.append(f"{label}: PD pairing: {router} names prefill {url}, which no parsed prefill "
                                    f"server of this inventory serves")
                elif port is not None and target.args.get("disaggregation_bootstrap_port") != port:
                    problems.append(f"{label}: PD pairing: {router} names bootstrap port {port} for {url}, but "
                                    f"{target.key} listens on {target.args.get('disaggregation_bootstrap_port')!r}")
        return problems, []


def _agree(label: str, workers: list[Parsed], paired: tuple[tuple[str, str], ...]) -> list[str]:
    """One line per (worker, attribute) that differs from the first prefill's, with both values."""
    reference = next((p for p in workers if p.role == "prefill"), None)
    if reference is None or not any(p.role == "decode" for p in workers):
        return []
    problems = []
    for other in workers:
        if other is reference:
            continue
        for attr, words in paired:
            a, b = reference.args.get(attr), other.args.get(attr)
            if a != b:
                problems.append(f"{label}: PD pairing: {words} differs: {reference.key} has {a!r}, "
                                f"{other.key} has {b!r}")
    return problems


FAMILY = SGLang()
