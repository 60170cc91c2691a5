"""The local stack's supervisord, seen from this machine: its pid, its programs' pids, and a stop
that leaves no process behind (used by `make stop`, the demo and the tests); and the Prometheus that
`make demo PROMETHEUS=1` starts beside it (its pidfile under <prefix>/prometheus)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from knobkeeper.deploy.observe import parse_manager_status
from knobkeeper.errors import UserError
from knobkeeper.pids import alive, pid_of


def supervisor_root(prefix: str | Path) -> Path:
    return Path(prefix) / "supervisor"


def supervisord_pid(prefix: str | Path) -> int | None:
    """supervisord's pid from its pidfile, when that process is alive."""
    return pid_of(supervisor_root(prefix) / "supervisord.pid")


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
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if alive(p):
            try:
                os.killpg(p, signal.SIGKILL) if p != pid else os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return pids


# ---------------------------------------------------------------- a Prometheus beside the local stack

PROMETHEUS_PORT = 9090


def prometheus_root(prefix: str | Path) -> Path:
    return Path(prefix) / "prometheus"


def prometheus_pid(prefix: str | Path) -> int | None:
    return pid_of(prometheus_root(prefix) / "prometheus.pid")


def start_prometheus(prefix: str | Path, config_text: str, port: int = PROMETHEUS_PORT,
                     timeout: float = 60.0) -> tuple[int, str]:
    """Debian's `prometheus` on 127.0.0.1:`port`, scraping what `config_text` says, its data under
    <prefix>/prometheus; (pid, url). Already running: its config is rewritten and reloaded (SIGHUP)."""
    root = prometheus_root(prefix)
    root.mkdir(parents=True, exist_ok=True)
    (root / "prometheus.yml").write_text(config_text)
    url = f"http://127.0.0.1:{port}"
    pid = prometheus_pid(prefix)
    if pid is not None:
        os.kill(pid, signal.SIGHUP)
        return pid, url
    binary = shutil.which("prometheus")
    if binary is None:
        raise UserError("prometheus: not installed (Debian package `prometheus`: bash scripts/system-deps.sh)")
    with open(root / "prometheus.log", "ab") as log:
        proc = subprocess.Popen([binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (root / "prometheus.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"prometheus exited ({proc.returncode}); see {root / 'prometheus.log'}")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return proc.pid, url
        except OSError:
            time.sleep(0.2)
    stop_prometheus(prefix)
    raise UserError(f"prometheus on {url}: not ready after {timeout:g} s; see {root / 'prometheus.log'}")


def stop_prometheus(prefix: str | Path, timeout: float = 20.0) -> int | None:
    """SIGTERM the local Prometheus, wait, SIGKILL if need be; its pid, or None when none ran."""
    pid = prometheus_pid(prefix)
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    (prometheus_root(prefix) / "prometheus.pid").unlink(missing_ok=True)
    return pid
