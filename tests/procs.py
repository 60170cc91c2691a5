"""Start real processes for tests on loopback and stop them by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from knobkeeper import pids
from knobkeeper.ports import free_port  # noqa: F401  (tests import it from here)


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: str | None = None) -> subprocess.Popen:
    """Popen in its own process group, output to `log`; stop it with stop(proc)."""
    handle = open(log, "ab")
    return subprocess.Popen(
        cmd, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        cwd=cwd, start_new_session=True,
    )


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the process group by PID, SIGKILL after `timeout`."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """Stop a process we did not Popen ourselves (e.g. a daemon's pidfile): knobkeeper.pids'."""
    pids.stop_pid(pid, timeout)


def wait_http(url: str, timeout: float = 30.0, status: int = 200, proc: subprocess.Popen | None = None) -> None:
    """Poll `url` until it answers `status`; fail early if `proc` died."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} was up")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == status:
                    return
                last = str(resp.status)
        except urllib.error.HTTPError as exc:
            last = str(exc.code)
            if exc.code == status:
                return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer {status} within {timeout}s (last: {last})")


@contextlib.contextmanager
def answering_server(port: int | None = None, host: str = "127.0.0.1") -> Iterator[int]:
    """An HTTP server in THIS process (a thread) answering 200 to every GET: a stand-in for a stray
    process holding a service's port. Yields its port; shut down (and the port freed) on exit."""
    import http.server
    import threading

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((host, port or free_port(host)), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
