"""Every call of git goes through here: the one git module.

Plain `git` subprocesses, text in and out. Reads use it because gitpython's import costs ~100 ms
on every read command; the changelog store's commits use it too (`commit_paths`), so there is one
place that knows how git is invoked, how its failures read, and how long input reaches it
(on stdin, never argv: a message or value over ~128 KiB would be "Argument list too long").
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

from knobkeeper.errors import UserError


def run(root: Path | str, *args: str, input: str | None = None,
        env: Mapping[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """`git -C root ARGS`, never raising on a non-zero exit (the caller decides).

    `pass_fds`: descriptors the child inherits; the changelog store hands it its lock, so the lock
    is held until git exits even if this process dies first.
    """
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, input=input,
        env={**os.environ, **env} if env else None, pass_fds=pass_fds,
    )


def output(root: Path | str, *args: str, input: str | None = None,
           env: Mapping[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> str:
    """The stdout of `git -C root ARGS`, or a one-line UserError quoting git's own last line."""
    done = run(root, *args, input=input, env=env, pass_fds=pass_fds)
    if done.returncode != 0:
        raise UserError(f"git {' '.join(args[:2])}: {failure_line(done)}")
    return done.stdout


def failure_line(done: subprocess.CompletedProcess) -> str:
    """git's last line of complaint, as text (never a Python list)."""
    lines = (done.stderr or done.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"failed with exit status {done.returncode}"


def rev_parse(root: Path | str, ref: str) -> str | None:
    """The full sha `ref` names as a commit, or None."""
    done = run(root, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}")
    return done.stdout.strip() or None if done.returncode == 0 else None


def head_sha(root: Path | str) -> str | None:
    """HEAD's sha, or None in a repository without commits."""
    return rev_parse(root, "HEAD")


def last_commit_touching(root: Path | str, paths: Iterable[str]) -> str | None:
    """The newest commit that changed any of `paths`, or None."""
    done = run(root, "log", "-1", "--format=%H", "--", *paths)
    return done.stdout.strip() or None


def dirty_paths(root: Path | str, paths: Iterable[str]) -> list[str]:
    """Paths under `paths` with uncommitted changes, tracked or untracked."""
    done = run(root, "status", "--porcelain", "--", *paths)
    return [line[3:] for line in done.stdout.splitlines() if line.strip()]


def merge_base(root: Path | str, a: str, b: str) -> str | None:
    done = run(root, "merge-base", a, b)
    return done.stdout.strip() or None if done.returncode == 0 else None


def is_ancestor(root: Path | str, ancestor: str, descendant: str) -> bool:
    return run(root, "merge-base", "--is-ancestor", ancestor, descendant).returncode == 0


def commit_paths(root: Path | str, paths: Iterable[str], message: str, pass_fds: tuple[int, ...] = ()) -> None:
    """Commit exactly `paths` (already added) with `message` kept verbatim, read from stdin.

    --only: the commit holds these paths and nothing else the user has staged; -F -: a message of
    any size (argv is limited to ~128 KiB per argument); --no-verify: the tool's own commits are
    checked by the tool, not by the user's hooks; no background gc/maintenance, which would
    inherit `pass_fds` (a caller's lock) and hold it long after the commit.
    """
    done = run(root, "-c", "gc.auto=0", "-c", "maintenance.auto=false", "commit", "-q", "--only", "--no-verify",
               "--cleanup=verbatim", "-F", "-", "--", *paths, input=message, pass_fds=pass_fds)
    if done.returncode != 0:
        raise UserError(f"git commit failed: {failure_line(done)}")


def config(root: Path | str, key: str) -> str:
    """A git config value, '' when unset."""
    return run(root, "config", key).stdout.strip()
