"""The router engines a stack can put in front of its prefill and decode workers: what differs per router.

    engine         package (pin)         start                                   metrics
    smg            smg 1.13.0            python -m smg.launch_router ...         --prometheus-host/-port
    sglang-router  sglang-router 0.3.2   python -m sglang_router.launch_router   --prometheus-host/-port

Both take `--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL --policy P` (read from
smg 1.13.0's smg/router_args.py and sglang-router 0.3.2), both answer GET /readiness 503 until their
workers are registered and healthy, then 200 {"status": "ready", "healthy_workers": N,
"total_workers": N}, and both list their workers at GET /workers as {"workers": [{"url",
"worker_type", "is_healthy", ...}], "total": N}. smg adds each worker's state, "status": one of
pending / ready / not_ready / failed / draining (its health checker: success threshold 2, failure
threshold 3, interval --health-check-interval-secs, default 60 s); a worker is healthy there when
is_healthy and status == "ready". Default prometheus port 29000 and host 0.0.0.0 for both: always set
both. smg holds its listener --shutdown-grace-period-secs (default 180 s) after SIGTERM.

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
from dataclasses import dataclass
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class RouterEngine:
    name: str  # the inventory's engines[role] value
    package: str  # PyPI distribution
    version: str  # the version this project pins and tests
    version_key: str  # inventory data key that pins it on a host
    module: str  # python -m MODULE starts it
    readiness_path: str = "/readiness"
    workers_path: str = "/workers"
    metrics_host_flag: str = "--prometheus-host"
    metrics_port_flag: str = "--prometheus-port"
    reports_worker_status: bool = False  # each /workers item has "status" (smg's worker state)

    def requirement(self, data: Mapping[str, Any]) -> str | None:
        """The pip requirement for a host whose data pins the version (None when it does not)."""
        version = data.get(self.version_key)
        return f"{self.package}=={version}" if version else None

    def command(self, python: str, host: str, port: int, prefill: Iterable[tuple[str, Any]],
                decode: Iterable[str], policy: str, metrics_host: str, metrics_port: int) -> list[str]:
        cmd = [python, "-m", self.module, "--host", host, "--port", str(port), "--pd-disaggregation"]
        for url, bootstrap in prefill:
            cmd += ["--prefill", url] + ([str(bootstrap)] if bootstrap is not None else [])
        for url in decode:
            cmd += ["--decode", url]
        return cmd + ["--policy", policy, self.metrics_host_flag, metrics_host, self.metrics_port_flag, str(metrics_port)]

    def worker_healthy(self, item: Mapping[str, Any]) -> bool:
        healthy = item.get("is_healthy", item.get("healthy")) is not False
        if self.reports_worker_status and "status" in item:
            healthy = healthy and item["status"] == "ready"
        return healthy


SMG = RouterEngine(name="smg", package="smg", version="1.13.0", version_key="smg_version",
                   module="smg.launch_router", reports_worker_status=True)
SGLANG_ROUTER = RouterEngine(name="sglang-router", package="sglang-router", version="0.3.2",
                             version_key="sglang_router_version", module="sglang_router.launch_router")
ROUTERS = {r.name: r for r in (SMG, SGLANG_ROUTER)}


def router(engine: str) -> RouterEngine:
    return ROUTERS[engine]


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
