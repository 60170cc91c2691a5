"""The local stack's supervisord, seen from this machine: its pid, its programs' pids, and a stop
that leaves no process behind (used by `make stop`, the demo and the tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from knobkeeper.deploy.observe import parse_manager_status


def supervisor_root(prefix: str | Path) -> Path:
    return Path(prefix) / "supervisor"


def supervisord_pid(prefix: str | Path) -> int | None:
    """supervisord's pid from its pidfile, when that process is alive."""
    try:
        pid = int((supervisor_root(prefix) / "supervisord.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def program_pids(prefix: str | Path, ctl: str, programs: list[str]) -> dict[str, int | None]:
    """{program: pid or None} from `supervisorctl status`."""
    conf = supervisor_root(prefix) / "supervisord.conf"
    out: dict[str, int | None] = {}
    for name in programs:
        done = subprocess.run([ctl, "-c", str(conf), "status", name], capture_output=True, text=True)
        out[name] = parse_manager_status((done.stdout + done.stderr).splitlines())[1]
    return out


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return True


def stop_local(prefix: str | Path, timeout: float = 30.0) -> list[int]:
    """SIGTERM supervisord (it stops its programs first), wait, SIGKILL what is left. Returns the pids
    that were stopped (supervisord and its direct children)."""
    pid = supervisord_pid(prefix)
    if pid is None:
        return []
    children = _children(pid)
    os.kill(pid, signal.SIGTERM)
    pids = [pid, *children]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if _alive(p):
            try:
                os.killpg(p, signal.SIGKILL) if p != pid else os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return pids
