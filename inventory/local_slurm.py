"""The local stack as ONE Slurm job on the local cluster (`make demo TARGET=slurm` starts the cluster:
munged, slurmctld, slurmd n1..n3 on this machine, knobkeeper/deploy/slurm/localcluster.py).

This machine (@local) is the login node: the deploy submits a heterogeneous job from here, one
component per service (prefill, decode, router: the sim engine and the real smg router from this
repo's Python environment), gates each component where Slurm placed it, and cancels the old job
only after the new one passed every gate.

    make demo TARGET=slurm                              # cluster + deploy + one request + where things are
    knobkeeper deploy inventory/local_slurm.py          # or: pyinfra -y inventory/local_slurm.py deploy.py
    knobkeeper status inventory/local_slurm.py          # squeue/scontrol + each component's health and knobs
    make stop                                           # cancels the jobs, stops the cluster's daemons

The cluster's folder is <repo>/.knobkeeper-state/slurm (its slurm.conf names the controller's port),
or KNOBKEEPER_SLURM_ROOT. Preferred ports as in inventory/local.py (KNOBKEEPER_LOCAL_PORTS moves
them); a component whose preferred port is taken on its node (the old job's) takes another, and
publishes where it listens.
"""

import os as _os
import sys as _sys
from pathlib import Path as _Path

from knobkeeper.inventory_env import numbers as _numbers

_ROOT = _Path(__file__).resolve().parent.parent
_CLUSTER = _Path(_os.environ.get("KNOBKEEPER_SLURM_ROOT") or _ROOT / ".knobkeeper-state" / "slurm")
_PORT_KEYS = {
    "prefill": "prefill_port",
    "bootstrap": "prefill_bootstrap_port",
    "decode": "decode_port",
    "router": "router_port",
    "router_metrics": "router_metrics_port",
}


_login = (
    "@local",
    {
        "prefix": str(_ROOT / ".knobkeeper-state" / "slurm-stack"),
        "service_manager": "slurm",
        "slurm_conf": str(_CLUSTER / "slurm.conf"),
        "slurm_partition": "kk",
        "slurm_time_limit": "1-00:00:00",
        "slurm_timeout": 20,
        "slurm_pending_timeout": 120,
        "prefill_slurm": {"cpus": 1, "mem": "512M"},
        "decode_slurm": {"cpus": 1, "mem": "512M"},
        "router_slurm": {"cpus": 1, "mem": "512M"},
        "listen_host": "127.0.0.1",
        "python": _sys.executable,
        "engines": {"prefill": "sim", "decode": "sim", "router": "smg"},
        "engine_args": {
            "prefill": ["--time-scale", "0.1"],
            "decode": ["--time-scale", "0.1"],
            # As inventory/local.py: quick registration and health checks, short shutdown, no breaker.
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
    },
)

prefill = [_login]
decode = [_login]
router = [_login]
