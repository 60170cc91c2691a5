"""knobkeeper.fsio: the one lock and the one atomic write, and that every writer of the tree uses them;
the deploy and canary locks built on it, which a look at them never fails."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knobkeeper import fsio
from knobkeeper.deploy import canary_state
from knobkeeper.deploy.record import DEPLOY_BUSY, deploy_lock, take_deploy_lock
from knobkeeper.errors import UserError
from knobkeeper.fsio import unlock_file

SOURCE = Path(__file__).resolve().parent.parent


def test_atomic_write_never_takes_a_temp_name_another_writer_may_hold(tmp_path):
    target = tmp_path / "cache.json"
    # What a writer with a fixed temp name would be in the middle of writing, beside the target.
    others = [tmp_path / "cache.tmp", tmp_path / "cache.json.tmp", tmp_path / ".cache.json.tmp"]
    for other in others:
        other.write_text("another process, half-way")
    fsio.atomic_write(target, '{"a": 1}')
    fsio.atomic_write(target, '{"a": 2}')
    assert target.read_text() == '{"a": 2}'
    assert all(other.read_text() == "another process, half-way" for other in others)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, *(o.name for o in others)])


def test_atomic_write_keeps_the_mode_and_leaves_the_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "secret"
    fsio.atomic_write(target, "one", mode=0o600)
    fsio.atomic_write(target, "two")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == "two"
    fsio.atomic_write(tmp_path / "new", b"x")
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o644

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        fsio.atomic_write(target, "three")
    assert target.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "secret"]


def test_atomic_write_and_replace_dir_fsync_the_file_and_its_folder(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def record(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    fsio.atomic_write(tmp_path / "f", "x")
    assert synced == ["file", "folder"]
    synced.clear()
    built = fsio.temp_dir_beside(tmp_path / "model")
    assert built.parent == tmp_path and built.name.startswith(".model-")
    (built / "weights").write_text("w")
    fsio.replace_dir(built, tmp_path / "model")
    assert (tmp_path / "model" / "weights").read_text() == "w" and not built.exists()
    assert synced == ["folder"]


def test_lock_file_refuses_at_once_or_after_the_grace_while_another_process_holds_it(tmp_path):
    path = tmp_path / "sub" / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
                               "print('held', flush=True); time.sleep(60)", str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        path.parent.mkdir()
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="^the deploy runs$"):
            fsio.lock_file(path, wait=False, busy="the deploy runs")
        with pytest.raises(UserError, match="locked by another process"):
            fsio.lock_file(path, wait=0.05)
    finally:
        holder.kill()
        holder.wait()
    handle = fsio.lock_file(path, wait=False)  # its holder died: the lock died with it
    fsio.unlock_file(handle)
    fsio.unlock_file(handle)  # a second release is harmless


# A look at a lock (issue 25): a canary waiting for the deploy lock (and `recover_interrupted`, and
# every look at the canary lock) takes the lock for an instant to see whether it is free; a deploy (or
# a canary) starting in that instant failed with "another deploy of this repo is running". A real
# second process looks at the lock the way they do, as fast as it can (the instant made constant);
# every deploy-lock take and canary start meanwhile must succeed, and a real holder must still be
# refused.
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


# Writing by rename or locking by hand, outside fsio: every writer must go through it (the kernels
# import nothing of the controller, so they keep their own, which takes a unique temp name too).
HAND_WRITTEN = re.compile(r"os\.replace\(|os\.rename\(|\.rename\(|fcntl\.flock\(|mkstemp\(|\.tmp[\"']")
ALLOWED = {
    # the migration of the old secrets layout: renames only, no content written
    "knobkeeper/changelog/secrets.py": ("legacy.rename(staging", "staging.rename(legacy)"),
}


def test_every_writer_of_the_tree_goes_through_fsio():
    found = []
    for path in sorted([*SOURCE.glob("knobkeeper/**/*.py"), SOURCE / "deploy.py", SOURCE / "config.py",
                        *SOURCE.glob("inventory/*.py")]):
        rel = str(path.relative_to(SOURCE))
        if rel == "knobkeeper/fsio.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HAND_WRITTEN.search(line) and not any(words in line for words in ALLOWED.get(rel, ())):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == []
