"""Issue 25 finding 10 (SIGTERM): `knobkeeper canary` stopped by SIGTERM printed only click's
"Aborted!". A real second process runs the CLI (the deploy, the metrics source and the host look-up
of `status` stood in for: the point is the signal path); SIGTERM by its PID once the candidate is
on: the canary hosts are put back (a rollback deploy), and it says so in one line, exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from knobkeeper.deploy import canary_state

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"

CANARY = textwrap.dedent(f"""
    import sys
    from types import SimpleNamespace
    import knobkeeper.deploy.api as api
    from knobkeeper.deploy import status
    from knobkeeper.evidence import metrics
    from knobkeeper.cli import main

    class Source:                                  # windows are never asked for: SIGTERM comes first
        name = "scrape"
        def __init__(self, *a, **k): pass
        def check(self): pass
        def start(self): pass
        def stop(self): pass

    def deploy(project, inventory, **kw):
        print(kw["extra_data"]["canary"]["phase"], flush=True)
        return api.DeployResult(0, "", SimpleNamespace(result="ok", error=None), "d3p10y00", 0.1)

    status.stack_status = lambda project, inventory: []
    metrics.ScrapeSource = Source
    api.run_deploy = deploy
    main(["canary", "{KNOB}=512", "--role", "decode", "--calibrate", "0", "--duration", "60s", "--interval", "30s",
          "--repo", sys.argv[1]])
""")


def test_sigterm_says_what_was_put_back(project):
    env = {**os.environ, "KNOBKEEPER_LOCAL_WORKERS": "decode=2"}
    proc = subprocess.Popen([sys.executable, "-c", CANARY, str(project.root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "candidate"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.strip() == "rollback", out
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip() == (f"canary {KNOB}=512 stopped by SIGTERM: @local/knobkeeper-decode put back to the "
                           f"declared state (a recorded deploy); no evidence written"), err
    assert "Aborted!" not in err and canary_state.read_marker(project) is None


# The same CLI with windows to judge (test_canary's prepared numbers, keyed by the real targets) and
# a put-back deploy that takes long enough for SIGTERM to land in it, after the evidence was written.
CANARY_PUTBACK = textwrap.dedent(f"""
    import sys, time
    from types import SimpleNamespace
    import knobkeeper.deploy.api as api
    from knobkeeper.deploy import status
    from knobkeeper.evidence import canary
    from knobkeeper.evidence import metrics
    from knobkeeper.cli import main
    from tests.test_canary import _stats

    class Source:
        name = "scrape"
        def __init__(self, targets, *a, **k): self.keys = [t.key for t in targets]
        def check(self): pass
        def start(self): pass
        def stop(self): pass
        def windows(self, edges):
            return {{key: _stats(1000, 16, n=len(edges) - 1, seed=i) for i, key in enumerate(self.keys)}}

    def deploy(project, inventory, **kw):
        phase = kw["extra_data"]["canary"]["phase"]
        print(phase, flush=True)
        if phase == "rollback":
            time.sleep(60)                         # SIGTERM lands here
        return api.DeployResult(0, "", SimpleNamespace(result="ok", error=None), "d3p10y00", 0.1)

    canary.SETTLE_MIN_S = 0.0
    status.stack_status = lambda project, inventory: []
    metrics.ScrapeSource = Source
    api.run_deploy = deploy
    main(["canary", "{KNOB}=512", "--role", "decode", "--calibrate", "0", "--duration", "2s", "--interval", "1s",
          "--repo", sys.argv[1]])
""")


def test_sigterm_during_the_put_back_names_the_evidence_written(project):
    """Issue 25 finding 5 (rest): interrupted after the evidence was committed but before the put-back
    finished, the line named no evidence ("no evidence written"); it names the one written."""
    from knobkeeper.evidence import store

    env = {**os.environ, "KNOBKEEPER_LOCAL_WORKERS": "decode=2"}
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", CANARY_PUTBACK, str(project.root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(root))
    try:
        assert proc.stdout.readline().strip() == "candidate"
        assert proc.stdout.readline().strip() == "rollback"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    (path,) = store.paths(project)
    doc = store.read(path, project.rel(path))
    assert err.strip().splitlines()[-1] == (  # after the windows' progress lines
        f"canary {KNOB}=512 stopped by SIGTERM: @local/knobkeeper-decode may still be on the "
                           f"candidate: put them back with `knobkeeper canary abort`; evidence {doc.id} "
                           f"({project.rel(path)}) written"), err
    assert canary_state.read_marker(project) is not None   # the put-back did not finish: `canary abort` finds it
