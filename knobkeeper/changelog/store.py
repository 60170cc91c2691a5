"""Write changelog files and commit exactly them, in one git commit, or leave the tree as it was.

A change is a set of files (new or replaced) plus, for secret knobs, private files that never
enter git. `commit_change` takes the repo lock, writes a journal of what every one of those
files held before, writes each by temp file + rename, commits only the tracked paths (never the
user's other staged or unstaged work), then drops the journal. If anything fails before the
commit, the old contents are put back. If the process dies instead, the next command (read or
write) finds the journal and rolls the files back before doing anything.

The lock is an flock on .git/knobkeeper/lock. Every git child started under it inherits the
locked descriptor, so a `git commit` whose parent was killed keeps the lock until it exits: the
next command's recovery never runs beside a commit still landing. The lock and every file write
are knobkeeper.fsio's (the deploy's lock and records use them too).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from knobkeeper import gitio
from knobkeeper.errors import UserError
from knobkeeper.fsio import atomic_write, lock_file, unlock_file
from knobkeeper.project import Project

# Tests set this to prove that a crash between writing and committing leaves no mix.
FAULT_ENV = "KNOBKEEPER_FAULT"

# root -> the locked descriptor while this process holds repo_lock (git children inherit it).
_held: dict[Path, int] = {}


@dataclass
class Message:
    """A commit message: a summary line, an optional body, and machine-readable trailers."""

    summary: str
    body: str = ""
    trailers: list[tuple[str, str]] = field(default_factory=list)

    def text(self) -> str:
        parts = [" ".join(self.summary.split())]
        body = _inert_body(self.body)
        if body:
            parts.append(body)
        if self.trailers:
            # A trailer value must be one line or git stops reading the block.
            parts.append("\n".join(f"{k}: {' '.join(str(v).split())}" for k, v in self.trailers))
        return "\n\n".join(parts) + "\n"


def _inert_body(body: str) -> str:
    """The body with nothing that could end or forge the trailer block.

    `git interpret-trailers` stops at a line starting with `---` (the patch divider), so such a
    line is indented; blank runs are kept to one blank line, so the trailers always stay the
    last paragraph, and reason lines that look like `Key: value` stay in the body's paragraphs.
    """
    lines = [(" " + line if line.startswith("---") else line.rstrip()) for line in body.strip().splitlines()]
    out: list[str] = []
    for line in lines:
        if not line.strip() and out and not out[-1]:
            continue
        out.append(line if line.strip() else "")
    return "\n".join(out).strip("\n")


def check_repo_state(project: Project) -> None:
    """Refuse to commit on a detached HEAD or in the middle of a merge, rebase or cherry-pick."""
    git_dir = project.git_dir
    if not git_dir.is_dir():
        raise UserError(f"{project.root}/.git: not a git directory ({git_dir} is missing)")
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
    name = gitio.config(project.root, "user.name")
    email = gitio.config(project.root, "user.email")
    if not name or not email:
        raise UserError("git user.name and user.email are not set (git config user.name 'You'; git config user.email you@example.com)")
    return f"{name} <{email}>"


@contextmanager
def _flock(project: Project) -> Iterator[int]:
    held = _held.get(project.root)
    if held is not None:  # re-entered by the same process (a library call inside a command)
        yield held
        return
    handle = lock_file(project.private_dir / "lock")
    _held[project.root] = handle.fileno()
    try:
        yield handle.fileno()
    finally:
        _held.pop(project.root, None)
        unlock_file(handle)


@contextmanager
def repo_lock(project: Project) -> Iterator[None]:
    """Serialise every mutating command on one flock; recover a journal left by a crash."""
    with _flock(project):
        check_repo_state(project)
        clear_stale_index_lock(project)
        recover(project)
        yield


def settle(project: Project) -> RolledBack | None:
    """For read commands: if a crashed change left a journal, recover it (under the lock) first,
    so nothing is read that git does not hold; what it rolled back, if anything. Costs one stat
    when there is none."""
    if not journal_file(project).exists():
        return None
    with _flock(project):
        clear_stale_index_lock(project)
        return recover(project)


def journal_file(project: Project) -> Path:
    """Where a change being written keeps what its files held before (`recover` reads it)."""
    return project.private_dir / "journal.json"


def _git_pids_for(project: Project) -> list[int] | None:
    """Live git processes working in this repository (cwd inside it or `-C` naming it);
    None where /proc cannot tell."""
    proc = Path("/proc")
    if not (proc / "self" / "cmdline").exists():
        return None
    root = str(project.root.resolve())
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not argv or os.path.basename(argv[0].decode(errors="replace")) not in ("git", "git.exe"):
                continue
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        named = [os.path.realpath(args[i + 1]) for i, a in enumerate(args[:-1]) if a == "-C"]
        if cwd == root or cwd.startswith(root + os.sep) or root in named:
            found.append(int(entry.name))
    return found


def clear_stale_index_lock(project: Project) -> None:
    """Remove a .git/index.lock that a killed git left behind, when it is provably stale.

    Called under the repo lock, so no git child of knobkeeper is alive (they hold the lock);
    the lock file is removed only if no other git process works in this repository either.
    """
    lock = project.git_dir / "index.lock"
    if not lock.exists():
        return
    alive = _git_pids_for(project)
    if alive is None:
        raise UserError(f"{lock}: left by a git command that did not finish; remove it if no git command is "
                        f"running on this repository")
    if alive:
        raise UserError(f"{lock}: git process {alive[0]} is working in this repository; wait for it to finish "
                        f"(remove the file only if that process is not git's)")
    lock.unlink(missing_ok=True)


@dataclass
class RolledBack:
    """A change that did not finish (its process died, or a write failed and so did putting the
    files back) and that `recover` rolled back: its commit summary (None in a journal written before
    the summary was kept there) and the tracked files put back as they were before it."""

    change: str | None
    files: list[str]


def recover(project: Project) -> RolledBack | None:
    """Roll back files of a change whose process died before committing it; what it rolled back."""
    journal = journal_file(project)
    if not journal.exists():
        return None
    try:
        record = json.loads(journal.read_text())
        tracked, private, head = record["files"], record.get("private", {}), record["head"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{journal}: unreadable journal of an interrupted change; inspect `git status`, "
                        f"then delete the file") from None
    if gitio.head_sha(project.root) != head:
        # The commit landed; only the journal removal was lost.
        journal.unlink()
        return None
    _roll_back(project, tracked, private)
    journal.unlink()
    return RolledBack(record.get("change"), sorted(tracked))


def _roll_back(project: Project, tracked: dict[str, str | None], private: dict[str, str | None]) -> None:
    for rel, old in {**tracked, **private}.items():
        _restore(project.root / rel, old, private=rel in private)
    if tracked:
        done = gitio.run(project.root, "reset", "-q", "--", *tracked, pass_fds=_lock_fds(project))
        if done.returncode != 0 and gitio.head_sha(project.root) is not None:
            raise UserError(f"git reset of {', '.join(tracked)}: {gitio.failure_line(done)}")


def _lock_fds(project: Project) -> tuple[int, ...]:
    fd = _held.get(project.root)
    return (fd,) if fd is not None else ()


def _restore(path: Path, old: str | None, private: bool = False) -> None:
    if old is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, old, mode=0o600 if private else None)


def _fault(point: str) -> None:
    """`KNOBKEEPER_FAULT=after-write` raises there; `after-write:exit` kills the process outright."""
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted == point:
        raise RuntimeError(f"injected fault at {point}")
    if wanted == f"{point}:exit":
        os._exit(70)


def _read_old(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def commit_change(
    project: Project,
    files: dict[Path, str | bytes],
    message: Message,
    *,
    no_commit: bool = False,
    branch: str | None = None,
    locked: bool = False,
    private_files: dict[Path, str] | None = None,
) -> str | None:
    """Write `files` and commit exactly them. Returns the new commit's sha (None with no_commit).

    `private_files` (secret values) are written under the same journal, with mode 0600, but
    never added to git: a change that fails leaves none of them behind.
    `locked=True` when the caller already holds repo_lock (it validated under the lock).
    """
    if not locked:
        with repo_lock(project):
            return commit_change(project, files, message, no_commit=no_commit, branch=branch, locked=True,
                                 private_files=private_files)
    check_repo_state(project)
    if branch:
        _create_branch(project, branch)
    private_files = private_files or {}
    rels = [project.rel(p) for p in files]
    old = {rel: _read_old(path) for path, rel in zip(files, rels)}
    old_private = {project.rel(path): _read_old(path) for path in private_files}
    journal = journal_file(project)
    try:
        atomic_write(journal, json.dumps({"head": gitio.head_sha(project.root), "files": old, "private": old_private,
                                          "change": message.summary}))
    except OSError as exc:   # disk full, a file size limit: nothing was written yet
        raise UserError(f"{journal}: cannot write ({exc.strerror or exc}); nothing was changed") from None
    fds = _lock_fds(project)
    try:
        for path, content in private_files.items():
            atomic_write(path, content, mode=0o600)
        for path, content in files.items():
            atomic_write(path, content)
            _fault("after-write")
        gitio.output(project.root, "add", "--", *rels, pass_fds=fds)
        if no_commit:
            journal.unlink()
            return None
        _fault("before-commit")
        gitio.commit_paths(project.root, rels, message.text(), pass_fds=fds)
        sha = gitio.head_sha(project.root)
    except BaseException as exc:
        try:
            _roll_back(project, old, old_private)
        except OSError as again:   # the disk is still full: the journal stays, the next command finishes it
            raise UserError(f"{project.root}: cannot write ({getattr(exc, 'strerror', None) or exc}) nor put the "
                            f"files back ({again.strerror or again}); free space, then any knobkeeper command "
                            f"rolls the change back from {journal}") from None
        journal.unlink(missing_ok=True)
        if isinstance(exc, OSError):   # disk full, a file size limit: one line, and the tree is as it was
            where = getattr(exc, "filename", None) or project.root
            raise UserError(f"{where}: cannot write ({exc.strerror or exc}); nothing was changed "
                            f"(the files and the history are as they were)") from None
        raise
    journal.unlink(missing_ok=True)
    return sha


def _create_branch(project: Project, branch: str) -> None:
    if gitio.run(project.root, "check-ref-format", "--branch", branch).returncode != 0:
        raise UserError(f"--branch {branch!r}: not a valid branch name")
    if gitio.rev_parse(project.root, f"refs/heads/{branch}") is not None:
        raise UserError(f"--branch {branch!r}: branch already exists; pick a new name")
    gitio.output(project.root, "switch", "-q", "-c", branch, pass_fds=_lock_fds(project))
