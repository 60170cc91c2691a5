"""Run a deploy from Python: `pyinfra -y INVENTORY deploy.py --data ...` as a subprocess from the
repo root, and hand back its exit code, its output and its deploy record.

The A/B harness calls this with knob_overrides, only=ROLE and record=False; tests call it too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from knobkeeper.deploy.record import DeployRecord, find_record
from knobkeeper.errors import UserError
from knobkeeper.project import Project
from knobkeeper.timeutil import new_id

DEFAULT_INVENTORY = "inventory/local.py"


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


def deploy_command(
    inventory_path: str,
    *,
    restart: str = "changed",
    only: str | None = None,
    knob_overrides: Mapping[str, Any] | None = None,
    record: bool = True,
    allow_dirty: bool = False,
    extra_data: Mapping[str, Any] | None = None,
    deploy_id: str | None = None,
    limit: list[str] | None = None,
) -> list[str]:
    """The pyinfra command line of a deploy (every --data value JSON-encoded: pyinfra parses it so)."""
    data: dict[str, Any] = {"restart": restart, "record": record, "allow_dirty": allow_dirty,
                            "inventory_path": inventory_path}
    if only:
        data["only"] = only
    if knob_overrides:
        data["knob_overrides"] = dict(knob_overrides)
    if deploy_id:
        data["deploy_id"] = deploy_id
    data.update(extra_data or {})
    cmd = [sys.executable, "-m", "pyinfra", "-y", *[x for h in limit or () for x in ("--limit", h)],
           inventory_path, "deploy.py"]
    for key, value in data.items():
        cmd += ["--data", f"{key}={json.dumps(value)}"]
    return cmd


def _preflight(project: Project, inventory: str, only: str | None, knob_overrides: Mapping[str, Any] | None) -> None:
    """Refuse bad --only / overrides with one UserError before pyinfra starts (nothing touched)."""
    from knobkeeper.deploy.render import normalize_overrides
    from knobkeeper.deploy.stack import load_stack
    from knobkeeper.knobs.catalog import load_catalog

    roles = list(load_stack(project.root, inventory).roles)
    if only is not None and only not in roles:
        raise UserError(f"--only {only!r}: not a role of {inventory} (roles: {', '.join(roles)})")
    normalize_overrides(load_catalog(project.catalog_path), knob_overrides, roles)


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
    limit: list[str] | None = None,
) -> DeployResult:
    """Deploy `inventory_path` of `project`; never raises for a failed run (see .ok / .error).

    `limit`: only these hosts (pyinfra --limit; the canary's per-host override).
    """
    inv = Path(inventory_path)
    rel = str(inv.relative_to(project.root)) if inv.is_absolute() and inv.is_relative_to(project.root) else str(inv)
    if not (project.root / rel).is_file():
        raise UserError(f"inventory {inventory_path}: no such file under {project.root}")
    if not (project.root / "deploy.py").is_file():
        raise UserError(f"{project.root}/deploy.py: not found (is this an infra repo?)")
    _preflight(project, rel, only, knob_overrides)
    deploy_id = new_id()
    cmd = deploy_command(rel, restart=restart, only=only, knob_overrides=knob_overrides, record=record,
                         allow_dirty=allow_dirty, extra_data=extra_data, deploy_id=deploy_id, limit=limit)
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=project.root, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    chunks: list[str] = []
    try:
        if echo:
            assert proc.stdout is not None
            for line in proc.stdout:
                chunks.append(line)
                sys.stderr.write(line)
            proc.wait(timeout)
        else:
            out, _ = proc.communicate(timeout=timeout)
            chunks.append(out)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        chunks.append(out or "")
        chunks.append(f"\nknobkeeper: error: deploy timed out after {timeout:g} s\n")
    return DeployResult(
        returncode=proc.returncode if proc.returncode is not None else -9, output="".join(chunks),
        record=find_record(project, deploy_id), deploy_id=deploy_id, seconds=time.monotonic() - started,
    )
