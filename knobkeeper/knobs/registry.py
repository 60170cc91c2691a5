"""Engine registries: which environment variables a given engine VERSION actually reads.

Each engine family with a registry (knobkeeper.engine: sglang's srt/environ.py, vLLM's envs.py)
reads its own declarations with `ast`, from a wheel, a wheelhouse, PyPI (`pip download --no-deps`)
or the installed package, never executing any of it. `generate` turns what it read into one
document per version; knobkeeper.changelog.engine_import commits it as
`inventory/engines/<engine>-<V>.json`. The hand-written catalog (inventory/catalog.toml) stays
the curated layer on top (roles, risk, ranges, docs); it is never written here.

A registry document: {"schema", "generated", "engine", "version", "source_sha256", "count",
"knobs": {NAME: {"type", "kind", "default" | "default_computed", "doc", ["choices"], ["optional"],
["secret"], ["alias"]}}, "deprecated": {NAME: {["replacement"], ["note"]}}}. "deprecated" holds
what the engine's own source says about a variable being deprecated or removed; `hint` finds it
for a version that no longer declares the name.

This module reads and compares registries only; judging declared knobs against the versions the
inventories pin is knobkeeper.knobs.pinned, and the catalog builds a Knob for a registry-only
variable (knobs.catalog). Import order inside knobs/: values <- registry <- catalog <- state <- pinned.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from knobkeeper.engine import family, with_registry
from knobkeeper.engine.source import cached_wheel, installed_source, open_wheel
from knobkeeper.engine.versions import cache_dir, check_version, version_key
from knobkeeper.errors import UserError
from knobkeeper.fsio import atomic_write
from knobkeeper.knobs.values import ENV_NAME, TYPES

SCHEMA = "knobkeeper.engine-registry/1"
NEUTRAL_RISK = "unreviewed"
# Which catalog types can carry a value of each engine type without the engine rejecting it (an
# invalid value makes sglang warn and use its default, and vLLM fail to start: either way the
# setting does not do what was reviewed).
COMPATIBLE = {
    "bool": ("bool",),
    "int": ("int", "enum"),
    "float": ("float", "int"),
    "string": ("string", "enum", "secret"),
    "enum": ("enum",),
    "secret": ("secret",),
}

__all__ = ["COMPATIBLE", "Registry", "RegistryDiff", "SCHEMA", "cache_dir", "diff", "diff_registries", "dump",
           "generate", "hint", "imported_versions", "load_registry", "parse_registry", "registry_for",
           "registry_path", "version_key"]


def registry_family(engine: str):
    """The family of `engine` when it has a registry importer (else one line naming those that do)."""
    known = [f.name for f in with_registry()]
    fam = family(engine) if engine in known else None
    if fam is None:
        raise UserError(f"engine {engine!r}: no registry importer for it (known: {', '.join(known)})")
    return fam


# --- where files live --------------------------------------------------------------------------


def registry_dir(inventory_dir: Path) -> Path:
    return inventory_dir / "engines"


def registry_path(inventory_dir: Path, engine: str, version: str) -> Path:
    return registry_dir(inventory_dir) / f"{engine}-{version}.json"


# --- generating ----------------------------------------------------------------------------------


def generate(engine: str, version: str | None = None, wheel: Path | None = None, from_installed: bool = False,
             wheelhouse: Path | None = None) -> dict[str, Any]:
    """The registry document of one engine version, from exactly one of the three sources."""
    fam = registry_family(engine)
    reader = fam.registry
    chosen = [x for x in (version is not None, wheel is not None, from_installed) if x]
    if len(chosen) != 1:
        raise UserError("catalog import: give exactly one of --version V, --wheel PATH, --from-installed")
    if from_installed:
        source = installed_source(engine, reader.wheels, reader.top)
    else:
        path = wheel if wheel is not None else cached_wheel(reader.wheels, check_version(version), wheelhouse)
        source = open_wheel(path, reader.wheels, engine)
        if version is not None and source.version != version:
            raise UserError(f"{path}: holds {engine} {source.version}, not {version}")

    read = reader.read(source)
    what = f"{source.where}: {reader.file}"
    for name in read["knobs"]:
        if not ENV_NAME.fullmatch(name):
            raise UserError(f"{what}: variable name {name!r}: expected ^[A-Za-z_][A-Za-z0-9_]*$ (nothing imported)")
    text = source.text(reader.file) or ""
    return {
        "schema": SCHEMA,
        "generated": f"by `knobkeeper catalog import {engine}` from {reader.file}; do not edit",
        "engine": engine,
        "version": source.version,
        "source_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "count": len(read["knobs"]),
        "knobs": dict(sorted(read["knobs"].items())),
        "deprecated": read["deprecated"],
    }


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


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
        return difflib.get_close_matches(name, self.knobs, n=n, cutoff=0.6)

    def label(self) -> str:
        return f"{self.engine} {self.version}"


def parse_registry(doc: Any, where: str, engine: str | None = None, version: str | None = None) -> Registry:
    """A registry from its JSON document, every problem one line naming the file."""

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
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise bad(f"knob name {name!r}: expected ^[A-Za-z_][A-Za-z0-9_]*$")
        if not isinstance(entry, dict) or entry.get("type") not in TYPES:
            raise bad(f"knobs.{name}.type: expected one of {', '.join(TYPES)}")
        choices = entry.get("choices")
        if entry["type"] == "enum" and (not isinstance(choices, list) or not all(isinstance(c, str) for c in choices)):
            raise bad(f"knobs.{name}.choices: expected a list of strings for an enum")
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
    # "vllm-router-..." would match "vllm-": a version starts with a digit.
    return sorted((v for v in found if v[:1].isdigit() and _is_version(v)), key=version_key)


def _is_version(text: str) -> bool:
    try:
        check_version(text)
        return True
    except UserError:
        return False


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
    registry_family(engine)
    if inventory_dir is not None:
        found = load_registry(inventory_dir, engine, version)
        if found is not None:
            return found
    check_version(version)
    cached = cache_dir() / "registries" / f"{engine}-{version}.json"
    if cached.is_file():
        try:
            registry = parse_registry(json.loads(cached.read_text()), str(cached), engine, version)
            registry.path = cached
            return registry
        except (ValueError, UserError):
            pass  # a broken cache entry is regenerated
    doc = generate(engine, version=version, wheelhouse=wheelhouse)
    atomic_write(cached, dump(doc))
    registry = parse_registry(doc, str(cached), engine, version)
    registry.path = cached
    return registry


def newest_entry(inventory_dir: Path, name: str) -> tuple[Registry, dict[str, Any]] | None:
    """(registry, entry) of the newest imported registry (of any engine) that declares `name`."""
    for fam in with_registry():
        for version in reversed(imported_versions(inventory_dir, fam.name)):
            registry = load_registry(inventory_dir, fam.name, version)
            if registry is not None and name in registry:
                return registry, registry.knobs[name]
    return None


def hint(inventory_dir: Path, engine: str, name: str) -> str | None:
    """What the engine's own source said about `name` going away, in words (newest version first):
    "vllm 0.14.0: use --attention-config.backend (Using VLLM_ATTENTION_BACKEND ... is deprecated ...)"."""
    for version in reversed(imported_versions(inventory_dir, engine)):
        registry = load_registry(inventory_dir, engine, version)
        said = (registry.deprecated.get(name) if registry else None) or {}
        if said:
            replacement, note = said.get("replacement"), said.get("note")
            words = f"use {replacement}" if replacement else "deprecated"
            return f"{registry.label()}: {words}" + (f" ({note})" if note else "")
    return None


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
        out += [f"removed {n}" + (f" ({why})" if (why := self.why_removed(n)) else "") for n in self.removed]
        out += [f"added {n}" for n in self.added]
        out += [f"default {n}: {show_default(o)} -> {show_default(v)}" for n, o, v in self.defaults]
        out += [f"type {n}: {o} -> {v}" for n, o, v in self.types]
        return out

    def why_removed(self, name: str) -> str | None:
        """What either version's source says about it (the newer's removal table, or the older's deprecation)."""
        for registry in (self.new, self.old):
            said = registry.deprecated.get(name) or {}
            words = "; ".join(x for x in (f"use {said['replacement']}" if said.get("replacement") else None,
                                          said.get("note")) if x)
            if words:
                return f"{registry.label()}: {words}"
        return None


def default_of(entry: dict[str, Any]) -> Any:
    return ("computed", entry["default_computed"]) if "default_computed" in entry else entry.get("default")


def show_default(value: Any) -> str:
    if isinstance(value, tuple) and value and value[0] == "computed":
        return f"computed ({value[1]})"
    return json.dumps(value)


def diff_registries(old: Registry, new: Registry) -> RegistryDiff:
    """What changed from `old` to `new`. A rename is a removed name that `new` still accepts as an
    alias (EnvXWithAlias) or whose deprecation names the replacement variable."""
    gone = sorted(set(old.knobs) - set(new.knobs))
    came = sorted(set(new.knobs) - set(old.knobs))
    renamed: list[tuple[str, str]] = []
    aliases = {e["alias"]: n for n, e in new.knobs.items() if e.get("alias")}
    for name in gone:
        target = aliases.get(name) or (new.deprecated.get(name) or {}).get("replacement") \
            or (old.deprecated.get(name) or {}).get("replacement")
        if target and target in new.knobs and target != name:
            renamed.append((name, target))
    renamed_old = {o for o, _ in renamed}
    renamed_new = {n for _, n in renamed}
    both = sorted(set(old.knobs) & set(new.knobs))
    defaults = [(n, default_of(old.knobs[n]), default_of(new.knobs[n])) for n in both
                if default_of(old.knobs[n]) != default_of(new.knobs[n])]
    types = [(n, old.knobs[n]["type"], new.knobs[n]["type"]) for n in both if old.knobs[n]["type"] != new.knobs[n]["type"]]
    return RegistryDiff(old=old, new=new, added=[n for n in came if n not in renamed_new],
                        removed=[n for n in gone if n not in renamed_old], renamed=renamed, defaults=defaults, types=types)


def diff(engine: str, old_version: str, new_version: str, inventory_dir: Path | None = None,
         wheelhouse: Path | None = None) -> RegistryDiff:
    registry_family(engine)
    return diff_registries(registry_for(engine, old_version, inventory_dir, wheelhouse),
                           registry_for(engine, new_version, inventory_dir, wheelhouse))
