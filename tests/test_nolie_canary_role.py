"""Issue 25 findings 2 and 3: a canary owns its role while it runs. A real second process runs
`knobkeeper.evidence.canary.canary` (only its measurement, `run`, and the host look-up of `status`
are stood in for: the point is what the canary holds from its start). While it calibrates, a
colleague's `set`, `unset`, `revert`, `restore` of a decode knob and a deploy of the decode role are
refused with one line naming the canary (exit 2, nothing written); prefill stays free. Killed by its
PID before its candidate went on, it leaves nothing to put back. A canary does not start on a role
whose workers are not in sync with what is declared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from knobkeeper.changelog import ops
from knobkeeper.deploy import canary_state
from knobkeeper.deploy.status import ServiceStatus
from knobkeeper.errors import UserError
from knobkeeper.evidence import canary
from tests.infra import cli, one_line_exit_2, snapshot

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
NCCL = "NCCL_MIN_NCHANNELS"
TWO = {"KNOBKEEPER_LOCAL_WORKERS": "decode=2"}   # inventory/local.py: two decode workers (one canary, one baseline)

CANARY = textwrap.dedent(f"""
    import sys, time
    from pathlib import Path
    from knobkeeper.deploy import status
    from knobkeeper.evidence import canary
    from knobkeeper.project import Project

    status.stack_status = lambda project, inventory: []        # every worker in sync (no hosts to look at here)
    def calibrating(*args, **kwargs):                     # stands for the calibration windows
        print("calibrating", flush=True)
        time.sleep(120)
    canary.run = calibrating
    canary.canary(Project(Path(sys.argv[1])), "{KNOB}=512", role="decode", inventory="inventory/local.py")
""")


def test_a_running_canary_owns_its_role_and_a_dead_one_before_its_candidate_leaves_nothing(project, monkeypatch):
    monkeypatch.setenv(*next(iter(TWO.items())))
    ops.set_knob(project, NCCL, "8", "decode", "more channels")
    ops.set_knob(project, KNOB, "256", "decode", "try 256")
    ops.revert_knob(project, KNOB, "decode", "suspect")
    proc = subprocess.Popen([sys.executable, "-c", CANARY, str(project.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "calibrating"
        before = snapshot(project)
        owner = f"canary {KNOB}=512 on @local/knobkeeper-decode holds role decode (calibrating, pid {proc.pid}"
        for args in (("set", f"{KNOB}=128", "--role", "decode", "--reason", "colleague"),
                     ("unset", NCCL, "--role", "decode", "--reason", "colleague"),
                     ("revert", NCCL, "--role", "decode", "--reason", "colleague"),
                     ("restore", KNOB, "--role", "decode", "--reason", "colleague"),
                     ("deploy", "inventory/local.py")):
            done = cli(project, *args)
            one_line_exit_2(done, owner)
        assert snapshot(project) == before   # nothing written
        with pytest.raises(UserError, match="deploy of inventory/local.py \\(roles decode\\): canary"):
            canary_state.refuse_deploy(project, "inventory/local.py", ["decode"])
        canary_state.refuse_deploy(project, "inventory/local.py", ["prefill"])            # not its role
        canary_state.refuse_deploy(project, "inventory/local.py", ["decode"], proc.pid)   # its own deploy
        ops.set_knob(project, NCCL, "4", "prefill", "prefill is not the canary's")         # not its role
        with pytest.raises(UserError, match="canary .* is running"):                      # a second canary
            canary.canary(project, f"{KNOB}=128", role="decode", inventory="inventory/local.py")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Killed while calibrating: its candidate never went on, so nothing is abandoned and the role is free.
    assert canary_state.abandoned_line(project) is None and canary_state.read_marker(project) is None
    ops.set_knob(project, KNOB, "128", "decode", "the canary is gone")


def test_the_canary_process_itself_may_set_its_role(project):
    """The promote's `set` runs in the canary's own process while it holds the role."""
    handle = canary_state.hold(project)
    try:
        canary_state.write_marker(project, {"knob": KNOB, "value": 512, "role": "decode", "scope": "decode",
                                            "inventory": "inventory/local.py", "pid": os.getpid()})
        ops.set_knob(project, KNOB, "512", "decode", "promoted")
    finally:
        canary_state.clear_marker(project)
        canary_state.release(project, handle)


def test_a_canary_refuses_a_role_out_of_sync(project, monkeypatch):
    """A worker left on an earlier candidate (drifted) is refused before anything is measured or deployed."""
    monkeypatch.setenv(*next(iter(TWO.items())))
    rows = [ServiceStatus("@local", "knobkeeper-decode", "decode", "drifted", 42, "RUNNING", "d1", "d2",
                          [f"{KNOB}: running 512, declared unset"]),
            ServiceStatus("@local", "knobkeeper-prefill", "prefill", "down", None, "STOPPED", "d3", None)]
    monkeypatch.setattr("knobkeeper.deploy.status.stack_status", lambda project_, inventory: rows)
    monkeypatch.setattr(canary, "run", lambda *a, **k: pytest.fail("the canary ran on a drifted role"))
    with pytest.raises(UserError) as refused:
        canary.canary(project, f"{KNOB}=256", role="decode", inventory="inventory/local.py")
    assert str(refused.value) == (
        f"canary: @local/knobkeeper-decode is drifted ({KNOB}: running 512, declared unset): the decode workers "
        f"must run the declared state; run `knobkeeper deploy inventory/local.py --only decode` first "
        f"(see `knobkeeper status inventory/local.py`)")
    assert canary_state.read_marker(project) is None      # nothing left behind
    canary_state.release(project, canary_state.hold(project))   # and the lock is free
