"""Issue 25 finding 10 (the part done): a disk that fills up during `set` ends in one line naming the
file and saying that nothing was changed, not an OSError traceback. A small RLIMIT_FSIZE in the real
CLI's own process stands for the full disk (Python ignores SIGXFSZ: a write past it is EFBIG)."""

from __future__ import annotations

import resource
import subprocess
import sys

from tests.infra import snapshot

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def _limited(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_during_set_is_one_line_and_changes_nothing(project):
    before = snapshot(project)
    for limit in (64,):   # the journal fails
        done = subprocess.run([sys.executable, "-m", "knobkeeper.cli", "set", f"{KNOB}=512", "--role", "decode",
                               "--reason", "x", "--allow-undeclared", "--repo", str(project.root)],
                              capture_output=True, text=True, preexec_fn=_limited(limit))
        err = done.stderr.strip()
        assert done.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, (limit, err)
        assert "cannot write (File too large); nothing was changed" in err, err
        assert snapshot(project) == before
    ok = subprocess.run([sys.executable, "-m", "knobkeeper.cli", "set", f"{KNOB}=512", "--role", "decode",
                         "--reason", "x", "--allow-undeclared", "--repo", str(project.root)], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
