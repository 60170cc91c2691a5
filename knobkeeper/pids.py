"""Processes a tool started and knows by a pid file: is it alive, is it ours, stop it. The local
stack's supervisord and Prometheus (deploy/local.py) and the local Slurm and Kubernetes clusters'
daemons (deploy/slurm/localcluster.py, deploy/kube/localcluster.py) are stopped by PID through here.

    pid = pid_of("/tmp/kk/c/run/etcd.pid", "/tmp/kk/c")   # alive and its command line names our folder
    stop_pid(pid)                                           # TERM, wait, KILL

A leaf module (util layer): nothing of knobkeeper.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed child its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # it answered kill(0); no /proc to say it is a zombie


def pid_of(pidfile: str | Path, marker: str | None = None) -> int | None:
    """The pid a pid file names, when that process is alive and (with `marker`) its command line holds
    `marker`: a pid file can outlive its process, and the pid be another's by now."""
    try:
        pid = int(Path(pidfile).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if marker is not None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        if marker not in cmdline:
            return None
    return pid if alive(pid) else None


def stop_pid(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM, wait up to `timeout` for it to go, then SIGKILL."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    if alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
