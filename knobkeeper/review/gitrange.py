"""The commits a review covers, on knobkeeper.gitio: resolving --base/--head, the merge-base when the
base is not an ancestor of the head, the paths changed in the range, and snapshots of a tree.
"""

from __future__ import annotations

import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from knobkeeper import gitio
from knobkeeper.errors import UserError
from knobkeeper.project import Project


@dataclass(frozen=True)
class Range:
    """What a review compares: `base`..`head`, where `base` is an ancestor of `head`.

    `asked` is the commit --base named; when it is not an ancestor of the head (a branch that moved
    on, or a reversed range) `base` is their merge-base and `note` says so in words."""

    base: str
    head: str
    asked: str
    note: str | None = None


def resolve_ref(project: Project, ref: str, option: str) -> str:
    """The full sha of `ref`, or a UserError naming the option."""
    sha = gitio.rev_parse(project.root, ref)
    if not sha:
        raise UserError(f"{option} {ref}: not a commit in {project.root} (a branch, tag or sha; see `git log`)")
    return sha


def default_base(project: Project, head: str = "HEAD") -> str:
    """The merge-base of `head` with origin/main (when present) or main."""
    for ref in ("origin/main", "main"):
        if gitio.rev_parse(project.root, ref):
            found = gitio.merge_base(project.root, ref, head)
            if found:
                return found
    raise UserError("--base: no main or origin/main branch to compare with; pass --base REF")


def resolve_range(project: Project, base: str | None = None, head: str | None = None) -> Range:
    """The range to review. A --base that is not an ancestor of --head is replaced by their
    merge-base (comparing the two trees directly would show what only the base has as deleted)."""
    head_name = head or "HEAD"
    head_sha = resolve_ref(project, head_name, "--head")
    if not base:
        found = default_base(project, head_sha)
        return Range(found, head_sha, found)
    asked = resolve_ref(project, base, "--base")
    if gitio.is_ancestor(project.root, asked, head_sha):
        return Range(asked, head_sha, asked)
    found = gitio.merge_base(project.root, asked, head_sha)
    if not found:
        raise UserError(f"--base {base}: shares no history with {head_name}; nothing to compare")
    if found == head_sha:
        note = (f"--base {base} ({asked[:10]}) is ahead of --head {head_name} ({head_sha[:10]}), a reversed range: "
                f"compared from their merge-base, {head_name} itself, so nothing {base} lacks is shown")
    else:
        note = (f"--base {base} ({asked[:10]}) is not an ancestor of {head_name}: compared from their merge-base "
                f"{found[:10]}; what {base} gained since is not part of this change")
    return Range(found, head_sha, asked, note)


def commits_between(project: Project, base: str, head: str) -> list[str]:
    return gitio.output(project.root, "rev-list", "--reverse", f"{base}..{head}").split()


def changed_paths(project: Project, base: str, head: str | None, under: str) -> dict[str, str]:
    """{path: status letter (A, M, D)} under `under` between base and head (None = the working tree)."""
    args = ["diff", "--name-status", "--no-renames", base, *([head] if head else []), "--", under]
    out: dict[str, str] = {}
    for line in gitio.output(project.root, *args).splitlines():
        status, _, path = line.partition("\t")
        if path:
            out[path] = status[:1]
    return out


@contextmanager
def snapshot(project: Project, sha: str) -> Iterator[Project]:
    """The tree at `sha` extracted into a temporary directory, as a Project (no .git)."""
    with tempfile.TemporaryDirectory(prefix="kk-rev-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        tar_path = Path(tmp) / "tree.tar"
        gitio.output(project.root, "archive", "--format=tar", "-o", str(tar_path), sha)
        with tarfile.open(tar_path) as tar:
            tar.extractall(root, filter="data")
        yield Project(root)
