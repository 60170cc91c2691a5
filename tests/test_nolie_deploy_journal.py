"""Issue 25 finding 8: a deploy record survives a kill. The run journals its record under
.git/knobkeeper/ before each restart it issues; a SIGKILLed deploy leaves that journal, and the next
command completes the record: "interrupted after restarting prefill at T", committed like any other.

One real deploy of the local stack (supervisord, the sim prefill), killed by PID once the prefill's
restart is issued; everything it started is stopped by supervisord's pidfile at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from knobkeeper.deploy.api import deploy_command
from knobkeeper.deploy.local import _alive, stop_local
from knobkeeper.deploy.options import DeployOptions
from knobkeeper.deploy.record import (DeployRecord, ServiceRow, journal_path, load_records, recover_interrupted,
                                      write_journal)
from knobkeeper.project import Project
from tests.infra import git, make_infra_repo
from tests.procs import free_port


def test_a_record_journal_left_by_a_live_deploy_is_not_touched_and_a_dead_one_s_is_completed(project):
    record = DeployRecord(id="0a0a0a0a", inventory="local", inventory_path="inventory/local.py", commit="x",
                          dirty=False, allow_dirty=False, options={}, order=["prefill", "decode"],
                          started_at="2026-12-01T10:00:00.000000Z",
                          services=[ServiceRow(host="@local", service="p", role="prefill", action="started",
                                               restart_issued_at="2026-12-01T10:00:01.000000Z"),
                                    ServiceRow(host="@local", service="d", role="decode", reason="not run")])
    write_journal(project, record, commit=True)
    project.state_dir.mkdir(exist_ok=True)
    # A live deploy holds the deploy lock (a real second process): its journal is left alone.
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
                               "print('locked', flush=True); time.sleep(60)", str(project.state_dir / "deploy.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert recover_interrupted(project) == [] and journal_path(project, record.id).exists()
    finally:
        holder.kill()
        holder.wait()
    (done,) = [r for r in load_records(project) if r.id == record.id]
    assert done.result == "interrupted"
    assert done.error.startswith("interrupted after restarting prefill at 2026-12-01T10:00:01.000000Z")
    assert "not seen healthy since: @local/p" in done.error
    assert not journal_path(project, record.id).exists()
    assert "deploy local: @local/p (interrupted)" in git(project.root, "log", "-1", "--format=%s")
    assert recover_interrupted(project) == []


def test_a_sigkilled_deploy_leaves_a_record_the_next_command_completes():
    project = make_infra_repo(Path(tempfile.mkdtemp(prefix="kk-")))   # supervisord's socket path stays short
    prefix = project.state_dir / "local"
    ports = {"prefill": free_port(), "bootstrap": free_port(), "decode": free_port(), "router": free_port(),
             "router_metrics": free_port()}
    env = {**os.environ, "KNOBKEEPER_LOCAL_PORTS": ",".join(f"{k}={v}" for k, v in ports.items())}
    options = DeployOptions(deploy_id="5151ab1e")
    cmd = deploy_command("inventory/local.py", options, {"engine_args": {"prefill": ["--time-scale", "0.05"]}})
    proc = subprocess.Popen(cmd, cwd=project.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    journal = journal_path(project, "5151ab1e")
    issued = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and issued is None:
            try:
                rows = json.loads(journal.read_text())["record"]["services"]
                issued = next((r["restart_issued_at"] for r in rows if r["role"] == "prefill" and r["restart_issued_at"]),
                              None)
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        assert issued is not None, f"no journal of the prefill's restart (deploy exit {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)          # the deploy process, by its PID
        proc.wait(30)
        assert journal.exists() and not list(project.deploys_dir.glob("*-5151ab1e.json"))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        time.sleep(1)   # the killed run's restart command may still be starting its program
        stopped = stop_local(prefix)
    assert not [p for p in stopped if _alive(p)]

    # The next command (any reader of the records: log, timeline, report, the next deploy) completes it.
    records = load_records(Project(project.root))
    (record,) = [r for r in records if r.id == "5151ab1e"]
    assert record.result == "interrupted" and record.started_at and record.finished_at
    assert record.error.startswith(f"interrupted after restarting prefill at {issued}"), record.error
    assert [r.role for r in record.services if r.restart_issued_at] == ["prefill"]
    assert not journal.exists()
    assert git(project.root, "log", "-1", "--format=%(trailers:key=Deploy,valueonly)").strip() == "5151ab1e"


def test_a_deploy_dies_with_its_sigkilled_caller(tmp_path):
    """Finding 4's second half: the pyinfra run is in its own session, yet it must not outlive a
    canary (or any caller) killed outright: it gets SIGTERM when its parent dies."""
    project = make_infra_repo(Path(tempfile.mkdtemp(prefix="kk-")))
    pid_file = tmp_path / "pyinfra.pid"
    (project.root / "deploy.py").write_text(   # stands for a long candidate deploy
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    caller = subprocess.Popen([sys.executable, "-c",
                               "import sys; from pathlib import Path; from knobkeeper.deploy.api import run_deploy; "
                               "from knobkeeper.project import Project; "
                               "run_deploy(Project(Path(sys.argv[1])), 'inventory/local.py', allow_dirty=True, timeout=600)",
                               str(project.root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pyinfra_pid = None
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline and caller.poll() is None:
            time.sleep(0.1)
        pyinfra_pid = int(pid_file.read_text())
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait(30)
        deadline = time.monotonic() + 30
        while _alive(pyinfra_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pyinfra_pid), "the deploy outlived its killed caller"
    finally:
        if caller.poll() is None:
            caller.kill()
        if pyinfra_pid and _alive(pyinfra_pid):
            os.kill(pyinfra_pid, signal.SIGKILL)
