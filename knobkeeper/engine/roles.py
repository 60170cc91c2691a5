"""Which family a name is, and which engine and version a role runs: the entry points the package's
doc names (family, role_engine, engine_version, engine_spec), apart from the family modules so
that a family's own helpers (vllm_install, the engine step) can ask them without a circle.

FAMILIES is filled by knobkeeper.engine (its __init__, which imports every family module, so it is
full whenever any of these functions can be called: Python imports a package before its modules).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from knobkeeper.engine.family import Family
from knobkeeper.engine.versions import check_version
from knobkeeper.errors import UserError

FAMILIES: dict[str, Family] = {}   # name -> family, in the order knobkeeper.engine lists them


def family(name: Any, where: str = "engine") -> Family:
    """The family an inventory, a command line or a registry names; one line naming the accepted ones."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise UserError(f"{where} {name!r}: unknown engine (known: {', '.join(FAMILIES)})") from None


class EnginePin(NamedTuple):
    family: Family
    version: str | None  # None: the inventory runs the engine without pinning a version

    @property
    def engine(self) -> str:
        return self.family.name

    def label(self) -> str:
        return f"{self.engine} {self.version}" if self.version else f"{self.engine} (version not pinned)"


def role_engine(data: Mapping[str, Any], role: str, where: str = "") -> EnginePin | None:
    """Which engine and version `role` runs on a host with `data` (None: the host does not run it)."""
    engines = data.get("engines") or {}
    if not isinstance(engines, Mapping):
        raise UserError(f"{where or 'host'}: data engines: expected a dict keyed by role")
    spec = engines.get(role)
    if spec is None:
        return None
    label = f"{where + ': ' if where else ''}data engines[{role!r}]"
    if not isinstance(spec, str):
        raise UserError(f"{label} = {spec!r}: expected an engine name, optionally with ==VERSION (e.g. 'vllm==0.32.0')")
    name, _, version = (part.strip() for part in spec.partition("=="))
    fam = family(name, label + " =")
    legacy = _legacy_version(fam, data)
    if version and legacy and version != legacy:
        raise UserError(f"{label} = {spec!r} but data {fam.version_key} = {legacy!r}: the pins disagree; keep one "
                        f"(engines[{role!r}] = '{fam.name}=={legacy}', or drop {fam.version_key})")
    version = version or legacy
    if version:
        try:
            check_version(version)
        except UserError:
            raise UserError(f"{label} = {spec!r}: version {version!r}: expected a release like 0.32.0") from None
    return EnginePin(fam, version or None)


def _legacy_version(fam: Family, data: Mapping[str, Any]) -> str | None:
    """The version in the family's own datum (`vllm_version`), the form inventories had before engines[role]."""
    legacy = data.get(fam.version_key) if fam.version_key else None
    return None if legacy is None else str(legacy)


def engine_version(data: Mapping[str, Any], engine: str, where: str = "") -> str | None:
    """The version a host with `data` pins for `engine`: role_engine over every role its engines name
    that runs it; a host none of whose roles names it (data without `engines`, as older callers
    pass) falls back to the family's own datum. Roles that pin different versions are an error:
    one host installs one environment per engine version."""
    fam = family(engine)
    engines = data.get("engines") or {}
    pins = [pin for role in (engines if isinstance(engines, Mapping) else ())
            for pin in [role_engine(data, role, where)] if pin is not None and pin.family is fam]
    if not pins:
        return _legacy_version(fam, data)
    versions = sorted({pin.version for pin in pins if pin.version})
    if len(versions) > 1:
        raise UserError(f"{where or 'host'}: data engines: {fam.name} {' and '.join(versions)} on one host; "
                        f"pin one version per host")
    return versions[0] if versions else None


def engine_spec(engine: str, version: str | None) -> str:
    """What engines[role] says to pin `engine` at `version` ("vllm==0.32.0"; the name alone without one)."""
    return f"{family(engine).name}=={version}" if version else family(engine).name
