"""Engine families: one module per family owns every fact knobkeeper knows about that engine.

    family.py    what a family answers (the Family interface) and the value types it answers with
    sglang.py    SGLang: environ.py registry reader, launch command, prepare_server_args parser, PD pairing
    vllm.py      vLLM: envs.py registry reader, `vllm serve` command (NixlConnector), its CLI parser, PD pairing
    sim.py       the SIMULATED SGLang worker (knobkeeper/sim/), where a real engine cannot run
    routers.py   smg, sglang-router, vllm-router: their commands, /readiness and /workers
    source.py    reading an engine's own files from a wheel or the installed package, ast helpers
                 (nothing of the engine is ever imported or executed); versions.py: release versions, the cache dir
    pins.py      which engine and version each role runs, read from the inventories without pyinfra
    sideenv.py   a cached side environment per (engine, version) to run its own flag parser
    contract.py  `check`'s engine contract: every rendered command through its parser, PD pairing

Per family (see family.py): kind (worker | router), simulated, command and per-instance environment
and ports, health/readiness/workers endpoints, metric names (throughput counter, running/waiting
gauges, TTFT/ITL/TPOT histograms, finished/aborted requests), bench file format, registry reader
(ast only), flag parser (side environment), PD pairing rules.

Entry points for the rest of the tool, which never compares engine names:

    family(name)             the Family for an inventory's engines[role] name (UserError: unknown)
    role_engine(data, role)  THE answer to "which engine and version does `role` run" on a host
                             with `data`: engines[role] = "vllm==0.32.0" (engine and version in one
                             place), or "sglang" with the version in the family's own key
                             (`sglang_version`, as inventories before had it; still read); both given
                             and different is an error. The deploy (stack.py: Service.engine,
                             engine_version), `set`/`check`/`review` (pins.engine_pins), the deploy
                             record, `ab run` and `canary` evidence (setup.engine, engine_version),
                             reclaim's staleness check and the vLLM engine step (vllm_install) all
                             read it through this function.
    engine_version(data, engine)   the version a host's roles pin for `engine` (role_engine over them)
    engine_spec(engine, version)   the engines[role] text that pins it ("vllm==0.32.0"), for writers

Layering: families import only knobkeeper.errors and this package; knobs (registries, catalog) and
deploy import them. contract.py is the one module here that works on a deploy Stack, which its
callers pass in.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from knobkeeper.engine.family import Family
from knobkeeper.engine.routers import ROUTERS
from knobkeeper.engine.sglang import FAMILY as SGLANG
from knobkeeper.engine.sim import FAMILY as SIM
from knobkeeper.engine.versions import check_version
from knobkeeper.engine.vllm import FAMILY as VLLM
from knobkeeper.errors import UserError

FAMILIES: dict[str, Family] = {f.name: f for f in (SIM, SGLANG, VLLM, *ROUTERS.values())}


def family(name: Any, where: str = "engine") -> Family:
    """The family an inventory, a command line or a registry names; one line naming the accepted ones."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise UserError(f"{where} {name!r}: unknown engine (known: {', '.join(FAMILIES)})") from None


def with_registry() -> list[Family]:
    """The families whose variable registry `catalog import` reads."""
    return [f for f in FAMILIES.values() if f.registry is not None]


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
