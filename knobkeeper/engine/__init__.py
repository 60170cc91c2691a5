"""Engine families: one module per family owns every fact knobkeeper knows about that engine.

    family.py    what a family answers (the Family interface) and the value types it answers with
    sglang.py    SGLang: environ.py registry reader, launch command, prepare_server_args parser, PD pairing
    vllm.py      vLLM: envs.py registry reader, `vllm serve` command (NixlConnector), its CLI parser, PD pairing
    sim.py       the SIMULATED SGLang worker (knobkeeper/sim/), where a real engine cannot run
    routers.py   smg, sglang-router, vllm-router: their commands, /readiness and /workers
    source.py    reading an engine's own files from a wheel or the installed package, ast helpers
                 (nothing of the engine is ever imported or executed); versions.py: release versions, the cache dir
    roles.py     the entry points below (the family of a name, the engine and version of a role),
                 apart from the families so that their own helpers (vllm_install) can ask them
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

from knobkeeper.engine.family import Family
from knobkeeper.engine.roles import FAMILIES, EnginePin, engine_spec, engine_version, family, role_engine
from knobkeeper.engine.routers import ROUTERS
from knobkeeper.engine.sglang import FAMILY as SGLANG
from knobkeeper.engine.sim import FAMILY as SIM
from knobkeeper.engine.vllm import FAMILY as VLLM

__all__ = ["FAMILIES", "EnginePin", "Family", "engine_spec", "engine_version", "family", "role_engine", "with_registry"]

FAMILIES.update({f.name: f for f in (SIM, SGLANG, VLLM, *ROUTERS.values())})


def with_registry() -> list[Family]:
    """The families whose variable registry `catalog import` reads."""
    return [f for f in FAMILIES.values() if f.registry is not None]
