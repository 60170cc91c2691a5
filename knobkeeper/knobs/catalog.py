"""The knob catalog (inventory/catalog.toml): what may be set, with which type, range and roles.

Every other part asks the catalog; knob types live nowhere else.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobkeeper import fmt
from knobkeeper.engine import family, with_registry
from knobkeeper.engine.pins import engine_pins, engine_roles
from knobkeeper.errors import UserError
from knobkeeper.knobs.registry import load_registry, NEUTRAL_RISK, newest_entry, version_key
from knobkeeper.knobs.values import ENV_NAME, TYPES, check_env_name, role_of  # noqa: F401 (the catalog's vocabulary)
from knobkeeper.tomlio import read_toml

RISKS = ("perf", "numerics", "behaviour")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

Value = int | float | bool | str


def fingerprint(secret: str | bytes) -> str:
    """What the changelog and knobs.toml hold instead of a secret's value."""
    data = secret.encode() if isinstance(secret, str) else secret
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{16}")

# What the catalog documents for int and float values typed by people: plain ASCII decimal,
# optional sign; a float may have a fraction and an exponent. Not Python's int()/float(), which
# also take 1_000, 0x10, non-ASCII digits, " 1 ", inf and nan.
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,60}")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def is_fingerprint(value: Any) -> bool:
    return isinstance(value, str) and _FINGERPRINT.fullmatch(value) is not None


@dataclass(frozen=True)
class Knob:
    name: str
    type: str
    roles: tuple[str, ...]
    risk: str
    doc: str
    source: str
    unset: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    default: Value | None = None

    @property
    def secret(self) -> bool:
        return self.type == "secret"

    @property
    def engine(self) -> str | None:
        """The engine family whose releases read it, when its `source` names one first ("sglang",
        "sglang fork", "vllm PR 123"); None for a knob of no engine (nccl, a kernel, the hub client)."""
        first = re.split(r"[^A-Za-z0-9_]", self.source.strip(), maxsplit=1)[0].lower()
        return first if first in {f.name for f in with_registry()} else None

    def names_other_origin(self) -> bool:
        """Whether its source says it comes from somewhere other than the engine's releases (a fork,
        a build, a PR): what --allow-undeclared needs."""
        return self.engine is not None and self.source.strip().lower() != self.engine

    def accepted(self) -> str:
        """Words for what this knob accepts, for error messages."""
        if self.type in ("int", "float"):
            lo = "-inf" if self.min is None else fmt.plain_number(self.min)
            hi = "inf" if self.max is None else fmt.plain_number(self.max)
            return f"{'an integer' if self.type == 'int' else 'a number'} in [{lo}, {hi}]"
        if self.type == "bool":
            return "true or false"
        if self.type == "enum":
            return "one of " + ", ".join(self.choices)
        if self.type == "secret":
            return "a secret string (stored outside git)"
        return "a string (no NUL bytes)"

    def parse(self, raw: str) -> Value:
        """A command-line value (always text) to this knob's type, or UserError."""
        bad = UserError(f"{self.name}={'(not shown)' if self.secret else fmt.safe(fmt.short(repr(raw), 80))}: "
                        f"expected {self.accepted()}")
        if self.type == "int":
            if not _INT_TEXT.fullmatch(raw.strip()):
                raise bad
            value: Value = int(raw.strip())
        elif self.type == "float":
            if not _FLOAT_TEXT.fullmatch(raw.strip()):
                raise bad
            value = float(raw.strip())
        elif self.type == "bool":
            low = raw.strip().lower()
            if low not in _TRUE | _FALSE:
                raise bad
            value = low in _TRUE
        else:
            value = raw
        return self.check(value)

    def check(self, value: Any) -> Value:
        """A typed value (from TOML or parse) checked against type, range and choices."""
        bad = UserError(f"{self.name}={'(not shown)' if self.secret else fmt.safe(fmt.short(repr(value), 80))}: "
                        f"expected {self.accepted()}")
        if self.type == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad
        elif self.type == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad
            value = float(value)
            if not math.isfinite(value):
                raise bad
        elif self.type == "bool":
            if not isinstance(value, bool):
                raise bad
        elif self.type == "enum":
            if value not in self.choices:
                raise bad
        elif not isinstance(value, str) or "\x00" in value:
            raise bad
        if self.type in ("int", "float"):
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                raise bad
        return value

    def from_data(self, value: Any) -> Value:
        """A value from an inventory's data (knob_defaults, a run's overrides): text for a typed knob
        is parsed as on the command line, anything else checked as from TOML; UserError if bad."""
        return self.parse(value) if isinstance(value, str) and self.type not in ("string", "enum") else self.check(value)

    def render_value(self, value: Value) -> str:
        """The text the process sees in its environment."""
        if isinstance(value, bool):
            return "1" if value else "0"
        return str(value)

    def display(self, value: Value | None) -> str:
        """How a value is shown to people and written to commit messages (secrets: fingerprint only)."""
        if self.secret and value is not None and not is_fingerprint(value):
            return fingerprint(str(value))
        return fmt.value(value)


@dataclass
class Catalog:
    knobs: dict[str, Knob] = field(default_factory=dict)
    path: Path | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.knobs

    def get(self, name: str) -> Knob:
        """The knob, or a UserError that suggests close names."""
        try:
            return self.knobs[name]
        except KeyError:
            extra = self.registry_knob(name)
            if extra is not None:
                return extra
            close = difflib.get_close_matches(name, self.knobs, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see `knobkeeper catalog`"
            where = f" ({self.path})" if self.path else ""
            raise UserError(f"unknown knob {name!r}: not in the catalog{where}{hint}") from None

    def _registry_entry(self, name: str) -> tuple[Any, dict, tuple[str, ...]] | None:
        """(registry, its entry, the roles that run its engine) of a knob only an imported engine
        registry declares (newest version first), or None."""
        if self.path is None or not ENV_NAME.fullmatch(name):
            return None

        inventory_dir = self.path.parent
        found = newest_entry(inventory_dir, name)
        if found is None:
            return None
        registry, entry = found
        roles = engine_roles(inventory_dir, registry.engine)
        return (registry, entry, roles) if roles else None

    def registry_of(self, name: str) -> str | None:
        """Where a knob not curated here comes from, in words ("vllm 0.32.0"): the pinned versions of
        its engine whose registry declares it, else the newest imported one (the one `get` reads);
        None for a knob neither the catalog nor a registry declares."""
        found = None if name in self.knobs else self._registry_entry(name)
        if found is None:
            return None

        engine, inventory_dir = found[0].engine, self.path.parent  # type: ignore[union-attr]
        pinned = {p.version for p in engine_pins(inventory_dir) if p.engine == engine and p.version}
        declaring = sorted((v for v in pinned if name in (load_registry(inventory_dir, engine, v) or ())), key=version_key)
        return f"{engine} {', '.join(declaring)}" if declaring else found[0].label()

    def registry_knob(self, name: str) -> Knob | None:
        """A knob only an imported engine registry (inventory/engines/) declares, newest version first;
        loaded on a miss only. It gets the registry's type, risk "unreviewed" and every role that runs
        the engine, until a person curates it here."""
        found = self._registry_entry(name)
        if found is None:
            return None
        registry, entry, roles = found
        default = entry.get("default")
        shown_default = entry.get("default_computed") or ("(none)" if default is None else json.dumps(default))
        knob = Knob(name=name, type=entry["type"], roles=roles, risk=NEUTRAL_RISK,
                    doc=entry.get("doc") or f"(no comment in {registry.label()}'s {family(registry.engine).registry.file})",
                    source=registry.engine, unset=f"the engine default: {shown_default}",
                    choices=tuple(entry.get("choices") or ()))
        if default is not None and not isinstance(default, (list, dict)):
            try:
                knob = Knob(**{**knob.__dict__, "default": knob.check(default)})
            except UserError:
                pass  # an engine default outside the catalog's type (e.g. -1 for a float) stays documentation
        return knob

    def for_role(self, name: str, role: str) -> Knob:
        """The knob, if it applies to `role` (a role, or a scope "stack.role": see knobs.values)."""
        knob = self.get(name)
        role = role_of(role)
        if role not in knob.roles:
            raise UserError(f"{name} does not apply to role {role!r}: it applies to {', '.join(knob.roles)}")
        return knob

    def roles(self) -> list[str]:
        seen: list[str] = []
        for knob in self.knobs.values():
            seen.extend(r for r in knob.roles if r not in seen)
        return seen


def load_catalog(path: Path) -> Catalog:
    """Parse and validate catalog.toml; every problem names the file and the knob's field."""
    data = read_toml(path, missing="catalog not found")
    table = data.get("knobs")
    if not isinstance(table, dict) or not table:
        raise UserError(f"{path}: needs a [knobs.NAME] table per knob")
    catalog = Catalog(path=path)
    for name, spec in table.items():
        check_env_name(name, f"{path}: [knobs.NAME] table")
        catalog.knobs[name] = _knob_from_toml(path, name, spec)
    return catalog


def _knob_from_toml(path: Path, name: str, spec: Any) -> Knob:
    def bad(fieldname: str, accepted: str) -> UserError:
        return UserError(f"{path}: knobs.{name}.{fieldname}: expected {accepted}")

    if not isinstance(spec, dict):
        raise bad("", "a table")
    known = {"type", "roles", "risk", "doc", "source", "unset", "min", "max", "choices", "default"}
    for key in spec:
        if key not in known:
            raise bad(key, "no such field (fields: " + ", ".join(sorted(known)) + ")")
    kind = spec.get("type")
    if kind not in TYPES:
        raise bad("type", "one of " + ", ".join(TYPES))
    roles = spec.get("roles")
    if not isinstance(roles, list) or not roles or not all(isinstance(r, str) and r for r in roles):
        raise bad("roles", "a non-empty list of role names")
    if spec.get("risk") not in RISKS:
        raise bad("risk", "one of " + ", ".join(RISKS))
    for text_field in ("doc", "source", "unset"):
        if not isinstance(spec.get(text_field), str) or not spec[text_field].strip():
            raise bad(text_field, "a non-empty string")
    for bound in ("min", "max"):
        if bound in spec:
            if kind not in ("int", "float"):
                raise bad(bound, f"no {bound} on a {kind} knob")
            if isinstance(spec[bound], bool) or not isinstance(spec[bound], (int, float)) or not math.isfinite(spec[bound]):
                raise bad(bound, "a finite number")
    if "min" in spec and "max" in spec and spec["min"] > spec["max"]:
        raise bad("max", f"a number >= min ({spec['min']})")
    choices = spec.get("choices", [])
    if kind == "enum":
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise bad("choices", "a non-empty list of strings")
    elif "choices" in spec:
        raise bad("choices", "choices only on an enum knob")
    knob = Knob(
        name=name,
        type=kind,
        roles=tuple(roles),
        risk=spec["risk"],
        doc=spec["doc"],
        source=spec["source"],
        unset=spec["unset"],
        min=spec.get("min"),
        max=spec.get("max"),
        choices=tuple(choices),
    )
    if "default" in spec:
        try:
            default = knob.check(spec["default"])
        except UserError:
            raise bad("default", knob.accepted()) from None
        knob = Knob(**{**knob.__dict__, "default": default})
    return knob
