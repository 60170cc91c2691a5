"""Run a deploy from Python: `pyinfra -y INVENTORY deploy.py --data ...` as a subprocess from the
repo root, and hand back its exit code, its output and its deploy record.

The A/B harness calls this with knob_overrides, only=ROLE and record=False; tests call it too.
Progress lines of the deploy ("knobkeeper: waiting for decode ... (12 s of 300 s)") reach stderr
as they come, also when the output is otherwise captured. Ctrl-C or SIGTERM (a CI job's timeout)
stops the pyinfra run (its process group) before the interruption goes on: callers that restore
something (ab run) wrap their work in `terminate_as_interrupt()` so SIGTERM runs their `finally`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from knobkeeper.deploy.canary_state import refuse_deploy
from knobkeeper.deploy.options import DEFAULT_INVENTORY, DeployOptions
from knobkeeper.deploy.parent import parent_env
from knobkeeper.deploy.record import DeployRecord, find_record
from knobkeeper.deploy.render import render_stack
from knobkeeper.deploy.stack import load_stack
from knobkeeper.errors import UserError
from knobkeeper.project import Project
from knobkeeper.timeutil import new_id

__all__ = ["DEFAULT_INVENTORY", "DeployResult", "deploy_command", "run_deploy", "terminate_as_interrupt"]
PROGRESS_PREFIX = "knobkeeper: "


@dataclass
class DeployResult:
    returncode: int
    output: str
    record: DeployRecord | None
    deploy_id: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.record is not None and self.record.result == "ok"

    @property
    def error(self) -> str | None:
        """The one-line reason a run failed (the record's, else knobkeeper's or pyinfra's last word)."""
        if self.ok:
            return None
        if self.record is not None and self.record.error:
            return self.record.error
        unreachable = [line.strip() for line in self.output.splitlines() if "Could not connect" in line]
        if unreachable:  # pyinfra stopped before loading the deploy (config.py: FAIL_PERCENT = 0)
            return "host unreachable, nothing was restarted: " + "; ".join(unreachable)
        for line in reversed(self.output.splitlines()):
            if line.startswith("knobkeeper: error:") or "pyinfra error" in line or "Error" in line:
                return line.strip()
        return f"pyinfra exited with {self.returncode}"


def deploy_command(inventory_path: str, options: DeployOptions, extra_data: Mapping[str, Any] | None = None,
                   limit: list[str] | None = None) -> list[str]:
    """The pyinfra command line of a deploy (every --data value JSON-encoded: pyinfra parses it so);
    `limit`: only these hosts (pyinfra --limit; a canary's hosts)."""
    data = {**options.to_data(), "inventory_path": inventory_path, **(extra_data or {})}
    cmd = [sys.executable, "-m", "pyinfra", "-y", *[x for h in limit or () for x in ("--limit", h)],
           inventory_path, "deploy.py"]
    for key, value in data.items():
        cmd += ["--data", f"{key}={json.dumps(value)}"]
    return cmd


def _preflight(project: Project, inventory: str, options: DeployOptions) -> None:
    """Refuse bad --only / overrides / secrets with one UserError before pyinfra starts (nothing touched)."""

    stack = load_stack(project.root, inventory)
    options.check_roles(list(stack.order), inventory)
    refuse_deploy(project, inventory, options.scope(list(stack.order)))   # a running canary owns its role
    render_stack(project, stack, knob_overrides=options.knob_overrides, check_secrets=True)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within this block SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so `finally` clauses (a
    restore) run before the process exits. Only in the main thread (signals are delivered there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGINT the pyinfra run's process group (as Ctrl-C would), then SIGTERM, then SIGKILL."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_deploy(
    project: Project,
    inventory_path: str | os.PathLike = DEFAULT_INVENTORY,
    *,
    restart: str = "changed",
    only: str | None = None,
    knob_overrides: Mapping[str, Any] | None = None,
    record: bool = True,
    allow_dirty: bool = False,
    extra_data: Mapping[str, Any] | None = None,
    timeout: float = 1800,
    env: Mapping[str, str] | None = None,
    echo: bool = False,
    options: DeployOptions | None = None,
    limit: list[str] | None = None,
) -> DeployResult:
    """Deploy `inventory_path` of `project`; never raises for a failed run (see .ok / .error).
    `options` (a DeployOptions) replaces the keyword options when given. With `echo`, every line
    of pyinfra's output goes to stderr as it comes; without, only knobkeeper's own lines.
    `limit`: only these hosts (pyinfra --limit; the canary's per-host override)."""
    inv = Path(inventory_path)
    rel = str(inv.relative_to(project.root)) if inv.is_absolute() and inv.is_relative_to(project.root) else str(inv)
    if not (project.root / rel).is_file():
        raise UserError(f"inventory {inventory_path}: no such file under {project.root}")
    if not (project.root / "deploy.py").is_file():
        raise UserError(f"{project.root}/deploy.py: not found (is this an infra repo?)")
    deploy_id = new_id()
    options = options or DeployOptions(restart=restart, only=only, knob_overrides=knob_overrides, record=record,
                                       allow_dirty=allow_dirty)
    options = dataclasses.replace(options, deploy_id=deploy_id)
    _preflight(project, rel, options)
    cmd = deploy_command(rel, options, extra_data, limit)
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=project.root, env={**os.environ, **(env or {}), **parent_env()}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=_parent_death_hook(),
    )
    chunks: list[str] = []
    reader = threading.Thread(target=_read, args=(proc, chunks, echo), daemon=True)
    reader.start()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        chunks.append(f"\nknobkeeper: error: deploy timed out after {timeout:g} s\n")
    except BaseException:  # Ctrl-C, or SIGTERM under terminate_as_interrupt: stop the run first
        _stop_group(proc)
        raise
    finally:
        reader.join(10)
    return DeployResult(
        returncode=proc.returncode if proc.returncode is not None else -9, output="".join(chunks),
        record=find_record(project, deploy_id), deploy_id=deploy_id, seconds=time.monotonic() - started,
    )


def _parent_death_hook():
    """A preexec_fn that makes the pyinfra child get SIGTERM when its parent dies (Linux
    PR_SET_PDEATHSIG), or None where there is no prctl. The run is in its own session, so a
    SIGKILLed caller (a canary, `ab run`) would otherwise leave it deploying its candidate for
    minutes; killed, its record journal says how far it got. Elsewhere (and as well) the child
    watches its parent itself (deploy/parent.py, started from config.py). libc is looked up here, in the parent:
    the child between fork and exec may only call what is already resolved (no imports)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)   # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:          # the parent died before prctl took effect
            os._exit(1)

    return hook


def _read(proc: subprocess.Popen, chunks: list[str], echo: bool) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        chunks.append(line)
        if echo or line.startswith(PROGRESS_PREFIX):
            sys.stderr.write(line)
            sys.stderr.flush()
