"""The engine command of each service: the argv its launch script `exec`s, and the interpreter it
runs with (decided here only).

    sim            python -m knobkeeper.sim --role R --host H --port P [--bootstrap-port B] ...
    sglang         {prefix}/venv/bin/python -m sglang.launch_server --disaggregation-mode R ...
    sglang-router  python -m sglang_router.launch_router --pd-disaggregation --prefill URL B ... --decode URL ...

`engine_args[role]` is appended last, so an inventory (or a test's --data) can add or override flags.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Mapping

from knobkeeper.deploy.model import Service
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
        cmd = [python, "-m", "sglang_router.launch_router", "--host", svc.listen_host, "--port", str(svc.port),
               "--pd-disaggregation"]
        if not workers["prefill"] or not workers["decode"]:
            raise UserError(f"{svc.key}: the router needs at least one prefill and one decode service in the inventory")
        for url, bootstrap in workers["prefill"]:
            cmd += ["--prefill", url] + ([str(bootstrap)] if bootstrap is not None else [])
        for url, _ in workers["decode"]:
            cmd += ["--decode", url]
        cmd += ["--policy", str(data.get("router_policy") or "round_robin"),
                "--prometheus-host", svc.listen_host, "--prometheus-port", str(svc.metrics_port)]
    return cmd + [str(a) for a in extra]
