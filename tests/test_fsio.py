"""knobkeeper.fsio: the one lock and the one atomic write, and that every writer of the tree uses them."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from knobkeeper import fsio
from knobkeeper.errors import UserError

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
