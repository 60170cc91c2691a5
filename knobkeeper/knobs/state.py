"""Declared knob state (inventory/knobs.toml): one table per role, edited with comments and order kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit

from knobkeeper.errors import UserError
from knobkeeper.tomlio import read_toml
from knobkeeper.knobs.catalog import Catalog, Value, is_fingerprint

Declared = dict[str, dict[str, Value]]


def read_declared(path: Path, catalog: Catalog | None = None) -> Declared:
    """{role: {knob: value}}; with a catalog, every value is checked against it."""
    data = read_toml(path, missing="declared state not found (create it with one [role] table per role)")
    declared: Declared = {}
    for role, table in data.items():
        if not isinstance(table, dict):
            raise UserError(f"{path}: {role} = ...: expected a [{role}] table of KNOB = value")
        for name, value in table.items():
            if isinstance(value, dict):
                raise UserError(f"{path}: [{role}] {name}: expected a value, got a table")
            if catalog is not None:
                try:
                    knob = catalog.for_role(name, role)
                    if not knob.secret:
                        knob.check(value)
                    elif not is_fingerprint(value):
                        raise UserError(f"{name}: plaintext value for secret knob {name} (not shown); "
                                        f"knobs.toml holds only its fingerprint (sha256:...)")
                except UserError as exc:
                    raise UserError(f"{path}: [{role}] {exc}") from None
        declared[role] = dict(table)
    return declared


def load_document(path: Path) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: declared state not found") from None
    except tomlkit.exceptions.ParseError as exc:
        raise UserError(f"{path}: malformed TOML: {exc}") from None


def with_value(document: tomlkit.TOMLDocument, role: str, name: str, value: Value | None) -> str:
    """The file's new text with `role.name` set to `value` (None removes it); the rest untouched."""
    if role not in document:
        document.add(tomlkit.nl())
        document.add(role, tomlkit.table())
    table: Any = document[role]
    if value is None:
        if name in table:
            del table[name]
    else:
        table[name] = value
    return tomlkit.dumps(document)


def value_of(declared: Declared, role: str, name: str) -> Value | None:
    return declared.get(role, {}).get(name)
