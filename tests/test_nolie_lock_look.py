"""Issue 25, the lock wait's instant-take window: a canary waiting for the deploy lock (and
`recover_interrupted`, and every look at the canary lock) takes the lock for an instant to see
whether it is free; a deploy (or a canary) starting in that instant failed with "another deploy of
this repo is running". A real second process looks at the lock the way they do, as fast as it can
(the instant made constant); every deploy-lock take and canary start meanwhile must succeed, and a
real holder must still be refused."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from knobkeeper.fsio import unlock_file
from knobkeeper.deploy import canary_state
from knobkeeper.deploy.record import DEPLOY_BUSY, deploy_lock, take_deploy_lock
from knobkeeper.errors import UserError

LOOKER = """
import fcntl, os, sys, time
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
looks, until = 0, time.monotonic() + float(sys.argv[2])
print("looking", flush=True)
while time.monotonic() < until:          # take it, see it was free, give it back (the canary's wait)
    f = open(sys.argv[1], "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        time.sleep(0.005)                # the instant, stretched: held half the time, so a take that
        fcntl.flock(f, fcntl.LOCK_UN)    # fails on a look fails within a few tries, not by luck
        looks += 1
    except OSError:
        pass
    f.close()
    time.sleep(0.005)                    # the canary looks every 0.5 s; this one a hundred times as often
print(looks, flush=True)
"""

HOLDER = ("import fcntl, os, sys, time\nos.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)\n"
          "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)\n")


def _run(script: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() in ("looking", "held")
    return proc


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.kill()
    out = proc.communicate(timeout=30)[0]
    return out


def test_a_look_at_a_lock_never_fails_a_deploy_or_a_canary_start(project):
    looker = _run(LOOKER, deploy_lock(project), 60)
    try:
        for _ in range(40):              # spread over the looker's rhythm (a take is microseconds)
            unlock_file(take_deploy_lock(project))
            time.sleep(0.007)
    finally:
        looker.kill()
        looker.wait(30)
    looker = _run(LOOKER, canary_state.lock_path(project), 60)
    try:
        for _ in range(40):
            canary_state.release(project, canary_state.hold(project))
            time.sleep(0.007)
    finally:
        looker.kill()
        looker.wait(30)
    # a deploy that really runs still refuses the second one
    holder = _run(HOLDER, deploy_lock(project))
    try:
        with pytest.raises(UserError, match=DEPLOY_BUSY):
            take_deploy_lock(project)
    finally:
        _stop(holder)
