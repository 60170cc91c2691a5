"""Engine registries: which environment variables a given engine VERSION actually reads.

sglang declares every variable it reads in `sglang/srt/environ.py` (`class Envs`, one typed
EnvField per variable, comments above each field as its only documentation). `generate` reads
that file from a wheel, a wheelhouse, PyPI (`pip download --no-deps`) or the installed package;
knobkeeper.changelog.engine_import writes it as one generated JSON file per version,
`inventory/engines/sglang-<V>.json`, in one changelog commit. The hand-written catalog (inventory/catalog.toml) stays the curated layer
on top (roles, risk, ranges, docs); it is never written here.

What the registry answers:
- a knob only the registry knows is settable (the catalog asks `registry_knob` on a miss) with the
  registry's type, risk "unreviewed" and every role that runs the engine, until a person narrows
  it in catalog.toml;
- `set` refuses a knob the pinned version does not declare (`settable`), unless the catalog
  entry's source says where else it comes from and the caller allows undeclared knobs;
- `ignored_knobs` lists declared knobs the pinned version would ignore (for `check`);
- `diff` lists what changed between two versions.

The pinned version of a role comes from the inventories (`engines` and `sglang_version` in host
or group data), read here without pyinfra (see `engine_pins`) so that `set` stays fast.

Loading environ.py executes it: it runs in a child interpreter (`python -I -S`, empty
environment), so its import-time side effects (it rewrites SGL_* variables of os.environ) touch
nothing of ours, and a non-stdlib import in it shows as a load error instead of a silent pass.
"""

from __future__ import annotations

import ast
import json
import os
import re
import runpy
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError

SCHEMA = "knobkeeper.engine-registry/1"
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")
NEUTRAL_RISK = "unreviewed"
# The engine field classes, most specific first, to the catalog's types. EnvTuple (a comma-separated
# list the engine splits and strips) and EnvJSON (JSON text, or a path to a JSON file) are strings
# to the catalog: the process only ever sees text, and the kind is kept next to the type.
FIELD_TYPES = (("EnvBool", "bool"), ("EnvInt", "int"), ("EnvFloat", "float"), ("EnvTuple", "string"),
               ("EnvJSON", "string"), ("EnvStr", "string"))
# Which catalog types can carry a value of each engine type without the engine rejecting it (an
# invalid value makes sglang warn and use its default: a silently ignored setting).
COMPATIBLE = {
    "bool": ("bool",),
    "int": ("int", "enum"),
    "float": ("float", "int"),
    "string": ("string", "enum", "secret"),
    "secret": ("secret",),
}


@dataclass(frozen=True)
class EngineSpec:
    name: str
    registry_file: str  # inside the wheel / the installed package's parent
    version_key: str  # the inventory data key that pins it


ENGINES = {"sglang": EngineSpec("sglang", "sglang/srt/environ.py", "sglang_version")}


def engine_spec(engine: str) -> EngineSpec:
    try:
        return ENGINES[engine]
    except KeyError:
        raise UserError(f"engine {engine!r}: no registry importer for it (known: {', '.join(ENGINES)})") from None


def _check_version(version: str) -> str:
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise UserError(f"version {version!r}: expected a release like 0.5.23")
    return version


def version_key(version: str) -> tuple:
    """Release order for plain versions (0.5.6 < 0.5.23); enough to pick the newest registry."""
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.+_-]", version))


# --- where files live --------------------------------------------------------------------------


def cache_dir() -> Path:
    """The user's cache dir for wheels, side environments and generated registries."""
    explicit = os.environ.get("KNOBKEEPER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "knobkeeper"


def registry_dir(inventory_dir: Path) -> Path:
    return inventory_dir / "engines"


def registry_path(inventory_dir: Path, engine: str, version: str) -> Path:
    return registry_dir(inventory_dir) / f"{engine}-{version}.json"


# --- reading environ.py ------------------------------------------------------------------------

_LOADER = r"""
import enum, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_knobkeeper_engine_environ", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
base = getattr(mod, "EnvField", None)
envs = getattr(mod, "Envs", None)
if base is None or envs is None:
    raise SystemExit("no class Envs of EnvField instances")
fields = []
for name, value in vars(envs).items():
    if not isinstance(value, base):
        continue
    default = value.default
    if callable(default):
        shown = {"computed": True}
    else:
        if isinstance(default, enum.Enum):
            default = default.value
        if isinstance(default, tuple):
            default = list(default)
        try:
            json.dumps(default)
            shown = {"value": default}
        except (TypeError, ValueError):
            shown = {"repr": repr(default)}
    fields.append({"name": name, "classes": [c.__name__ for c in type(value).__mro__], "default": shown,
                   "secret": bool(getattr(value, "secret", False)), "alias": getattr(value, "deprecated_name", None)})
deprecated = {}
for old, entry in (getattr(mod, "_DEPRECATED_ENVS", None) or {}).items():
    deprecated[str(old)] = {"replacement": getattr(entry, "replacement", None), "note": getattr(entry, "note", None)}
with open(sys.argv[2], "w") as out:
    json.dump({"fields": fields, "deprecated": deprecated}, out)
"""


def _load_fields(source: str, what: str) -> dict[str, Any]:
    """Execute environ.py stand-alone in a child interpreter; its Envs fields as plain data."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="knobkeeper-environ-") as tmp:
        path = Path(tmp) / "environ.py"
        path.write_text(source)
        out = Path(tmp) / "fields.json"
        # HOME="~": a default the file computes at import from expanduser("~/...") stays "~/..." (the
        # same registry on every machine, for every user).
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _LOADER, str(path), str(out)],
                              capture_output=True, text=True, env={"HOME": "~"}, timeout=120)
        if done.returncode != 0 or not out.exists():
            last = (done.stderr.strip().splitlines() or ["it exited with status %d" % done.returncode])[-1]
            raise UserError(f"{what}: does not load stand-alone (stdlib only): {last}")
        return json.loads(out.read_text())


def _comments(source: str) -> dict[int, str]:
    """{line number: comment text without '#'} of every comment in the file."""
    import io
    import tokenize

    found: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string[1:].strip()
    return found


_SEPARATOR = re.compile(r"^[=\-#*~ ]{3,}$")
_PRAGMA = re.compile(r"^(fmt|noqa|type|isort|pylint)\s*:", re.I)


def _field_sources(source: str, what: str) -> dict[str, tuple[str, str | None]]:
    """{field name: (doc from the comments above/beside it, source text of a computed default)}."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UserError(f"{what}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    envs = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Envs"), None)
    if envs is None:
        raise UserError(f"{what}: no `class Envs` (is this the engine's variable registry?)")
    comments = _comments(source)
    lines = source.splitlines()
    out: dict[str, tuple[str, str | None]] = {}
    for stmt in envs.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        if not isinstance(target, ast.Name) or not isinstance(stmt.value, ast.Call):
            continue
        block: list[str] = []
        line = stmt.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            block.insert(0, comments.get(line, ""))
            line -= 1
        # A section header (a title between separator lines) is not the field's doc.
        seps = [i for i, text in enumerate(block) if _SEPARATOR.match(text)]
        if seps:
            block = block[seps[-1] + 1:]
        block += [comments[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if n in comments]
        doc = " ".join(t for t in block if t and not _PRAGMA.match(t))
        default_expr = None
        call = stmt.value
        arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "default"), None)
        if arg is not None and not isinstance(arg, ast.Constant):
            default_expr = _segment(lines, arg)
        out[target.id] = (" ".join(doc.split()), default_expr)
    return out


def _segment(lines: list[str], node: ast.AST) -> str:
    """The source text of a node on one line (ast.get_source_segment re-splits the file per call)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    parts = [lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
             lines[last].encode()[:node.end_col_offset].decode()]
    return " ".join(part.strip() for part in parts)


def _field_type(classes: list[str], secret: bool) -> tuple[str, str]:
    """(catalog type, engine kind) of one field from its class's MRO names."""
    kind = classes[0]
    for cls in classes:
        for base, kk_type in FIELD_TYPES:
            if cls == base:
                if secret and kk_type == "string":
                    return "secret", kind
                return kk_type, kind
    return ("secret" if secret else "string"), kind


def build_registry(engine: str, version: str, source: str, what: str) -> dict[str, Any]:
    """The registry document of one engine version from its environ.py text."""
    import hashlib

    loaded = _load_fields(source, what)
    texts = _field_sources(source, what)
    knobs: dict[str, dict[str, Any]] = {}
    for item in loaded["fields"]:
        name = item["name"]
        if not NAME_RE.match(name):
            raise UserError(f"{what}: variable name {name!r}: expected ^[A-Za-z_][A-Za-z0-9_]*$ (nothing imported)")
        kk_type, kind = _field_type(item["classes"], item["secret"])
        doc, default_expr = texts.get(name, ("", None))
        entry: dict[str, Any] = {"type": kk_type, "kind": kind, "default": item["default"].get("value")}
        if item["default"].get("computed"):
            # A callable default (platform- or path-dependent): computed by the engine at run time.
            entry["default_computed"] = default_expr or "a callable"
        elif "repr" in item["default"]:
            entry["default_repr"] = item["default"]["repr"]
        if item["secret"]:
            entry["secret"] = True
        if item["alias"]:
            entry["alias"] = item["alias"]
        entry["doc"] = doc
        knobs[name] = entry
    if not knobs:
        raise UserError(f"{what}: declares no variables (no EnvField in class Envs)")
    deprecated = {k: {f: v for f, v in d.items() if v} for k, d in sorted(loaded["deprecated"].items())}
    return {
        "schema": SCHEMA,
        "generated": f"by `knobkeeper catalog import {engine}` from {ENGINES[engine].registry_file}; do not edit",
        "engine": engine,
        "version": version,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "count": len(knobs),
        "knobs": dict(sorted(knobs.items())),
        "deprecated": deprecated,
    }


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


# --- getting the engine's file ------------------------------------------------------------------


def _wheel_meta(wheel: Path) -> tuple[str, str]:
    """(distribution name, version) from a wheel's METADATA."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if meta is None:
            raise UserError(f"{wheel}: not a wheel (no *.dist-info/METADATA)")
        name = version = ""
        for line in zf.read(meta).decode("utf-8", "replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            elif not line.strip():
                break
        return name, version


def read_wheel(engine: str, wheel: Path) -> tuple[str, str]:
    """(version, environ.py text) from an engine wheel, or one line saying why not."""
    import zipfile

    spec = engine_spec(engine)
    if not wheel.is_file():
        raise UserError(f"--wheel {wheel}: no such file")
    try:
        name, version = _wheel_meta(wheel)
        if name.lower().replace("_", "-") != spec.name:
            raise UserError(f"--wheel {wheel}: a wheel of {name or 'an unnamed package'!r}, not {spec.name}")
        with zipfile.ZipFile(wheel) as zf:
            try:
                text = zf.read(spec.registry_file).decode("utf-8")
            except KeyError:
                raise UserError(f"--wheel {wheel}: {spec.name} {version} has no {spec.registry_file}") from None
    except zipfile.BadZipFile:
        raise UserError(f"--wheel {wheel}: not a wheel (not a zip file)") from None
    return _check_version(version), text


def cached_wheel(engine: str, version: str, wheelhouse: Path | None = None) -> Path:
    """The engine's wheel for `version`: from the cache, else a wheelhouse, else `pip download`."""
    _check_version(version)
    wheels = cache_dir() / "wheels"
    for folder in (wheels, wheelhouse):
        if folder is not None and folder.is_dir():
            hits = sorted(folder.glob(f"{engine}-{version}-*.whl"))
            if hits:
                return hits[0]
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise UserError(f"--wheelhouse {wheelhouse}: no such directory")
    wheels.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
            "-d", str(wheels), f"{engine}=={version}"]
    if wheelhouse is not None:
        args[4:4] = ["--no-index", "--find-links", str(wheelhouse)]
    done = subprocess.run(args, capture_output=True, text=True)
    hits = sorted(wheels.glob(f"{engine}-{version}-*.whl"))
    if done.returncode != 0 or not hits:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.startswith("ERROR")] or done.stderr.strip().splitlines()
        why = lines[-1] if lines else "no wheel"
        where = f"wheelhouse {wheelhouse}" if wheelhouse else "the package index (offline? pass --wheel PATH or --wheelhouse DIR)"
        raise UserError(f"{engine}=={version}: not found in {where}: {why}")
    return hits[0]


def read_installed(engine: str) -> tuple[str, str]:
    """(version, environ.py text) of the engine installed in this environment, without importing it."""
    import importlib.metadata
    import importlib.util

    spec = engine_spec(engine)
    try:
        version = importlib.metadata.version(spec.name)
        found = importlib.util.find_spec(spec.name)
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise UserError(f"--from-installed: {spec.name} is not installed in {sys.prefix} (use --version V or --wheel PATH)")
    path = Path(list(found.submodule_search_locations)[0]).parent / spec.registry_file
    if not path.is_file():
        raise UserError(f"--from-installed: {path}: missing")
    return _check_version(version), path.read_text()


def generate(engine: str, version: str | None = None, wheel: Path | None = None, from_installed: bool = False,
             wheelhouse: Path | None = None) -> dict[str, Any]:
    """The registry document of one engine version, from exactly one of the three sources."""
    engine_spec(engine)
    chosen = [x for x in (version is not None, wheel is not None, from_installed) if x]
    if len(chosen) != 1:
        raise UserError("catalog import: give exactly one of --version V, --wheel PATH, --from-installed")
    if from_installed:
        found, text = read_installed(engine)
        what = f"installed {engine} {found}: {ENGINES[engine].registry_file}"
    else:
        path = wheel if wheel is not None else cached_wheel(engine, version, wheelhouse)
        found, text = read_wheel(engine, path)
        if version is not None and found != version:
            raise UserError(f"{path}: holds {engine} {found}, not {version}")
        what = f"{path.name}: {ENGINES[engine].registry_file}"
    return build_registry(engine, found, text, what)


# --- reading registries -------------------------------------------------------------------------


@dataclass
class Registry:
    engine: str
    version: str
    knobs: dict[str, dict[str, Any]]
    deprecated: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: Path | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.knobs

    def close(self, name: str, n: int = 3) -> list[str]:
        import difflib

        return difflib.get_close_matches(name, self.knobs, n=n, cutoff=0.6)

    def label(self) -> str:
        return f"{self.engine} {self.version}"


def parse_registry(doc: Any, where: str, engine: str | None = None, version: str | None = None) -> Registry:
    """A registry from its JSON document, every problem one line naming the file."""
    from knobkeeper.knobs.catalog import TYPES

    def bad(what: str) -> UserError:
        again = f"; regenerate it with `knobkeeper catalog import {engine} --version {version}`" if engine and version else ""
        return UserError(f"{where}: corrupt engine registry: {what}{again}")

    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise bad(f"expected \"schema\": \"{SCHEMA}\"")
    if engine is not None and (doc.get("engine"), doc.get("version")) != (engine, version):
        raise bad(f"it says {doc.get('engine')} {doc.get('version')}, its name says {engine} {version}")
    knobs = doc.get("knobs")
    if not isinstance(knobs, dict) or not knobs:
        raise bad("\"knobs\" must be a non-empty object")
    for name, entry in knobs.items():
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise bad(f"knob name {name!r}: expected ^[A-Za-z_][A-Za-z0-9_]*$")
        if not isinstance(entry, dict) or entry.get("type") not in TYPES:
            raise bad(f"knobs.{name}.type: expected one of {', '.join(TYPES)}")
    deprecated = doc.get("deprecated", {})
    if not isinstance(deprecated, dict):
        raise bad("\"deprecated\" must be an object")
    return Registry(engine=str(doc.get("engine")), version=str(doc.get("version")), knobs=knobs, deprecated=deprecated)


@lru_cache(maxsize=32)
def _load_file(path: str, mtime_ns: int, size: int, engine: str, version: str) -> Registry:
    try:
        doc = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise UserError(f"{path}: corrupt engine registry: not JSON ({exc}); regenerate it with "
                        f"`knobkeeper catalog import {engine} --version {version}`") from None
    registry = parse_registry(doc, path, engine, version)
    registry.path = Path(path)
    return registry


def imported_versions(inventory_dir: Path, engine: str) -> list[str]:
    """Versions with a registry file under inventory/engines/, oldest first."""
    folder = registry_dir(inventory_dir)
    if not folder.is_dir():
        return []
    prefix = f"{engine}-"
    found = [p.name[len(prefix):-5] for p in folder.glob(f"{engine}-*.json")]
    return sorted((v for v in found if VERSION_RE.match(v)), key=version_key)


def load_registry(inventory_dir: Path, engine: str, version: str) -> Registry | None:
    """The imported registry of one version, or None when it was never imported."""
    path = registry_path(inventory_dir, engine, version)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return _load_file(str(path), stat.st_mtime_ns, stat.st_size, engine, version)


def registry_for(engine: str, version: str, inventory_dir: Path | None = None, wheelhouse: Path | None = None) -> Registry:
    """The registry of any version: the imported one, else one generated into the cache."""
    if inventory_dir is not None:
        found = load_registry(inventory_dir, engine, version)
        if found is not None:
            return found
    _check_version(version)
    cached = cache_dir() / "registries" / f"{engine}-{version}.json"
    if cached.is_file():
        try:
            registry = parse_registry(json.loads(cached.read_text()), str(cached), engine, version)
            registry.path = cached
            return registry
        except (ValueError, UserError):
            pass  # a broken cache entry is regenerated
    doc = generate(engine, version=version, wheelhouse=wheelhouse)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(dump(doc))
    os.replace(tmp, cached)
    registry = parse_registry(doc, str(cached), engine, version)
    registry.path = cached
    return registry


# --- pins: which engine version each role runs ---------------------------------------------------


@dataclass(frozen=True)
class Pin:
    engine: str
    version: str | None  # None: the inventory runs the engine without pinning a version
    inventory: str  # e.g. inventory/example_prod.py
    hosts: tuple[str, ...]


def _module_data(path: Path) -> dict[str, Any]:
    try:
        return {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("_")}
    except Exception as exc:  # an inventory is user code; its error becomes one line
        raise UserError(f"{path}: {type(exc).__name__}: {exc}") from None


def engine_pins(inventory_dir: Path) -> dict[str, list[Pin]]:
    """{role: [Pin]} (see _read_pins); re-read only when an inventory file changed."""
    if not inventory_dir.is_dir():
        return {}
    files = sorted([*inventory_dir.glob("*.py"), *inventory_dir.glob("group_data/*.py")])
    signature = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _read_pins(inventory_dir, signature, os.environ.get("KNOBKEEPER_LOCAL_PORTS", ""))


@lru_cache(maxsize=8)
def _read_pins(inventory_dir: Path, signature: tuple, _environment: str) -> dict[str, list[Pin]]:
    """{role: [Pin]} for every role some inventory runs on a registry engine.

    Inventories are pyinfra inventory files (inventory/*.py: a list of hosts per group, a host
    being NAME or (NAME, {data})) with group data in inventory/group_data/ (all.py, then
    <group>.py, then the host's own data win, as in pyinfra). Read with runpy, not pyinfra:
    pyinfra's import alone costs ~300 ms, which `set` would pay on every call.
    """
    group_dir = inventory_dir / "group_data"
    groups_data: dict[str, dict[str, Any]] = {}
    if group_dir.is_dir():
        for path in sorted(group_dir.glob("*.py")):
            groups_data[path.stem] = _module_data(path)
    pins: dict[str, dict[tuple, list[str]]] = {}
    for path in sorted(inventory_dir.glob("*.py")):
        rel = f"{inventory_dir.name}/{path.name}"
        for group, hosts in _module_data(path).items():
            if not isinstance(hosts, (list, tuple)):
                continue
            for host in hosts:
                name, data = (host if isinstance(host, tuple) and len(host) == 2 else (host, {}))
                if not isinstance(name, str) or not isinstance(data, dict):
                    continue
                merged = {**groups_data.get("all", {}), **groups_data.get(group, {}), **data}
                engines = merged.get("engines")
                engine = engines.get(group) if isinstance(engines, dict) else None
                if engine not in ENGINES:
                    continue
                version = merged.get(ENGINES[engine].version_key)
                pins.setdefault(group, {}).setdefault((engine, version and str(version), rel), []).append(name)
    return {role: [Pin(e, v, inv, tuple(h)) for (e, v, inv), h in table.items()] for role, table in pins.items()}


def engine_roles(inventory_dir: Path, engine: str) -> tuple[str, ...]:
    return tuple(role for role, pins in engine_pins(inventory_dir).items() if any(p.engine == engine for p in pins))


def knob_engine(knob: Any) -> str | None:
    """The registry engine a catalog knob belongs to: its `source` names it first ("sglang", "sglang fork",
    "sglang PR 12345", "sglang build 0.5.23+sm120")."""
    first = re.split(r"[^A-Za-z0-9_]", knob.source.strip(), maxsplit=1)[0].lower()
    return first if first in ENGINES else None


def names_other_origin(knob: Any, engine: str) -> bool:
    """Whether the catalog says the knob comes from somewhere other than the engine's releases."""
    return knob.source.strip().lower() != engine


# --- the catalog's view: knobs only the registry knows ------------------------------------------


def registry_knob(inventory_dir: Path, name: str):
    """The Knob for a variable that only an imported registry declares (newest version first), or None."""
    if not NAME_RE.match(name):
        return None
    from knobkeeper.knobs.catalog import Knob

    for engine in ENGINES:
        for version in reversed(imported_versions(inventory_dir, engine)):
            registry = load_registry(inventory_dir, engine, version)
            entry = registry.knobs.get(name) if registry else None
            if entry is None:
                continue
            roles = engine_roles(inventory_dir, engine)
            if not roles:
                return None
            default = entry.get("default")
            shown_default = entry.get("default_computed") or ("(none)" if default is None else json.dumps(default))
            knob = Knob(
                name=name, type=entry["type"], roles=roles, risk=NEUTRAL_RISK,
                doc=entry.get("doc") or f"(no comment in {engine} {version}'s {ENGINES[engine].registry_file})",
                source=engine, unset=f"the engine default: {shown_default}",
            )
            if default is not None and not isinstance(default, (list, dict)):
                try:
                    knob = Knob(**{**knob.__dict__, "default": knob.check(default)})
                except UserError:
                    pass  # an engine default outside the catalog's type (e.g. -1 for a float) stays documentation
            return knob
    return None


# --- judging knobs against the pinned versions --------------------------------------------------


def _type_line(where: str, knob: Any, registry: Registry) -> str | None:
    engine_type = registry.knobs[knob.name]["type"]
    if knob.type in COMPATIBLE.get(engine_type, ()):
        return None
    return (f"{where}knobs.{knob.name}.type = {knob.type!r}, but {registry.label()} reads it as "
            f"{engine_type} ({registry.knobs[knob.name].get('kind')}); accepted: {', '.join(COMPATIBLE[engine_type])}")


def _pinned_registries(inventory_dir: Path, engine: str, role: str) -> list[tuple[Pin, Registry]]:
    out = []
    for pin in engine_pins(inventory_dir).get(role, []):
        if pin.engine != engine:
            continue
        if pin.version is None:
            raise UserError(f"{pin.inventory}: hosts {', '.join(pin.hosts)} run {engine} for role {role} without "
                            f"{ENGINES[engine].version_key}; pin the version in their data")
        registry = load_registry(inventory_dir, engine, pin.version)
        if registry is None:
            raise UserError(f"{pin.inventory}: role {role} runs {engine} {pin.version}, which has no registry in "
                            f"{inventory_dir.name}/engines/; run `knobkeeper catalog import {engine} --version {pin.version}`")
        out.append((pin, registry))
    return out


def settable(inventory_dir: Path, knob: Any, role: str, allow_undeclared: bool | None = None) -> list[str]:
    """Refuse (UserError) a knob the version pinned for `role` does not declare, or declares with another
    type; returns warnings for an undeclared knob that was allowed.

    Allowed only when the catalog entry's source says where else it comes from (a fork, a build, a PR)
    AND `allow_undeclared` is true. None (library callers) leaves the decision to the catalog's source;
    the CLI passes its --allow-undeclared flag.
    """
    engine = knob_engine(knob)
    if engine is None:
        return []
    warnings = []
    for pin, registry in _pinned_registries(inventory_dir, engine, role):
        if knob.name in registry:
            line = _type_line(f"{inventory_dir.name}/catalog.toml: ", knob, registry)
            if line:
                raise UserError(line)
            continue
        where = f"{registry.label()} (pinned for role {role} in {pin.inventory})"
        close = registry.close(knob.name)
        hint = f"; close names it declares: {', '.join(close)}" if close else ""
        if not names_other_origin(knob, engine):
            raise UserError(f"{knob.name}: {where} does not declare it{hint}; if it comes from a fork, a build or a PR, "
                            f"say so in the catalog entry's source and pass --allow-undeclared")
        if allow_undeclared is False:
            raise UserError(f"{knob.name}: {where} does not declare it{hint}; its catalog source is "
                            f"{knob.source!r}: pass --allow-undeclared to set it anyway")
        warnings.append(f"{knob.name}: not declared by {where}; set anyway (catalog source: {knob.source})")
    return warnings


def ignored_knobs(project: Any, include_other_origin: bool = False) -> list[str]:
    """One problem line per declared knob (inventory/knobs.toml) that the version pinned for its role
    would ignore: not declared by it, or declared with a type the catalog's value cannot satisfy.

    Knobs whose catalog source names another origin (a fork, a build, a PR: set with
    --allow-undeclared) are left out unless `include_other_origin`.
    """
    from knobkeeper.knobs.catalog import load_catalog
    from knobkeeper.knobs.state import read_declared

    catalog = load_catalog(project.catalog_path)
    declared = read_declared(project.knobs_path, catalog)
    inventory_dir = project.inventory_dir
    problems: list[str] = []
    for role in sorted(declared):
        for name in sorted(declared[role]):
            knob = catalog.for_role(name, role)
            engine = knob_engine(knob)
            if engine is None:
                continue
            try:
                pinned = _pinned_registries(inventory_dir, engine, role)
            except UserError as exc:
                problems.append(str(exc))
                continue
            for pin, registry in pinned:
                where = f"{project.rel(project.knobs_path)}: [{role}] {name}"
                if name in registry:
                    line = _type_line(f"{where}: {project.rel(project.catalog_path)}: ", knob, registry)
                    if line:
                        problems.append(line)
                elif include_other_origin or not names_other_origin(knob, engine):
                    close = registry.close(name)
                    hint = f" (close names it declares: {', '.join(close)})" if close else ""
                    problems.append(f"{where}: {registry.label()} (pinned in {pin.inventory}) does not declare it; "
                                    f"the engine would ignore it{hint}")
    return list(dict.fromkeys(problems))


def catalog_type_problems(catalog: Any, registry: Registry) -> list[str]:
    """Catalog entries whose type disagrees with the engine's (one line each)."""
    where = f"{catalog.path.parent.name}/{catalog.path.name}: " if catalog.path else ""
    return [line for knob in catalog.knobs.values()
            if knob.name in registry and knob_engine(knob) == registry.engine
            for line in [_type_line(where, knob, registry)] if line]


# --- diff between versions ----------------------------------------------------------------------


@dataclass
class RegistryDiff:
    old: Registry
    new: Registry
    added: list[str]
    removed: list[str]
    renamed: list[tuple[str, str]]  # (old name, new name)
    defaults: list[tuple[str, Any, Any]]  # (name, old default, new default)
    types: list[tuple[str, str, str]]

    def lines(self) -> list[str]:
        a, b = self.old.label(), self.new.label()
        out = [f"{a} -> {b}: {len(self.added)} added, {len(self.removed)} removed, {len(self.renamed)} renamed, "
               f"{len(self.defaults)} defaults changed, {len(self.types)} types changed"]
        out += [f"renamed {o} -> {n}" for o, n in self.renamed]
        notes = {n: (self.new.deprecated.get(n) or {}).get("note") for n in self.removed}
        out += [f"removed {n}" + (f" ({b}: {notes[n]})" if notes[n] else "") for n in self.removed]
        out += [f"added {n}" for n in self.added]
        out += [f"default {n}: {_show(o)} -> {_show(v)}" for n, o, v in self.defaults]
        out += [f"type {n}: {o} -> {v}" for n, o, v in self.types]
        return out


def _default_of(entry: dict[str, Any]) -> Any:
    return ("computed", entry["default_computed"]) if "default_computed" in entry else entry.get("default")


def _show(value: Any) -> str:
    if isinstance(value, tuple) and value and value[0] == "computed":
        return f"computed ({value[1]})"
    return json.dumps(value)


def diff_registries(old: Registry, new: Registry) -> RegistryDiff:
    """What changed from `old` to `new`. A rename is a removed name that `new` still accepts as an
    alias (EnvXWithAlias) or whose deprecation note names the replacement."""
    gone = sorted(set(old.knobs) - set(new.knobs))
    came = sorted(set(new.knobs) - set(old.knobs))
    renamed: list[tuple[str, str]] = []
    aliases = {e["alias"]: n for n, e in new.knobs.items() if e.get("alias")}
    for name in gone:
        target = aliases.get(name) or (new.deprecated.get(name) or {}).get("replacement")
        if target and target in new.knobs:
            renamed.append((name, target))
    renamed_old = {o for o, _ in renamed}
    renamed_new = {n for _, n in renamed}
    defaults = [(n, _default_of(old.knobs[n]), _default_of(new.knobs[n])) for n in sorted(set(old.knobs) & set(new.knobs))
                if _default_of(old.knobs[n]) != _default_of(new.knobs[n])]
    types = [(n, old.knobs[n]["type"], new.knobs[n]["type"]) for n in sorted(set(old.knobs) & set(new.knobs))
             if old.knobs[n]["type"] != new.knobs[n]["type"]]
    return RegistryDiff(old=old, new=new, added=[n for n in came if n not in renamed_new],
                        removed=[n for n in gone if n not in renamed_old], renamed=renamed, defaults=defaults, types=types)


def diff(engine: str, old_version: str, new_version: str, inventory_dir: Path | None = None,
         wheelhouse: Path | None = None) -> RegistryDiff:
    engine_spec(engine)
    return diff_registries(registry_for(engine, old_version, inventory_dir, wheelhouse),
                           registry_for(engine, new_version, inventory_dir, wheelhouse))
