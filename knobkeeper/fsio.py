"""Files written whole and locks taken one way: every writer in knobkeeper goes through here.

    lock_file(path, wait=...)   an exclusive flock on `path` (created if missing); the open handle holds it
    unlock_file(handle)         release it (a second release is harmless)
    atomic_write(path, data)    readers see the old file or the new one, never half of either
    replace_dir(built, target)  a folder built beside `target` takes its place, for readers whole

An atomic write goes to a temp file in the same folder with a name no other process picks
(tempfile.mkstemp: `.NAME.XXXXXXXX.tmp`), is fsynced, renamed over the target, and the folder is
fsynced, so the rename itself survives a power cut. A fixed temp name (`NAME.tmp`) is not enough:
two processes writing the same cache at once would write into one temp file, and the second's rename
finds it gone or renames the first's half-written bytes into place.

The lock is an flock: held by the open file description, so it ends when its holder dies however it
dies, and children that inherit the descriptor keep it (the changelog's repo lock relies on that:
a `git commit` whose parent was killed keeps the lock until it exits).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError

# A lock taken only to look (is its holder alive? is the deploy lock free?) is held for
# microseconds; a command that fails on a held lock instead of waiting (a deploy, a canary's start)
# waits this long first, so another process's look never fails it. A real holder (a running deploy,
# a running canary) holds it for minutes: the command still fails, this much later.
LOOK_GRACE_S = 2.0


def lock_file(path: Path, *, wait: bool | float = True, busy: str | None = None):
    """An exclusive flock on `path` (created if missing); returns the open handle holding it.

    wait=False: a lock held elsewhere raises UserError(`busy`) at once instead of waiting; a number:
    after trying for that many seconds (LOOK_GRACE_S: past another process's look at the lock)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")
    except OSError as exc:
        raise UserError(f"{path}: cannot open the lock ({exc.strerror})") from None
    deadline = time.monotonic() + (wait if not isinstance(wait, bool) else 0.0)
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait is True else fcntl.LOCK_NB))
            return handle
        except OSError:
            if time.monotonic() < deadline:
                time.sleep(random.uniform(0.001, 0.01))   # jittered: never in step with a looker's rhythm
                continue
            handle.close()
            raise UserError(busy or f"{path}: locked by another process") from None


def unlock_file(handle) -> None:
    """Release a lock_file lock (a second release is harmless)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
    except (OSError, ValueError):
        pass


def atomic_write(path: Path, content: str | bytes, mode: int | None = None) -> None:
    """Write via a uniquely named temp file in the same folder, fsync it, rename it over `path` and
    fsync the folder: readers see old or new, never half, and the rename survives a crash.

    `mode`: the file's permissions (default: those of the file replaced, else 0644). The folder is
    created when missing. On any failure the temp file is removed and the old file is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def temp_dir_beside(target: Path) -> Path:
    """A new, uniquely named folder in `target`'s folder (`.NAME-XXXXXXXX`), to build `target` in and
    then replace_dir it into place (same file system: the rename is atomic)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))


def replace_dir(built: Path, target: Path) -> None:
    """Rename the finished folder `built` to `target` (absent, or an empty folder) and fsync the
    folder that holds it, so a reader finds the whole folder or none."""
    os.replace(built, target)
    fsync_dir(Path(target).parent)


def move_into_place(written: Path, target: Path) -> None:
    """Rename a file another program wrote whole (a compiler's `-o` output) over `target`, atomically,
    and fsync the folder: a reader finds the old file, the new one, or none, never a part."""
    os.replace(written, target)
    fsync_dir(Path(target).parent)


def fsync_dir(folder: Path) -> None:
    """fsync a folder, so that a rename in it is on disk (a no-op where the OS cannot open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path` (a marker: the canary's, an experiment's), or None when there is
    none, it is unreadable or not an object: a marker half written by a killed process is no marker."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_marker_file(path: Path, record: Any, what: str, fix: str) -> Any:
    """The marker in `path` read as the declared `record` (knobkeeper.declared), or None when there
    is none; UserError naming the file, the first problem and `fix` when it is not `what`."""
    data = read_json_object(path)
    if data is None:
        return None
    marker, problems = record.read(data)
    if problems:
        raise UserError(f"{path}: not {what} ({problems[0]}); {fix}")
    return marker


def write_json_object(path: Path, data: dict[str, Any], *, allow_nan: bool = True) -> None:
    """`data` as one line of JSON, atomically (atomic_write)."""
    atomic_write(path, json.dumps(data, allow_nan=allow_nan) + "\n")
