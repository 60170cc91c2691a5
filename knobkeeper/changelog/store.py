"""Write changelog files and commit exactly them, in one git commit, or leave the tree as it was.

A change is a set of files (new or replaced). `commit_change` takes the repo lock, writes a
journal of what the files held before, writes each file by temp file + rename, commits only
those paths (never the user's other staged or unstaged work), then drops the journal. If
anything fails before the commit, the old contents are put back. If the process dies instead,
the next mutating command finds the journal and rolls the files back before doing anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from knobkeeper.errors import UserError
from knobkeeper.project import Project

# Tests set this to prove that a crash between writing and committing leaves no mix.
FAULT_ENV = "KNOBKEEPER_FAULT"


@dataclass
class Message:
    """A commit message: a summary line, an optional body, and machine-readable trailers."""

    summary: str
    body: str = ""
    trailers: list[tuple[str, str]] = field(default_factory=list)

    def text(self) -> str:
        parts = [self.summary.strip()]
        if self.body.strip():
            parts.append(self.body.strip())
        if self.trailers:
            # A trailer value must be one line or git stops reading the block.
            parts.append("\n".join(f"{k}: {' '.join(str(v).split())}" for k, v in self.trailers))
        return "\n\n".join(parts) + "\n"


def _git(project: Project, *args: str, env: dict | None = None) -> str:
    done = subprocess.run(
        ["git", "-C", str(project.root), *args], capture_output=True, text=True,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise UserError(f"git {args[0]}: {(done.stderr or done.stdout).strip().splitlines()[-1:] or ['failed']}")
    return done.stdout


def check_repo_state(project: Project) -> None:
    """Refuse to commit on a detached HEAD or in the middle of a merge, rebase or cherry-pick."""
    git_dir = project.git_dir
    if not git_dir.is_dir():
        raise UserError(f"{project.root}: .git is not a directory (worktrees and submodules are not supported)")
    for marker, what in (
        ("MERGE_HEAD", "a merge"), ("rebase-merge", "a rebase"), ("rebase-apply", "a rebase or am"),
        ("CHERRY_PICK_HEAD", "a cherry-pick"), ("REVERT_HEAD", "a git revert"),
    ):
        if (git_dir / marker).exists():
            raise UserError(f"{project.root}: {what} is in progress; finish or abort it first")
    head = (git_dir / "HEAD").read_text().strip()
    if not head.startswith("ref: "):
        raise UserError(f"{project.root}: HEAD is detached; check out a branch first (git switch -c NAME)")


def git_author(project: Project) -> str:
    """`Name <email>` from git config, as the commit will carry."""
    name = _git_config(project, "user.name")
    email = _git_config(project, "user.email")
    if not name or not email:
        raise UserError("git user.name and user.email are not set (git config user.name 'You'; git config user.email you@example.com)")
    return f"{name} <{email}>"


def _git_config(project: Project, key: str) -> str:
    done = subprocess.run(["git", "-C", str(project.root), "config", key], capture_output=True, text=True)
    return done.stdout.strip()


@contextmanager
def repo_lock(project: Project) -> Iterator[None]:
    """Serialise every mutating command on one flock; recover a journal left by a crash."""
    project.private_dir.mkdir(parents=True, exist_ok=True)
    with open(project.private_dir / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            check_repo_state(project)
            recover(project)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _journal_path(project: Project) -> Path:
    return project.private_dir / "journal.json"


def recover(project: Project) -> bool:
    """Roll back files of a change whose process died before committing it. True if it did."""
    journal = _journal_path(project)
    if not journal.exists():
        return False
    record = json.loads(journal.read_text())
    head_now = _head_sha(project)
    if head_now != record["head"]:
        # The commit landed; only the journal removal was lost.
        journal.unlink()
        return False
    for rel, old in record["files"].items():
        _restore(project.root / rel, old)
    _git(project, "reset", "-q", "--", *record["files"].keys())
    journal.unlink()
    return True


def _head_sha(project: Project) -> str | None:
    done = subprocess.run(["git", "-C", str(project.root), "rev-parse", "-q", "--verify", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or None


def _restore(path: Path, old: str | None) -> None:
    if old is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, old)


def atomic_write(path: Path, content: str | bytes) -> None:
    """Write via a temp file in the same folder and rename: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fault(point: str) -> None:
    """`KNOBKEEPER_FAULT=after-write` raises there; `after-write:exit` kills the process outright."""
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted == point:
        raise RuntimeError(f"injected fault at {point}")
    if wanted == f"{point}:exit":
        os._exit(70)


def commit_change(
    project: Project,
    files: dict[Path, str | bytes],
    message: Message,
    *,
    no_commit: bool = False,
    branch: str | None = None,
    locked: bool = False,
) -> str | None:
    """Write `files` and commit exactly them. Returns the new commit's sha (None with no_commit).

    `locked=True` when the caller already holds repo_lock (it validated under the lock).
    """
    if not locked:
        with repo_lock(project):
            return commit_change(project, files, message, no_commit=no_commit, branch=branch, locked=True)
    check_repo_state(project)
    if branch:
        _create_branch(project, branch)
    rels = [project.rel(p) for p in files]
    old: dict[str, str | None] = {}
    for path, rel in zip(files, rels):
        old[rel] = path.read_text() if path.exists() else None
    journal = _journal_path(project)
    atomic_write(journal, json.dumps({"head": _head_sha(project), "files": old}))
    try:
        for path, content in files.items():
            atomic_write(path, content)
            _fault("after-write")
        _git(project, "add", "--", *rels)
        if no_commit:
            journal.unlink()
            return None
        _fault("before-commit")
        # --only: the commit holds these paths and nothing else the user has staged.
        _commit_paths(project, rels, message.text())
        sha = _head_sha(project)
    except BaseException:
        for rel, content in old.items():
            _restore(project.root / rel, content)
        subprocess.run(["git", "-C", str(project.root), "reset", "-q", "--", *rels], capture_output=True)
        journal.unlink(missing_ok=True)
        raise
    journal.unlink(missing_ok=True)
    return sha


def _commit_paths(project: Project, rels: list[str], text: str) -> None:
    import git  # gitpython; imported here so read-only commands stay fast

    repo = git.Repo(project.root)
    try:
        # --cleanup=verbatim keeps the message exactly as built (trailers included).
        repo.git.commit("-q", "--only", "--no-verify", "--cleanup=verbatim", "-m", text, "--", *rels)
    except git.GitCommandError as exc:
        raise UserError(f"git commit failed: {exc.stderr.strip() or exc}") from None


def _create_branch(project: Project, branch: str) -> None:
    done = subprocess.run(["git", "-C", str(project.root), "check-ref-format", "--branch", branch],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"--branch {branch!r}: not a valid branch name")
    exists = subprocess.run(["git", "-C", str(project.root), "rev-parse", "-q", "--verify", f"refs/heads/{branch}"],
                            capture_output=True, text=True)
    if exists.returncode == 0:
        raise UserError(f"--branch {branch!r}: branch already exists; pick a new name")
    _git(project, "switch", "-q", "-c", branch)
