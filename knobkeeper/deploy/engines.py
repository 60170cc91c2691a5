"""The engine command of each service: the argv its launch script `exec`s, and the interpreter it
runs with (decided here only).

    sim            python -m knobkeeper.sim --role R --host H --port P [--bootstrap-port B] ...
    sglang         {prefix}/venv/bin/python -m sglang.launch_server --disaggregation-mode R ...
    smg            python -m smg.launch_router --pd-disaggregation --prefill URL B ... --decode URL ...
    sglang-router  python -m sglang_router.launch_router ... (the same flags; see deploy/routers.py)

`engine_args[role]` is appended last, so an inventory (or a test's --data) can add or override flags.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from knobkeeper.deploy.model import HostPlan, Service
from knobkeeper.deploy.routers import ROUTERS, router
from knobkeeper.errors import UserError

WORKER_ENGINES = ("sim", "sglang")
VENV_PYTHON = "{prefix}/venv/bin/python"

Workers = dict[str, list[tuple[str, int | None]]]


def interpreter(data: Mapping[str, Any], prefix: str, engine: str) -> str:
    """The Python a service of `engine` runs with: host data `python` ("{prefix}" expanded), else the
    engine venv under the prefix for sglang, else the controller's own interpreter (sim, router)."""
    chosen = data.get("python") or (VENV_PYTHON if engine == "sglang" else sys.executable)
    return str(chosen).replace("{prefix}", prefix)


def workers_of(services: Iterable[Service]) -> Workers:
    """{"prefill": [(url, bootstrap port)], "decode": [(url, None)]}: what a router fronts."""
    out: Workers = {"prefill": [], "decode": []}
    for svc in services:
        if svc.engine in WORKER_ENGINES:
            out[svc.role].append((svc.url, svc.bootstrap_port))
    return out


def engine_command(svc: Service, data: Mapping[str, Any], workers: Workers) -> list[str]:
    """The argv of `svc` from its host's data and, for a router, the workers it fronts."""
    extra = (data.get("engine_args") or {}).get(svc.role, [])
    if isinstance(extra, str) or not isinstance(extra, (list, tuple)):
        raise UserError(f"host {svc.host}: data engine_args[{svc.role!r}]: expected a list of arguments")
    python = interpreter(data, svc.prefix, svc.engine)
    model_name = str(data.get("served_model_name") or "knobkeeper-sim")
    if svc.engine == "sim":
        cmd = [python, "-m", "knobkeeper.sim", "--role", svc.role, "--host", svc.listen_host,
               "--port", str(svc.port), "--served-model-name", model_name]
        if svc.bootstrap_port is not None:
            cmd += ["--bootstrap-port", str(svc.bootstrap_port)]
    elif svc.engine == "sglang":
        model = data.get("model")
        if not model:
            raise UserError(f"host {svc.host}: data model: the sglang engine needs a model path")
        cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model),
               "--served-model-name", model_name, "--host", svc.listen_host, "--port", str(svc.port),
               "--disaggregation-mode", svc.role,
               "--disaggregation-transfer-backend", str(data.get("transfer_backend") or "mooncake")]
        if svc.bootstrap_port is not None:
            cmd += ["--disaggregation-bootstrap-port", str(svc.bootstrap_port)]
        if data.get("tp_size"):
            cmd += ["--tp-size", str(data["tp_size"])]
    else:
        if not workers["prefill"] or not workers["decode"]:
            raise UserError(f"{svc.key}: the router needs at least one prefill and one decode service in the inventory")
        cmd = router(svc.engine).command(python, svc.listen_host, svc.port, workers["prefill"],
                                         [url for url, _ in workers["decode"]],
                                         str(data.get("router_policy") or "round_robin"), svc.listen_host,
                                         svc.metrics_port)
    return cmd + [str(a) for a in extra]


# --- the engine a host runs: its venv and the packages pinned in it -------------------------------------

VERSIONS_MARKER = "knobkeeper-versions "
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*$")


def engine_venv(plan: HostPlan) -> str | None:
    """The venv under the host's prefix its services run from (the deploy makes it), or None when
    they run an interpreter the host already has (the local stack: this repo's environment)."""
    for svc in plan.services:
        python = interpreter(plan.data, plan.prefix, svc.engine)
        if python.startswith(plan.prefix + "/"):
            return str(Path(python).parent.parent)
    return None


def engine_requirements(plan: HostPlan) -> list[str]:
    """The pip requirements the deploy installs into the venv: data `engine_packages`, else the
    pinned sglang (`sglang_version`) / router (`sglang_router_version`) of the host's engines."""
    data = plan.data
    wanted = data.get("engine_packages")
    if wanted is not None:
        if isinstance(wanted, str) or not all(isinstance(w, str) for w in wanted):
            raise UserError(f"host {plan.name}: data engine_packages: expected a list of pip requirements")
        return list(wanted)
    engines = {s.engine for s in plan.services}
    pins = [("sglang", "sglang[all]", "sglang_version")]
    pins += [(r.name, r.package, r.version_key) for r in ROUTERS.values()]
    out = []
    for engine, dist, key in pins:
        if engine in engines:
            version = data.get(key)
            if not version:
                raise UserError(f"host {plan.name}: data {key}: needed to pin the engine in its venv")
            out.append(f"{dist}=={version}")
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
