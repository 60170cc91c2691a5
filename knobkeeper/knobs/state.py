"""Declared knob state (inventory/knobs.toml): one table per role, edited with comments and order kept.

    [decode]                      role decode of the stack the inventories do not name
    SGLANG_SM120_MMA_TARGET_CTAS = 512

    [vllm.decode]                 role decode of stack "vllm" (inventories with data stack = "vllm")
    VLLM_CPU_OMP_THREADS_BIND = "auto"

A top-level table holding only tables is a stack; one holding values (or nothing) is a role. The
declared state is keyed by scope ("decode", "vllm.decode": knobkeeper.knobs.values).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit

from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import Catalog, Value, is_fingerprint
from knobkeeper.knobs.values import scope, split_scope
from knobkeeper.tomlio import read_toml

Declared = dict[str, dict[str, Value]]


def _is_stack(table: dict) -> bool:
    return bool(table) and all(isinstance(v, dict) for v in table.values())


def _tables(path: Path, data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(scope, table) of every role table, stacks' role tables included."""
    out = []
    for key, table in data.items():
        if not isinstance(table, dict):
            raise UserError(f"{path}: {key} = ...: expected a [{key}] table of KNOB = value")
        if _is_stack(table):
            for role, inner in table.items():
                if any(isinstance(v, dict) for v in inner.values()):
                    raise UserError(f"{path}: [{key}.{role}]: expected KNOB = value lines (a stack holds role tables)")
                out.append((scope(key, role), inner))
        else:
            nested = [k for k, v in table.items() if isinstance(v, dict)]
            if nested:
                raise UserError(f"{path}: [{key}] {nested[0]}: expected a value, got a table ([{key}] is a role; "
                                f"a stack's tables are [STACK.ROLE] and hold no values of their own)")
            out.append((key, table))
    return out


def read_declared(path: Path, catalog: Catalog | None = None) -> Declared:
    """{scope: {knob: value}}; with a catalog, every value is checked against it."""
    data = read_toml(path, missing="declared state not found (create it with one [role] table per role)")
    return declared_from(path, data, catalog)


def declared_from(path: Path, data: dict[str, Any], catalog: Catalog | None = None) -> Declared:
    """The declared state of knobs.toml's parsed TOML `data` (e.g. as committed at HEAD)."""
    declared: Declared = {}
    for key, table in _tables(path, data):
        for name, value in table.items():
            if catalog is not None:
                try:
                    knob = catalog.for_role(name, key)
                    if not knob.secret:
                        knob.check(value)
                    elif not is_fingerprint(value):
                        raise UserError(f"{name}: plaintext value for secret knob {name} (not shown); "
                                        f"knobs.toml holds only its fingerprint (sha256:...)")
                except UserError as exc:
                    raise UserError(f"{path}: [{key}] {exc}") from None
        declared[key] = dict(table)
    return declared


def load_document(path: Path) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: declared state not found") from None
    except tomlkit.exceptions.ParseError as exc:
        raise UserError(f"{path}: malformed TOML: {exc}") from None


def with_value(document: tomlkit.TOMLDocument, key: str, name: str, value: Value | None) -> str:
    """The file's new text with knob `name` of scope `key` set to `value` (None removes it); the rest untouched."""
    stack, role = split_scope(key)
    parent: Any = document
    if stack:
        if stack not in document:
            document.add(tomlkit.nl())
            document.add(stack, tomlkit.table(is_super_table=True))
        parent = document[stack]
    if role not in parent:
        if not stack:
            document.add(tomlkit.nl())
        parent.add(role, tomlkit.table())
    table: Any = parent[role]
    if value is None:
        if name in table:
            del table[name]
    else:
        table[name] = value
    return tomlkit.dumps(document)


def value_of(declared: Declared, key: str, name: str) -> Value | None:
    return declared.get(key, {}).get(name)
