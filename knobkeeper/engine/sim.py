"""The sim: a SIMULATED SGLang worker (knobkeeper/sim/), the stand-in where a real engine cannot run
(the local SGLang stack, the SSH fleet tests). It says so wherever it is used: `simulated` is True.

    command    {python} -m knobkeeper.sim --role R --host H --port P --served-model-name N
               [--bootstrap-port B]   (the controller's own interpreter unless data `python` says)
    registry   none: it reads the knobs its effects table names (knobkeeper/sim/effects.toml), and
               reports every SGLANG_*/NCCL_*/KNOBKEEPER_* variable it was started with
    endpoints  SGLang's: /health (503 while loading), /get_server_info, /metrics
    metrics    SGLang's names (sglang:*): the sim exports what an SGLang worker exports
    bench      none of its own: the load generator and the SGLang importer read what it serves
"""

from __future__ import annotations

from typing import Any, Mapping

from knobkeeper.engine.family import Endpoints, Family, Workers, engine_args, model_name
from knobkeeper.engine.sglang import SGLANG_METRICS


class Sim(Family):
    name = "sim"
    simulated = True
    uses_bootstrap = True
    endpoints = Endpoints(health="/health", readiness="/health")
    metrics = SGLANG_METRICS
    reads_knobs_of = "sglang"

    def command(self, svc: Any, data: Mapping[str, Any], workers: Workers) -> list[str]:
        cmd = [self.interpreter(data, svc.prefix), "-m", "knobkeeper.sim", "--role", svc.role,
               "--host", svc.listen_host, "--port", str(svc.port), "--served-model-name", model_name(data)]
        if svc.bootstrap_port is not None:
            cmd += ["--bootstrap-port", str(svc.bootstrap_port)]
        return cmd + engine_args(svc, data)


FAMILY = Sim()
