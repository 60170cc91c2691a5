"""The local stack, the embedded default: this machine (@local) plays prefill, decode and router,
under its own supervisord, with the simulated engine (knobkeeper.sim) and the real sglang-router,
both from this repo's Python environment. Everything lives under <repo>/.knobkeeper-state/local.

    pyinfra -y inventory/local.py deploy.py            # or: knobkeeper deploy / make demo

Ports (defaults: prefill 30000, its bootstrap 8998, decode 30001, router 30080, router metrics
29080) can be moved with the environment variable
    KNOBKEEPER_LOCAL_PORTS=prefill=31000,bootstrap=9998,decode=31001,router=31080,router_metrics=30080
(any subset; ':' works instead of '='), which every knobkeeper command reading this inventory sees,
or per run with --data prefill_port=31000 (--data wins).

Workers per role (default: one prefill, one decode; the canary demo runs two decode workers):
    KNOBKEEPER_LOCAL_WORKERS=decode=2
gives the services knobkeeper-decode and knobkeeper-decode-2 (ports decode and decode+1), both behind
the router, health-gated. Set it in the environment of every command that reads this inventory
(deploy, status, review, check, canary, make stop sees what supervisord runs), or per run with
--data decode_workers=2 (the datum <role>_workers, knobkeeper/deploy/stack.py).
"""

import sys as _sys
from pathlib import Path as _Path

from knobkeeper.inventory_env import numbers as _numbers

_ROOT = _Path(__file__).resolve().parent.parent
_PORT_KEYS = {
    "prefill": "prefill_port",
    "bootstrap": "prefill_bootstrap_port",
    "decode": "decode_port",
    "router": "router_port",
    "router_metrics": "router_metrics_port",
}
_WORKER_KEYS = {"prefill": "prefill_workers", "decode": "decode_workers"}


_local = (
    "@local",
    {
        "prefix": str(_ROOT / ".knobkeeper-state" / "local"),
        "service_manager": "supervisord",
        "listen_host": "127.0.0.1",
        "advertise_host": "127.0.0.1",
        "python": _sys.executable,
        "engines": {"prefill": "sim", "decode": "sim", "router": "smg"},
        "engine_args": {
            "prefill": ["--time-scale", "0.1"],
            "decode": ["--time-scale", "0.1"],
            # Workers are healthy before the router starts; retry registration quickly anyway, check
            # health every few seconds so that a restarted worker is noticed, keep shutdown short.
            # No circuit breaker: with one prefill worker, the requests that fail while ONE decode
            # worker restarts under load (a canary, an A/B arm) open the breaker of the prefill too,
            # and the router answers 503 no_available_workers to everything for its 60 s timeout.
            "router": [
                "--worker-startup-timeout-secs", "120",
                "--worker-startup-check-interval", "1",
                "--health-check-interval-secs", "5",
                "--shutdown-grace-period-secs", "5",
                "--disable-circuit-breaker",
                "--log-level", "warn",
            ],
        },
        "stop_timeout": 20,
        **_numbers("KNOBKEEPER_LOCAL_PORTS", _PORT_KEYS, "PORT"),
        **_numbers("KNOBKEEPER_LOCAL_WORKERS", _WORKER_KEYS, "COUNT"),
    },
)

prefill = [_local]
decode = [_local]
router = [_local]
