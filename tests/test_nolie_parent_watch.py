"""Issue 25 finding 4 (rest): a deploy must not outlive a caller killed outright on any OS, not only
where Linux's PR_SET_PDEATHSIG exists. The portable half: the deploy's process watches its parent
PID itself (knobkeeper/deploy/parent.py, started from config.py).

- real processes, no prctl anywhere: a middle process starts a child that watches it (in its own
  session, as run_deploy's pyinfra is), the middle is SIGKILLed by PID, the child goes;
- run_deploy's real pyinfra run starts the watch (deploy.py stood in for by one that reports it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from knobkeeper.deploy import parent
from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.local import _alive
from tests.infra import make_infra_repo

MIDDLE = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import time; from knobkeeper.deploy.parent import watch_parent; "
    "print(watch_parent(0.2), flush=True); time.sleep(300)"],
    env={{**os.environ, {parent.PARENT_ENV!r}: str(os.getpid())}}, start_new_session=True, stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(300)
"""


def test_a_watched_child_dies_with_its_sigkilled_parent_without_prctl():
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        first, second = middle.stdout.readline().strip(), middle.stdout.readline().strip()
        child = int(first if first.isdigit() else second)
        assert "True" in (first, second)           # watching
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait(30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the child outlived its SIGKILLed parent"
    finally:
        if middle.poll() is None:
            middle.kill()
            middle.wait()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
    # not started by run_deploy: nothing to watch
    assert parent.PARENT_ENV not in os.environ and parent.watch_parent() is False


def test_run_deploy_s_pyinfra_watches_its_parent(tmp_path):
    project = make_infra_repo(Path(tempfile.mkdtemp(prefix="kk-")))
    report = tmp_path / "threads.json"
    (project.root / "deploy.py").write_text(   # stands for the deploy: what config.py started, then done
        "import json, os, threading\n"
        f"json.dump({{'threads': [t.name for t in threading.enumerate()], "
        f"'env': os.environ.get({parent.PARENT_ENV!r})}}, open({str(report)!r}, 'w'))\n")
    run_deploy(project, "inventory/local.py", allow_dirty=True, timeout=300)
    seen = json.loads(report.read_text())
    assert parent.THREAD_NAME in seen["threads"], seen
    assert seen["env"] is None                    # removed: what the deploy starts does not inherit it
