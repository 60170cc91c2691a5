"""Which engine and version each role of each stack runs, read from the inventories without pyinfra.

Inventories are pyinfra inventory files (inventory/*.py: a list of hosts per group, a host being
NAME or (NAME, {data})) with group data in inventory/group_data/ (all.py, then <group>.py, then the
host's own data win, as in pyinfra). They are read with runpy, not pyinfra: pyinfra's import alone
costs ~300 ms, which `set` would pay on every call. Each host's role is judged by the one function,
knobkeeper.engine.role_engine; its stack is data `stack` ("" when the inventory names none); what it
runs for the knobs knobs.toml does not declare, data `knob_defaults` (deploy/render.py applies them).

An inventory that does not load (a syntax error, an exception) is left out of the pins, so that the
others are still judged and rendered; `unloadable_inventories` names it, file and line, and `set`
refuses while there is one (knobkeeper.knobs.pinned.settable). Group data that does not load leaves
every inventory out.
"""

from __future__ import annotations

import os
import runpy
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from knobkeeper.engine import role_engine
from knobkeeper.engine.versions import version_key
from knobkeeper.errors import UserError, code_error

STACK_KEY = "stack"


class Pin(NamedTuple):
    stack: str  # "" : the inventory names no stack
    role: str
    engine: str
    version: str | None
    inventory: str  # e.g. inventory/example_prod.py
    hosts: tuple[str, ...]
    # data knob_defaults[role] on these hosts, as (KNOB, value) pairs: what the role runs where
    # knobs.toml declares no value (hosts of one inventory that differ are separate pins)
    knob_defaults: tuple[tuple[str, Any], ...] = ()

    def label(self) -> str:
        return f"{self.engine} {self.version}" if self.version else self.engine


def stack_of(data: dict[str, Any], where: str) -> str:
    name = data.get(STACK_KEY) or ""
    if not isinstance(name, str) or (name and not name.replace("-", "").replace("_", "").isalnum()):
        raise UserError(f"{where}: data {STACK_KEY} = {name!r}: expected a name ([A-Za-z0-9_-]), e.g. 'vllm'")
    return name


def _module_data(path: Path, rel: str) -> dict[str, Any]:
    try:
        return {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("_")}
    except Exception as exc:  # an inventory is user code; its error becomes one line naming its line
        raise UserError(code_error(rel, exc, path)) from None


def engine_pins(inventory_dir: Path) -> list[Pin]:
    """Every (stack, role, engine, version) some inventory that loads runs (see _read_pins)."""
    return _pins_and_errors(inventory_dir)[0]


def unloadable_inventories(inventory_dir: Path) -> list[str]:
    """One line per inventory (or group data file) that does not load: `inventory/new.py: line 3:
    SyntaxError: invalid syntax`."""
    return list(_pins_and_errors(inventory_dir)[1])


def _pins_and_errors(inventory_dir: Path) -> tuple[list[Pin], tuple[str, ...]]:
    """Re-read only when an inventory file or a KNOBKEEPER_* variable changed (the local inventories
    read theirs: knobkeeper.inventory_env)."""
    if not inventory_dir.is_dir():
        return [], ()
    files = sorted([*inventory_dir.glob("*.py"), *inventory_dir.glob("group_data/*.py")])
    signature = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("KNOBKEEPER_")))
    return _read_pins(inventory_dir, signature, environment)


def _defaults_of(data: dict[str, Any], role: str) -> tuple[tuple[str, Any], ...]:
    """data knob_defaults[role] as sorted (KNOB, value) pairs; values render.py would refuse (not a
    scalar) are left out: the render names them."""
    table = data.get("knob_defaults")
    inner = table.get(role) if isinstance(table, dict) else None
    if not isinstance(inner, dict):
        return ()
    return tuple(sorted((k, v) for k, v in inner.items() if isinstance(k, str) and isinstance(v, (str, int, float, bool))))


@lru_cache(maxsize=8)
def _read_pins(inventory_dir: Path, signature: tuple, _environment: tuple) -> tuple[list[Pin], tuple[str, ...]]:
    group_dir = inventory_dir / "group_data"
    groups_data: dict[str, dict[str, Any]] = {}
    try:
        if group_dir.is_dir():
            for path in sorted(group_dir.glob("*.py")):
                groups_data[path.stem] = _module_data(path, f"{inventory_dir.name}/group_data/{path.name}")
    except UserError as exc:
        return [], (str(exc),)
    table: dict[tuple, list[str]] = {}
    broken: list[str] = []
    for path in sorted(inventory_dir.glob("*.py")):
        rel = f"{inventory_dir.name}/{path.name}"
        try:
            found = _inventory_pins(rel, _module_data(path, rel), groups_data)
        except UserError as exc:  # it does not load, or a host's engines/stack is wrong: left out, named
            broken.append(str(exc))
            continue
        for key, name in found:
            table.setdefault(key, []).append(name)
    pins = [Pin(s, r, e, v, inv, tuple(h), d) for (s, r, e, v, inv, d), h in table.items()]
    return pins, tuple(broken)


def _inventory_pins(rel: str, groups: dict[str, Any], groups_data: dict[str, dict[str, Any]]) -> list[tuple[tuple, str]]:
    """(pin key, host name) of every host of one inventory that runs an engine for its group."""
    out = []
    for group, hosts in groups.items():
        if not isinstance(hosts, (list, tuple)):
            continue
        for host in hosts:
            name, data = (host if isinstance(host, tuple) and len(host) == 2 else (host, {}))
            if not isinstance(name, str) or not isinstance(data, dict):
                continue
            merged = {**groups_data.get("all", {}), **groups_data.get(group, {}), **data}
            where = f"{rel}: host {name}"
            pin = role_engine(merged, group, where)
            if pin is None:
                continue
            out.append(((stack_of(merged, where), group, pin.engine, pin.version, rel, _defaults_of(merged, group)), name))
    return out


def inventory_key(inventory_dir: Path, inventory: str | os.PathLike) -> str | None:
    """How a Pin names `inventory` ("inventory/<name>.py") in whatever spelling a command was given it:
    relative to the repo root as `inventory/<name>.py` or `./inventory/<name>.py`, or absolute. None when it is
    not one of the inventory folder's own files (the only ones read for pins)."""
    path = Path(inventory)
    if not path.is_absolute():
        path = inventory_dir.parent / path   # commands resolve an inventory against the repo root
    try:
        path, folder = path.resolve(), inventory_dir.resolve()
    except (OSError, RuntimeError):   # a symlink loop
        return None
    if path.parent != folder or path.suffix != ".py":
        return None
    return f"{inventory_dir.name}/{path.name}"


def stacks(inventory_dir: Path) -> list[str]:
    """The stack names the inventories use ("" for those that name none), in first-seen order."""
    return list(dict.fromkeys(p.stack for p in engine_pins(inventory_dir)))


def pins_for(inventory_dir: Path, stack: str, role: str) -> list[Pin]:
    return [p for p in engine_pins(inventory_dir) if p.stack == stack and p.role == role]


def engine_roles(inventory_dir: Path, engine: str) -> tuple[str, ...]:
    """The roles (of any stack) some inventory runs `engine` for."""
    return tuple(dict.fromkeys(p.role for p in engine_pins(inventory_dir) if p.engine == engine))


def engine_versions(inventory_dir: Path, engine: str, *, host: str | None = None,
                    inventory: str | None = None) -> list[str]:
    """The versions of `engine` the inventories pin, in release order: only for the roles `host` plays
    (e.g. "@local", this machine) and only in `inventory` ("inventory/local_vllm.py"), when given."""
    return sorted({p.version for p in engine_pins(inventory_dir) if p.engine == engine and p.version
                   and (host is None or host in p.hosts) and (inventory is None or p.inventory == inventory)},
                  key=version_key)


def stack_engine(stack: Any, role: str) -> tuple[str, str | None]:
    """(engine, version) the services of `role` in a deploy Stack run, as role_engine said when the
    stack was built; several of either are joined with ", " (an inventory mixing them)."""
    services = [s for s in stack.services if s.role == role]
    engines = sorted({s.engine for s in services})
    versions = sorted({s.engine_version for s in services if s.engine_version})
    return ", ".join(engines) or "unknown", ", ".join(versions) or None


def evidence_setup(stack: Any, role: str) -> dict[str, str | None]:
    """What `ab run` and `canary` evidence record of the engine: setup.engine, setup.engine_version
    (what reclaim's staleness check compares with the pin of today) and setup.stack where the
    inventory names one."""
    engine, version = stack_engine(stack, role)
    out: dict[str, str | None] = {"engine": engine, "engine_version": version}
    if getattr(stack, "stack", ""):
        out["stack"] = stack.stack
    return out
