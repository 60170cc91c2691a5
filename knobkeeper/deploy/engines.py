"""The engine command of each service and the engine venv of each host, from its engine family
(knobkeeper.engine: the command, the interpreter, the per-instance environment live there).

`engine_args[role]` is appended last by every family, so an inventory (or a test's --data) can add or
override flags.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Iterable, Mapping

from knobkeeper.deploy.model import HostPlan, Service
from knobkeeper.engine import family, vllm_install
from knobkeeper.engine.family import Workers
from knobkeeper.errors import UserError


def interpreter(data: Mapping[str, Any], prefix: str, engine: str) -> str:
    """The Python a service of `engine` runs with (its family decides; see Family.interpreter)."""
    return family(engine).interpreter(data, prefix)


def workers_of(services: Iterable[Service]) -> Workers:
    """{"prefill": [(url, bootstrap port)], "decode": [(url, None)]}: what a router fronts."""
    out: Workers = {"prefill": [], "decode": []}
    for svc in services:
        if svc.family.kind == "worker":
            out[svc.role].append((svc.url, svc.bootstrap_port))
    return out


def engine_command(svc: Service, data: Mapping[str, Any], workers: Workers) -> list[str]:
    """The argv of `svc` from its host's data and, for a router, the workers it fronts."""
    return svc.family.command(svc, data, workers)


def instance_environment(svc: Service, data: Mapping[str, Any]) -> dict[str, str]:
    """What the family exports for this one instance (vLLM's NIXL side channel), before host data."""
    return svc.family.instance_environment(svc, data)


# --- the engine a host runs: its venv and the packages pinned in it -------------------------------------

VERSIONS_MARKER = "knobkeeper-versions "
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*$")


def managed_envs(plan: HostPlan) -> list[Any]:
    """The cached engine environments this host's services run from (their families say:
    Family.managed_env; engine/vllm_install.EngineEnv), one per environment, in service order."""
    found: dict[str, Any] = {}
    for svc in plan.services:
        services = [s.name for s in plan.services if s.family is svc.family]
        env = svc.family.managed_env(plan.name, services, plan.data, plan.prefix)
        if env is not None:
            found.setdefault(env.name, env)
    return list(found.values())


def managed_drift(plan: HostPlan, run_on_host: Any) -> list[str] | None:
    """`status`'s drift lines of the host's cached engine environments (vllm_install.drift: PEP 440
    `==`, so torch 2.13.0 is met by 2.13.0+cpu); None when the host has none, or was unreachable."""
    envs = managed_envs(plan)
    if not envs:
        return None
    out = []
    for env in envs:
        lines = run_on_host(vllm_install.probe_command(env))
        if lines is None:
            return None
        out += vllm_install.drift(env, vllm_install.parse_probe(lines))
    return out


def engine_venv(plan: HostPlan) -> str | None:
    """The venv under the host's prefix its services run from (the deploy makes it), or None when
    they run an interpreter the host already has (the local stack: this repo's environment)."""
    for svc in plan.services:
        python = svc.family.interpreter(plan.data, plan.prefix)
        if python.startswith(plan.prefix + "/"):
            return str(Path(python).parent.parent)
    return None


def engine_requirements(plan: HostPlan) -> list[str]:
    """The pip requirements the deploy installs into the venv: data `engine_packages`, else each of
    the host's engines at the version its role pins (knobkeeper.engine.role_engine, read when the
    stack was built: Service.engine_version)."""
    data = plan.data
    wanted = data.get("engine_packages")
    if wanted is not None:
        if isinstance(wanted, str) or not all(isinstance(w, str) for w in wanted):
            raise UserError(f"host {plan.name}: data engine_packages: expected a list of pip requirements")
        return list(wanted)
    versions: dict[str, set[str]] = {}
    for svc in plan.services:
        if svc.family.package is None:
            continue  # the sim: this repo's own code
        if not svc.engine_version:
            key = svc.family.version_key
            raise UserError(f"host {plan.name}: data engines[{svc.role!r}] = {svc.engine!r}: needs a version to pin "
                            f"the engine in its venv ('{svc.engine}==V', or data {key})")
        versions.setdefault(svc.engine, set()).add(svc.engine_version)
    out = []
    for engine, found in versions.items():
        if len(found) > 1:
            raise UserError(f"host {plan.name}: runs {engine} {' and '.join(sorted(found))} from one venv; "
                            f"pin one version per host")
        out.append(family(engine).requirement(found.pop()))
    return out


def pinned_versions(requirements: Iterable[str]) -> dict[str, str]:
    """{distribution: version} of the requirements pinned with == ("sglang[all]==0.5.23" -> sglang)."""
    out = {}
    for req in requirements:
        match = _PIN.match(req)
        if match:
            out[match.group(1).lower().replace("_", "-")] = match.group(2)
    return out


def versions_command(venv: str, dists: Iterable[str]) -> str:
    """Shell printing `knobkeeper-versions {"dist": "version" | null}` from the venv's own metadata."""
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(d):\n"
            "    try:\n"
            "        return m.version(d)\n"
            "    except m.PackageNotFoundError:\n"
            "        return None\n"
            f"print({VERSIONS_MARKER!r} + json.dumps({{d: v(d) for d in sys.argv[1:]}}))")
    return shlex.join([f"{venv}/bin/python", "-c", code, *dists]) + " 2>/dev/null || true"


def parse_versions(lines: Iterable[str], dists: Iterable[str]) -> dict[str, str | None]:
    for line in lines:
        if line.startswith(VERSIONS_MARKER):
            try:
                data = json.loads(line[len(VERSIONS_MARKER):])
            except ValueError:
                break
            return {d: data.get(d) for d in dists}
    return {d: None for d in dists}  # no venv, or no Python in it


def version_drift(pinned: Mapping[str, str], installed: Mapping[str, str | None]) -> list[str]:
    """One line per pinned distribution whose installed version is another (or none)."""
    return [f"engine {dist}: installed {installed.get(dist) or '(none)'}, declared {want}"
            for dist, want in sorted(pinned.items()) if installed.get(dist) != want]
