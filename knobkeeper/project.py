"""Where an infra repo keeps its files: one place for every path knobkeeper reads or writes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from knobkeeper.errors import UserError


@dataclass(frozen=True)
class Project:
    """An infra repo: inventory/, templates/, changelog/ under one git root."""

    root: Path

    @property
    def inventory_dir(self) -> Path:
        return self.root / "inventory"

    @property
    def catalog_path(self) -> Path:
        return self.inventory_dir / "catalog.toml"

    @property
    def knobs_path(self) -> Path:
        return self.inventory_dir / "knobs.toml"

    @property
    def templates_dir(self) -> Path:
        return self.root / "templates"

    @property
    def changelog_dir(self) -> Path:
        return self.root / "changelog"

    @property
    def entries_dir(self) -> Path:
        return self.changelog_dir / "entries"

    @property
    def incidents_dir(self) -> Path:
        return self.changelog_dir / "incidents"

    @property
    def evidence_dir(self) -> Path:
        return self.changelog_dir / "evidence"

    @property
    def plans_dir(self) -> Path:
        """A sweep's plan, committed before its first run (knobkeeper.evidence.sweep)."""
        return self.changelog_dir / "plans"

    @property
    def deploys_dir(self) -> Path:
        return self.changelog_dir / "deploys"

    @property
    def secrets_dir(self) -> Path:
        """Git-ignored values of secret knobs, one 0600 file per (role, knob)."""
        return self.root / ".knobkeeper-secrets"

    @property
    def state_dir(self) -> Path:
        """Git-ignored runtime state of the local stack (supervisord config, sockets, logs)."""
        return self.root / ".knobkeeper-state"

    @property
    def git_dir(self) -> Path:
        """The repository's git directory; in a linked worktree (`.git` is a file naming it) that one."""
        dot_git = self.root / ".git"
        if dot_git.is_file():
            try:
                text = dot_git.read_text()
            except (OSError, UnicodeDecodeError):
                raise UserError(f"{dot_git}: unreadable (expected a `gitdir: PATH` line)") from None
            if not text.startswith("gitdir: "):
                raise UserError(f"{dot_git}: expected a `gitdir: PATH` line (a git worktree or submodule)")
            return (self.root / text[len("gitdir: "):].strip()).resolve()
        return dot_git

    @property
    def private_dir(self) -> Path:
        """Lock, journal and caches: inside .git so they never show up as changes."""
        return self.git_dir / "knobkeeper"

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def find_project(repo: str | os.PathLike | None = None) -> Project:
    """The git root above `repo` (default: the cwd), or a UserError naming the path."""
    start = Path(repo or os.getcwd()).resolve()
    if not start.exists():
        raise UserError(f"--repo {start}: no such directory")
    here = start if start.is_dir() else start.parent
    for candidate in (here, *here.parents):
        if (candidate / ".git").exists():
            return Project(candidate)
    raise UserError(f"{start}: not a git repository (run `git init` or pass --repo PATH)")

