"""Declared knobs judged against the engine versions the inventories pin, per stack and role.

The scope rule (see knobkeeper/knobs/__init__.py): a knob declared in [decode] reaches role decode of
the stack the inventories do not name; one in [vllm.decode] reaches role decode of stack "vllm"
(inventories whose data say stack = "vllm"). A knob whose catalog source names an engine (sglang,
vllm) is judged only against the services of that engine (the sim reads sglang's knobs); a knob
declared for a role whose services run another engine is a problem, not a silent no-op.

    settable(...)        `set` refuses a knob the pinned version does not declare (or declares with
                         another type), naming the version, close names and the replacement the
                         engine's source gave; --allow-undeclared for a knob whose source is a fork
    ignored_knobs(...)   one problem line per declared knob the pinned versions would ignore (check,
                         review and plan show them)
    catalog_type_problems(...)   catalog entries whose type disagrees with an engine registry's
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knobkeeper.engine import family
from knobkeeper.engine.pins import engine_pins, Pin, pins_for, stacks, unloadable_inventories
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.registry import COMPATIBLE, Registry, hint, load_registry
from knobkeeper.knobs.state import read_declared
from knobkeeper.knobs.values import split_scope, stack_hint


def role_words(stack: str, role: str) -> str:
    return f"role {role} of stack {stack}" if stack else f"role {role}"


def _type_line(where: str, knob: Any, registry: Registry) -> str | None:
    entry = registry.knobs[knob.name]
    engine_type = entry["type"]
    if knob.type not in COMPATIBLE.get(engine_type, ()):
        return (f"{where}knobs.{knob.name}.type = {knob.type!r}, but {registry.label()} reads it as "
                f"{engine_type} ({entry.get('kind')}); accepted: {', '.join(COMPATIBLE[engine_type])}")
    if engine_type == "enum" and knob.type == "enum":
        extra = [c for c in knob.choices if c not in entry.get("choices", [])]
        if extra:
            return (f"{where}knobs.{knob.name}.choices: {', '.join(extra)} not accepted by {registry.label()} "
                    f"(it accepts {', '.join(entry.get('choices', []))})")
    return None


def _readers(pins: list[Pin], engine: str) -> list[Pin]:
    """The pins whose engine reads `engine`'s knobs (the sim reads sglang's)."""
    return [p for p in pins if family(p.engine).reads_knobs_of == engine]


def _wrong_engine(name: str, engine: str, stack: str, role: str, pins: list[Pin], inventory_dir: Path) -> str:
    runs = ", ".join(sorted({f"{p.label()} (pinned in {p.inventory})" for p in pins}))
    elsewhere = sorted({p.stack for p in _engine_pins_of_role(inventory_dir, role) if p.stack != stack
                        and family(p.engine).reads_knobs_of == engine})
    return f"{name} is read by {engine}, but {role_words(stack, role)} runs {runs}{stack_hint(elsewhere, 'declare it')}"


def _engine_pins_of_role(inventory_dir: Path, role: str) -> list[Pin]:
    return [p for p in engine_pins(inventory_dir) if p.role == role]


def _pinned_registries(inventory_dir: Path, engine: str, stack: str, role: str,
                       pins: list[Pin]) -> list[tuple[Pin, Registry]]:
    out = []
    for pin in pins:
        if pin.engine != engine:
            continue  # the sim: it reads sglang's knobs, but has no version to judge them by
        if pin.version is None:
            key = family(engine).version_key
            raise UserError(f"{pin.inventory}: hosts {', '.join(pin.hosts)} run {engine} for {role_words(stack, role)} "
                            f"without a version; pin it (engines[{role!r}] = '{engine}==V', or {key})")
        registry = load_registry(inventory_dir, engine, pin.version)
        if registry is None:
            raise UserError(f"{pin.inventory}: {role_words(stack, role)} runs {engine} {pin.version}, which has no "
                            f"registry in {inventory_dir.name}/engines/; run `knobkeeper catalog import {engine} "
                            f"--version {pin.version}`")
        out.append((pin, registry))
    return out


def check_stack(inventory_dir: Path, stack: str) -> None:
    """A stack some inventory names ("" always passes: the inventories that name none)."""
    known = [s for s in stacks(inventory_dir) if s]
    if stack and stack not in known:
        raise UserError(f"stack {stack!r}: no inventory names it (data stack = ...; stacks: "
                        f"{', '.join(known) or 'none named'})")


def settable(inventory_dir: Path, knob: Any, scope: str, allow_undeclared: bool | None = None) -> list[str]:
    """Refuse (UserError) a knob the version pinned for the scope's role does not declare, or
    declares with another type; returns warnings for an undeclared knob that was allowed.

    Allowed only when the catalog entry's source says where else it comes from (a fork, a build, a PR)
    AND `allow_undeclared` is true. None (library callers) leaves the decision to the catalog's source;
    the CLI passes its --allow-undeclared flag.
    """
    stack, role = split_scope(scope)
    broken = unloadable_inventories(inventory_dir)
    if broken:  # what it pins is unknown, so the knob cannot be judged against it
        raise UserError(f"{broken[0]}; fix the inventory first (a knob is judged against what every inventory runs)")
    check_stack(inventory_dir, stack)
    engine = knob.engine
    if engine is None:
        return []
    pins = pins_for(inventory_dir, stack, role)
    if pins and not _readers(pins, engine):
        raise UserError(_wrong_engine(knob.name, engine, stack, role, pins, inventory_dir))
    warnings = []
    for pin, registry in _pinned_registries(inventory_dir, engine, stack, role, pins):
        if knob.name in registry:
            line = _type_line(f"{inventory_dir.name}/catalog.toml: ", knob, registry)
            if line:
                raise UserError(line)
            continue
        where = f"{registry.label()} (pinned for {role_words(stack, role)} in {pin.inventory})"
        said = hint(inventory_dir, engine, knob.name)
        close = registry.close(knob.name)
        hints = (f"; {said}" if said else "") + (f"; close names it declares: {', '.join(close)}" if close else "")
        if not knob.names_other_origin():
            raise UserError(f"{knob.name}: {where} does not declare it{hints}; if it comes from a fork, a build or a "
                            f"PR, say so in the catalog entry's source and pass --allow-undeclared")
        if allow_undeclared is False:
            raise UserError(f"{knob.name}: {where} does not declare it{hints}; its catalog source is "
                            f"{knob.source!r}: pass --allow-undeclared to set it anyway")
        warnings.append(f"{knob.name}: not declared by {where}; set anyway (catalog source: {knob.source})")
    return list(dict.fromkeys(warnings))  # hosts of one inventory with different knob_defaults are pins apart


def ignored_knobs(project: Any, include_other_origin: bool = False) -> list[str]:
    """One problem line per declared knob (inventory/knobs.toml) that the versions pinned for its
    scope would ignore: not declared by them, declared with a type the catalog's value cannot
    satisfy, or declared for a role whose services run another engine.

    Knobs whose catalog source names another origin (a fork, a build, a PR: set with
    --allow-undeclared) are left out unless `include_other_origin`.
    """
    catalog = load_catalog(project.catalog_path)
    declared = read_declared(project.knobs_path, catalog)
    inventory_dir = project.inventory_dir
    knobs_rel, catalog_rel = project.rel(project.knobs_path), project.rel(project.catalog_path)
    problems: list[str] = []
    for key in sorted(declared):
        stack, role = split_scope(key)
        try:
            check_stack(inventory_dir, stack)
        except UserError as exc:
            if declared[key]:
                problems.append(f"{knobs_rel}: [{key}]: {exc}")
            continue
        pins = pins_for(inventory_dir, stack, role)
        for name in sorted(declared[key]):
            knob = catalog.for_role(name, key)
            engine = knob.engine
            where = f"{knobs_rel}: [{key}] {name}"
            if engine is None:
                continue
            if pins and not _readers(pins, engine):
                problems.append(f"{where}: {_wrong_engine(name, engine, stack, role, pins, inventory_dir)}; "
                                f"the engine would ignore it")
                continue
            try:
                pinned = _pinned_registries(inventory_dir, engine, stack, role, pins)
            except UserError as exc:
                problems.append(str(exc))
                continue
            for pin, registry in pinned:
                if name in registry:
                    line = _type_line(f"{where}: {catalog_rel}: ", knob, registry)
                    if line:
                        problems.append(line)
                elif include_other_origin or not knob.names_other_origin():
                    said = hint(inventory_dir, engine, name)
                    close = registry.close(name)
                    extra = "; ".join(x for x in (said, f"close names it declares: {', '.join(close)}" if close else None) if x)
                    problems.append(f"{where}: {registry.label()} (pinned in {pin.inventory}) does not declare it; "
                                    f"the engine would ignore it" + (f" ({extra})" if extra else ""))
    return list(dict.fromkeys(problems))


def catalog_type_problems(catalog: Any, registry: Registry) -> list[str]:
    """Catalog entries whose type disagrees with the engine's (one line each)."""
    where = f"{catalog.path.parent.name}/{catalog.path.name}: " if catalog.path else ""
    return [line for knob in catalog.knobs.values()
            if knob.name in registry and knob.engine == registry.engine
            for line in [_type_line(where, knob, registry)] if line]
