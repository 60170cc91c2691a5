"""The engine command of each service: the argv its launch script `exec`s.

    sim            python -m knobkeeper.sim --role R --host H --port P [--bootstrap-port B] ...
    sglang         {prefix}/venv/bin/python -m sglang.launch_server --disaggregation-mode R ...
    smg            python -m smg.launch_router --pd-disaggregation --prefill URL B ... --decode URL ...
    sglang-router  python -m sglang_router.launch_router ... (the same flags; see deploy/routers.py)

`engine_args[role]` is appended last, so an inventory (or a test's --data) can add or override flags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from knobkeeper.deploy.routers import router
from knobkeeper.errors import UserError

if TYPE_CHECKING:
    from knobkeeper.deploy.stack import Service, Stack


def engine_command(stack: "Stack", svc: "Service") -> list[str]:
    data = stack.hosts[svc.host].data
    extra = data.get("engine_args", {}).get(svc.role, [])
    if isinstance(extra, str) or not isinstance(extra, (list, tuple)):
        raise UserError(f"host {svc.host}: data engine_args[{svc.role!r}]: expected a list of arguments")
    python = str(data.get("python") or _default_python(svc)).replace("{prefix}", svc.prefix)
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
        workers = _workers(stack)
        if not workers["prefill"] or not workers["decode"]:
            raise UserError(f"{svc.key}: the router needs at least one prefill and one decode service in the inventory")
        cmd = router(svc.engine).command(python, svc.listen_host, svc.port, workers["prefill"],
                                         [url for url, _ in workers["decode"]],
                                         str(data.get("router_policy") or "round_robin"), svc.listen_host,
                                         svc.metrics_port)
    return cmd + [str(a) for a in extra]


def _default_python(svc: "Service") -> str:
    import sys

    return "{prefix}/venv/bin/python" if svc.engine == "sglang" else sys.executable


def _workers(stack: "Stack") -> dict[str, list[tuple[str, Any]]]:
    out: dict[str, list[tuple[str, Any]]] = {"prefill": [], "decode": []}
    for svc in stack.services:
        if svc.engine in ("sim", "sglang"):
            out[svc.role].append((svc.url, svc.bootstrap_port))
    return out
