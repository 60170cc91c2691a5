"""Issue 25 finding 4: a canary that dies leaves a marker. A real second process stands for the
canary: it holds the canary's lock and writes the marker as the candidate deploy starts, then is
SIGKILLed by its PID. `check`, `plan` and the next canary then say "canary X=V on S abandoned at T;
put back with `knobkeeper canary abort`", and `canary abort` deploys those services back (the deploy is
the only part stood in for: one call of run_deploy, checked for what it is asked) and clears it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from knobkeeper.deploy import canary_state
from knobkeeper.deploy.api import DeployResult
from knobkeeper.errors import UserError
from knobkeeper.evidence import canary
from knobkeeper.review.check import check
from tests.infra import cli, kk, one_line_exit_2

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
SERVICE = "@local/knobkeeper-decode"

CANARY = textwrap.dedent(f"""
    import sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from knobkeeper.deploy import canary_state
    from knobkeeper.evidence import canary
    from knobkeeper.project import Project

    project = Project(Path(sys.argv[1]))
    handle = canary_state.hold(project)
    plan = canary.Plan({KNOB!r}, 512, None, "decode", [], [])
    def candidate_deploy(targets, knobs):       # stands for the deploy in flight when the kill comes
        print("deploying", flush=True)
        time.sleep(120)
    switch = canary.marked_switch(project, "inventory/local.py", plan, canary.Switch(apply=candidate_deploy, restore=lambda: None))
    switch.apply([SimpleNamespace(key={SERVICE!r}, host="@local")], {{{KNOB!r}: 512}})
""")


def test_a_killed_canary_is_named_everywhere_and_abort_puts_it_back(project, monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", CANARY, str(project.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "deploying"
        # Alive: not abandoned; another canary is refused, `canary abort` too.
        assert canary_state.abandoned_line(project) is None
        with pytest.raises(UserError, match=f"canary {KNOB}=512 on {SERVICE} is running"):
            canary_state.hold(project)
        one_line_exit_2(cli(project, "canary", "abort"), "is still running")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    marker = canary_state.read_marker(project)
    line = (f"canary {KNOB}=512 on {SERVICE} abandoned at {marker['seen_at']} during its candidate deploy; put "
            f"back with `knobkeeper canary abort` (or a deploy of role decode)")
    assert canary_state.abandoned_line(project) == line
    problems = [p.line() for p in check(project).problems]
    assert problems == [f"{project.rel(canary_state.marker_path(project))}: {line}"], problems
    planned = cli(project, "plan", "inventory/local.py")
    assert planned.returncode == 0 and f"warning: {line}" in planned.stderr.decode(), planned.stderr
    with pytest.raises(UserError) as refused:           # the next canary, before anything deploys
        canary.canary(project, f"{KNOB}=256", role="decode", inventory="inventory/local.py")
    assert str(refused.value) == line

    calls = []

    def fake_deploy(project_, inventory, **kw):
        calls.append((inventory, kw))
        return DeployResult(0, "", None, "d3p10y00", 1.0)

    monkeypatch.setattr("knobkeeper.deploy.api.run_deploy", fake_deploy)
    monkeypatch.setattr(DeployResult, "ok", property(lambda self: True))
    result = kk(project, "canary", "abort")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (f"canary {KNOB}=512 on {SERVICE} (abandoned during its candidate deploy): "
                                     f"put back to the declared state (deploy d3p10y00)")
    ((inventory, kw),) = calls
    assert inventory == "inventory/local.py" and kw["only"] == "decode" and kw["limit"] == ["@local"]
    assert kw["extra_data"]["canary"] == {"knob": KNOB, "value": 512, "hosts": ["@local"], "services": [SERVICE],
                                          "phase": "abort", "abandoned": "candidate-deploy"}
    assert canary_state.read_marker(project) is None and check(project).ok
    one_line_exit_2(cli(project, "canary", "abort"), "no abandoned canary")
    # the flag `canary abort` replaced still works, saying so first
    done = cli(project, "canary", "--abort")
    assert done.returncode == 2 and done.stderr.decode().splitlines() == [
        "knobkeeper: canary --abort is deprecated: use `knobkeeper canary abort`",
        "error: canary abort: no abandoned canary in this repo (nothing to put back)"], done.stderr


def test_a_canary_that_puts_back_leaves_no_marker(project):
    plan = canary.Plan(KNOB, 512, None, "decode", [], [])
    applied = []
    switch = canary.marked_switch(project, "inventory/local.py", plan,
                             canary.Switch(apply=lambda t, k: applied.append(k), restore=lambda: None))
    from types import SimpleNamespace

    switch.apply([SimpleNamespace(key=SERVICE, host="@local")], {KNOB: 512})
    assert canary_state.read_marker(project)["services"] == [SERVICE] and applied
    switch.restore()
    assert canary_state.read_marker(project) is None


# A canary killed in each deploy phase (a real second process, SIGKILL by PID while the step named
# blocks): the marker says which deploy was in flight, and status, check and `canary abort` use it.
PHASED = textwrap.dedent(f"""
    import sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from knobkeeper.deploy import canary_state
    from knobkeeper.evidence import canary
    from knobkeeper.project import Project

    project, stop_in = Project(Path(sys.argv[1])), sys.argv[2]
    handle = canary_state.hold(project)
    canary_state.write_marker(project, {{"knob": {KNOB!r}, "value": 512, "role": "decode", "scope": "decode",
                                        "inventory": "inventory/local.py", "phase": "calibrating", "pid": 0}})
    plan = canary.Plan({KNOB!r}, 512, None, "decode", [], [])
    def step(name):
        def run(*args):
            if name == stop_in:
                print("in " + name, flush=True)
                time.sleep(120)
        return run
    switch = canary.marked_switch(project, "inventory/local.py", plan,
                             canary.Switch(apply=step("candidate-deploy"), restore=step("put-back"),
                                      promote_rest=step("promote")))
    switch.apply([SimpleNamespace(key={SERVICE!r}, host="@local")], {{{KNOB!r}: 512}})
    if stop_in == "candidate":
        print("in candidate", flush=True)
        time.sleep(120)
    switch.promote_rest() if stop_in == "promote" else switch.restore()
""")


@pytest.mark.parametrize("phase, words, limit", [
    ("candidate-deploy", "during its candidate deploy", ["@local"]),
    ("candidate", "on its candidate", ["@local"]),
    ("put-back", "during its put-back", ["@local"]),
    ("promote", "during its promote", None)])
def test_the_marker_says_which_deploy_was_in_flight(project, monkeypatch, phase, words, limit):
    proc = subprocess.Popen([sys.executable, "-c", PHASED, str(project.root), phase], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == f"in {phase}"
        running = canary_state.running(project)
        assert running["phase"] == phase
        with pytest.raises(UserError, match=f"holds role decode \\({words}, pid "):   # a `set` of the role meanwhile
            canary_state.refuse_change(project, "decode", "set")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    line = canary_state.abandoned_line(project)
    assert f"abandoned at {canary_state.read_marker(project)['seen_at']} {words}" in line, line
    if phase == "promote":
        assert f"{KNOB} is set; the rest of role decode may not run it yet); finish with `knobkeeper canary abort`" \
            in line, line
    assert [p.line() for p in check(project).problems] == [f"{project.rel(canary_state.marker_path(project))}: {line}"]
    status = cli(project, "status", "inventory/local.py")
    assert f"warning: {line}" in status.stderr.decode(), status.stderr
    calls = []
    monkeypatch.setattr("knobkeeper.deploy.api.run_deploy",
                        lambda project_, inventory, **kw: calls.append(kw) or DeployResult(0, "", None, "d3p10y00", 1.0))
    monkeypatch.setattr(DeployResult, "ok", property(lambda self: True))
    result = kk(project, "canary", "abort")
    assert result.exit_code == 0, result.output
    assert f"(abandoned {words}): " in result.output, result.output
    ((kw,),) = [(c,) for c in calls]
    assert kw["limit"] == limit and kw["only"] == "decode" and kw["extra_data"]["canary"]["abandoned"] == phase
    assert canary_state.read_marker(project) is None
