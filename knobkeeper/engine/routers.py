"""The router families a stack can put in front of its prefill and decode workers.

    family         package (pin)         start                                     workers it pairs
    smg            smg 1.13.0            python -m smg.launch_router ...           sglang, sim
    sglang-router  sglang-router 0.3.2   python -m sglang_router.launch_router     sglang, sim
    vllm-router    vllm-router 0.1.17    {venv}/bin/vllm-router ...                vllm

smg and sglang-router take `--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL --policy P`
(read from smg 1.13.0's smg/router_args.py and sglang-router 0.3.2). vllm-router (a fork of
sglang-router in Rust) takes `--vllm-pd-disaggregation --kv-connector nixl|mooncake|moriio --prefill URL
--decode URL` (vllm_router/router_args.py of the 0.1.17 wheel); its kv connector must be the workers'.

All three answer GET /readiness 503 until their workers are registered and healthy, then 200
{"status": "ready", "healthy_workers": N, "total_workers": N} (/health is 200 from the start, so it
is no gate), and list their workers at GET /workers as {"workers": [{"url", "worker_type",
"is_healthy", ...}], "total": N}. For vllm-router 0.1.17 those routes are in its Rust binary
(vllm_router_rs.abi3.so holds /readiness, /liveness, /workers; vllm-project/router src/server.rs
builds them, its VllmPDRouter's readiness is the PD router's). smg adds each worker's state,
"status": one of pending / ready / not_ready / failed / draining (its health checker: success
threshold 2, failure threshold 3, interval --health-check-interval-secs, default 60 s); a worker is
healthy there when is_healthy and status == "ready". Default prometheus port 29000 for all three;
always set host and port. smg holds its listener --shutdown-grace-period-secs (default 180 s) after
SIGTERM.

A worker restarted on the same address: smg before its PR 2468 (2026-09) kept it Failed until the
gateway restarted; 1.13.0 probes Failed workers and returns them to ready (measured: decode killed,
failed after ~10 s, restarted, ready again within 2 s at a 1 s interval). sglang-router 0.3.2
recovers too. The deploy's router gate reads /workers after every gated run, so a router that still
sees a restarted worker as not ready fails the gate instead of failing the first requests.

Nothing here runs anything: the deploy builds the command with `command` and judges the router's
answers with `workers_healthy`.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from knobkeeper.engine.family import Endpoints, Family, Workers, engine_args, flag_values
from knobkeeper.engine import vllm_install
from knobkeeper.errors import UserError

ROUTER_ENDPOINTS = Endpoints(health="/health", readiness="/readiness", workers="/workers")


class RouterFamily(Family):
    kind = "router"
    endpoints = ROUTER_ENDPOINTS
    module: str = ""  # python -m MODULE starts it ("" : a console script named after the package)
    pd_flag = "--pd-disaggregation"
    metrics_host_flag = "--prometheus-host"
    metrics_port_flag = "--prometheus-port"
    reports_worker_status = False  # each /workers item has "status" (smg's worker state)

    def __init__(self, name: str, package: str, tested_version: str, version_key: str, module: str = "",
                 reports_worker_status: bool = False, fronts: tuple[str, ...] = ("sglang",)) -> None:
        self.name, self.package, self.distribution = name, package, package
        self.tested_version, self.version_key, self.module = tested_version, version_key, module
        self.reports_worker_status = reports_worker_status
        self.fronts = fronts  # the engines whose workers it speaks to (the sim counts as sglang)

    @property
    def version(self) -> str:
        return self.tested_version or ""

    def start(self, python: str) -> list[str]:
        if self.module:
            return [python, "-m", self.module]
        return [python.rsplit("/", 1)[0] + "/" + self.package if "/" in python else self.package]

    def pd_args(self, data: Mapping[str, Any]) -> list[str]:
        return [self.pd_flag]

    def argv(self, python: str, host: str, port: int, prefill: Iterable[tuple[str, Any]], decode: Iterable[str],
             policy: str, metrics_host: str, metrics_port: int, data: Mapping[str, Any] | None = None) -> list[str]:
        cmd = self.start(python) + ["--host", host, "--port", str(port), *self.pd_args(data or {})]
        for url, bootstrap in prefill:
            cmd += ["--prefill", url] + ([str(bootstrap)] if bootstrap is not None else [])
        for url in decode:
            cmd += ["--decode", url]
        return cmd + ["--policy", policy, self.metrics_host_flag, metrics_host, self.metrics_port_flag, str(metrics_port)]

    def command(self, svc: Any, data: Mapping[str, Any], workers: Workers) -> list[str]:
        if not workers["prefill"] or not workers["decode"]:
            raise UserError(f"{svc.key}: the router needs at least one prefill and one decode service in the inventory")
        cmd = self.argv(self.interpreter(data, svc.prefix), svc.listen_host, svc.port, workers["prefill"],
                        [url for url, _ in workers["decode"]], str(data.get("router_policy") or "round_robin"),
                        svc.listen_host, svc.metrics_port, data)
        return cmd + engine_args(svc, data)

    def named_workers(self, command: list[str]) -> dict[str, list]:
        """What a rendered router command names: {"prefill": [(url, bootstrap port or None)], "decode": [url]}."""
        prefill = []
        for values in flag_values(command, "--prefill"):
            if values:
                port = values[1] if len(values) > 1 else ""
                prefill.append((values[0], int(port) if port.isdigit() else None))
        decode = [values[0] for values in flag_values(command, "--decode") if values]
        return {"prefill": prefill, "decode": decode}

    def worker_healthy(self, item: Mapping[str, Any]) -> bool:
        healthy = item.get("is_healthy", item.get("healthy")) is not False
        if self.reports_worker_status and "status" in item:
            healthy = healthy and item["status"] == "ready"
        return healthy


class VllmRouter(RouterFamily):
    pd_flag = "--vllm-pd-disaggregation"

    def managed_env(self, host: str, services: list[str], data: Mapping[str, Any], prefix: str):
        """Its own cached environment (engine/vllm_install.py) when data `engine_root` names one: a
        router-only host never gets the engine's 3.9 GB, and a router bump never rebuilds the engine."""
        root = data.get("engine_root")
        if not root:
            return None
        return vllm_install.EngineEnv.from_data(vllm_install.VLLM_ROUTER, host, services, data,
                                                str(root).replace("{prefix}", prefix))

    def interpreter(self, data: Mapping[str, Any], prefix: str) -> str:
        env = self.managed_env("", [], data, prefix) if not data.get("python") else None
        return f"{env.bin}/python" if env is not None else super().interpreter(data, prefix)

    def pd_args(self, data: Mapping[str, Any]) -> list[str]:
        connector = str(data.get("kv_connector") or "NixlConnector")
        return [self.pd_flag, "--kv-connector", connector.removesuffix("Connector").lower()]

    def kv_connector(self, command: list[str]) -> str:
        values = flag_values(command, "--kv-connector")
        return values[-1][0] if values and values[-1] else "nixl"  # its default


SMG = RouterFamily("smg", "smg", "1.13.0", "smg_version", "smg.launch_router", reports_worker_status=True)
SGLANG_ROUTER = RouterFamily("sglang-router", "sglang-router", "0.3.2", "sglang_router_version",
                             "sglang_router.launch_router")
VLLM_ROUTER = VllmRouter("vllm-router", "vllm-router", "0.1.17", "vllm_router_version", fronts=("vllm",))
ROUTERS = {r.name: r for r in (SMG, SGLANG_ROUTER, VLLM_ROUTER)}


def workers_healthy(body: bytes, expected: int, engine: str = SGLANG_ROUTER.name) -> tuple[bool, str]:
    """Judge a router's GET /workers: every listed worker healthy, and at least `expected` of them."""
    try:
        data = json.loads(body)
    except ValueError:
        return False, "workers: not JSON"
    items = data.get("workers", data) if isinstance(data, dict) else data
    if not isinstance(items, list):
        return False, "workers: no list"
    judge = ROUTERS.get(engine, SGLANG_ROUTER)
    unhealthy = []
    for item in items:
        if isinstance(item, dict) and not judge.worker_healthy(item):
            state = f" ({item['status']})" if judge.reports_worker_status and "status" in item else ""
            unhealthy.append(str(item.get("url", "?")) + state)
    if unhealthy:
        return False, "workers unhealthy: " + ", ".join(unhealthy)
    if len(items) < expected:
        return False, f"workers: {len(items)} of {expected} registered"
    return True, f"200, {len(items)} workers healthy"
