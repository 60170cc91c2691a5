"""Issue 25 finding 5: the put-back loses to the deploy lock. A real second process holds the
repo's deploy lock (as a running `deploy` does) while the canary puts its hosts back. The deploy
itself is stood in for by a `run_deploy` that fails as the real one does when the lock is held
("another deploy of this repo is running"); the source and judgement are test_canary's fakes.

- the put-back waits for the lock (progress on stderr) and then succeeds; the evidence was
  written (committed) before the put-back started;
- a lock held past the bound: the one-line error names the services left on the candidate and
  `knobkeeper canary abort`, the evidence is kept, the marker stays for `canary abort`;
- the candidate deploy blocked past the bound: nothing was applied, so no rollback is attempted
  and nothing says "rollback deploy failed"."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from knobkeeper.fsio import lock_file, unlock_file
from knobkeeper.deploy import canary_state
from knobkeeper.deploy.api import DeployResult
from knobkeeper.deploy.record import deploy_lock
from knobkeeper.errors import UserError
from knobkeeper.evidence import canary
from knobkeeper.evidence import store
from tests.infra import git, make_infra_repo
from tests.test_canary import FakeSource, _noisy, _plan, _with_requests

HOLDER = ("import fcntl, os, sys, time\n"
          "os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)\n"
          "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
          "time.sleep(float(sys.argv[2]))\n")


class Deploys:
    """run_deploy as the real one behaves towards the lock; `on_candidate` runs as the candidate deploys."""

    def __init__(self, project, on_candidate=lambda: None):
        self.project, self.on_candidate, self.calls = project, on_candidate, []

    def __call__(self, project, inventory, **kw):
        phase = kw["extra_data"]["canary"]["phase"]
        try:
            handle = lock_file(deploy_lock(project), wait=False)
        except UserError:
            self.calls.append((phase, "busy"))
            return DeployResult(1, f"knobkeeper: error: another deploy of this repo is running (lock x)\n",
                                None, "d", 0.1)
        unlock_file(handle)
        self.calls.append((phase, git(project.root, "log", "-1", "--format=%s")))
        if phase == "candidate":
            self.on_candidate()
        return DeployResult(0, "", SimpleNamespace(result="ok", error=None), "d", 0.1)


def _hold(project, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(deploy_lock(project)), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _worse_source():
    windows = _with_requests(_noisy(21))
    for w in windows["h1/decode"]:
        w.errors = 100
    return FakeSource(_with_requests(_noisy(20)), windows)


OPTIONS = dict(duration=0.04, interval=0.01, settle=0)


def _switch(project, plan, lock_wait):
    return canary.marked_switch(project, "inventory/local.py", plan,
                           canary.deploy_switch(project, "inventory/local.py", plan, lock_wait=lock_wait))


def test_the_put_back_waits_for_the_deploy_lock_after_the_evidence_is_written(tmp_path, monkeypatch, capsys):
    project = make_infra_repo(tmp_path)
    plan = _plan()
    holders = []
    deploys = Deploys(project, on_candidate=lambda: holders.append(_hold(project, 2.5)))
    monkeypatch.setattr("knobkeeper.deploy.api.run_deploy", deploys)
    try:
        out = canary.run(project, plan, _worse_source(), _switch(project, plan, lock_wait=60), canary.Options(**OPTIONS))
    finally:
        for proc in holders:
            _stop(proc)
    assert out.verdict == "worse" and out.action == "rolled back"
    rollback = [c for c in deploys.calls if c[0] == "rollback"]
    assert len(rollback) == 1 and "canary worse" in rollback[0][1], deploys.calls   # evidence committed first
    assert "knobkeeper: canary rollback: waiting for another deploy of this repo to finish" in capsys.readouterr().err
    assert canary_state.read_marker(project) is None


def test_a_put_back_that_cannot_get_the_lock_names_what_is_left_and_keeps_the_evidence(tmp_path, monkeypatch):
    project = make_infra_repo(tmp_path)
    plan = _plan()
    holders = []
    deploys = Deploys(project, on_candidate=lambda: holders.append(_hold(project, 60)))
    monkeypatch.setattr("knobkeeper.deploy.api.run_deploy", deploys)
    try:
        with pytest.raises(UserError) as failed:
            canary.run(project, plan, FakeSource(_noisy(1), _noisy(11, 1.01)), _switch(project, plan, lock_wait=1.5),
                  canary.Options(**OPTIONS))
    finally:
        for proc in holders:
            _stop(proc)
    message = str(failed.value)
    assert "\n" not in message and "rollback deploy failed" not in message
    assert message.startswith("canary: rollback not done (another deploy of this repo is running"), message
    assert "h1/decode (hosts h1) still on SGLANG_SM120_MMA_TARGET_CTAS=512; put them back with " \
           "`knobkeeper canary abort`; evidence " in message, message
    ident = message.rsplit("evidence ", 1)[1].split(" ")[0]
    assert store.load(project, ident)["canary"]["verdict"] == "inconclusive"        # the windows are kept
    assert canary_state.read_marker(project)["applied_at"]                    # for `canary abort`


def test_a_candidate_deploy_that_never_started_rolls_nothing_back(tmp_path, monkeypatch):
    project = make_infra_repo(tmp_path)
    plan = _plan()
    deploys = Deploys(project)
    monkeypatch.setattr("knobkeeper.deploy.api.run_deploy", deploys)
    holder = _hold(project, 60)
    try:
        with pytest.raises(UserError) as failed:
            canary.run(project, plan, _worse_source(), _switch(project, plan, lock_wait=1), canary.Options(**OPTIONS))
    finally:
        _stop(holder)
    message = str(failed.value)
    assert message.startswith("canary: the candidate deploy of inventory/local.py did not start (another deploy") \
        and message.endswith("nothing was applied, nothing to put back"), message
    assert [c[0] for c in deploys.calls] == [], deploys.calls          # no rollback attempted
    assert not (canary_state.read_marker(project) or {}).get("applied_at")
