"""The order of changelog entries: the order in which they entered history, never their stamps.

Walk HEAD's first-parent chain, oldest first. Each commit contributes the entry files it has
and its first parent has not: a plain commit, the ones it added (in file-name order); a merge,
the ones the merged branch brought, in that branch's own order (the same rule applied to the
branch's tip, recursively), so a branch's changes take effect where it was merged, after
everything already on the mainline, whatever the clocks of its authors said.

The rule depends only on the commit graph, so each commit's contribution is cached by its sha
in .git/knobkeeper/entry-order.json and never recomputed: after a new commit, a read costs one
`git rev-list --first-parent` and one diff of that commit.
"""

from __future__ import annotations

import json
from typing import Iterable

from knobkeeper import gitio
from knobkeeper.fsio import atomic_write
from knobkeeper.project import Project
from knobkeeper.timeutil import id_from_stem

CACHE_VERSION = 2


class _Graph:
    """Contributions of commits, from the cache or from git (in batches)."""

    def __init__(self, project: Project, contrib: dict[str, list[str]]):
        self.project = project
        self.contrib = contrib
        self.parents: dict[str, list[str]] = {}
        self.folder = project.rel(project.entries_dir)

    def chain(self, tip: str) -> list[str]:
        done = gitio.run(self.project.root, "rev-list", "--first-parent", "--reverse", tip)
        return done.stdout.split() if done.returncode == 0 else []

    def fill(self, shas: Iterable[str]) -> None:
        """Record what each of `shas` adds relative to its first parent (one `git log` for all)."""
        missing = [s for s in shas if s not in self.contrib]
        if not missing:
            return
        done = gitio.run(self.project.root, "-c", "core.quotepath=off", "log", "--no-walk=unsorted", "--stdin",
                         "--diff-merges=first-parent", "--format=%x00%H %P", "--name-only", "--diff-filter=A",
                         "--", self.folder, input="\n".join(missing) + "\n")
        added: dict[str, list[str]] = {s: [] for s in missing}
        current = None
        for line in done.stdout.splitlines() if done.returncode == 0 else []:
            if line.startswith("\0"):
                sha, *parents = line[1:].split()
                current = sha
                self.parents[sha] = parents
                added.setdefault(sha, [])
            elif current and line.endswith(".toml") and line.rsplit("/", 1)[0] == self.folder:
                added[current].append(id_from_stem(line.rsplit("/", 1)[-1][: -len(".toml")]))
        for sha, ids in added.items():
            parents = self.parents.get(sha, [])  # absent from the output: it adds no entry
            if len(parents) > 1 and ids:
                ids = self._as_merged(parents[1:], ids)
            self.contrib[sha] = ids  # a plain commit's: git lists them by path, i.e. file-name order

    def _as_merged(self, merged_tips: list[str], ids: list[str]) -> list[str]:
        wanted = set(ids)
        ordered: list[str] = []
        for tip in merged_tips:
            ordered += [i for i in self.order(tip) if i in wanted and i not in ordered]
        return ordered + sorted(wanted - set(ordered))  # added by the merge commit itself

    def order(self, tip: str) -> list[str]:
        chain = self.chain(tip)
        self.fill(chain)
        seen: set[str] = set()
        out = []
        for sha in chain:
            for ident in self.contrib.get(sha, []):
                if ident not in seen:
                    seen.add(ident)
                    out.append(ident)
        return out


def commit_order(project: Project) -> dict[str, int]:
    """Entry id -> its rank in history (0 = oldest); entries not committed are absent."""
    head = gitio.head_sha(project.root)
    if head is None:
        return {}
    cache_path = project.private_dir / "entry-order.json"
    contrib: dict[str, list[str]] = {}
    try:
        cached = json.loads(cache_path.read_text())
        if cached.get("version") == CACHE_VERSION:
            if cached.get("head") == head:
                return cached["order"]
            contrib = cached["contrib"]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        contrib = {}
    order = {ident: rank for rank, ident in enumerate(_Graph(project, contrib).order(head))}
    try:
        atomic_write(cache_path, json.dumps({"version": CACHE_VERSION, "head": head, "order": order,
                                             "contrib": contrib}))
    except OSError:
        pass  # a read-only checkout still works, only slower
    return order
