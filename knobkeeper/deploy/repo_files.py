"""Rendered files that live in the repo, not on a host: a target whose files a GitOps controller
applies (a Kubernetes stack's manifests, manifests/<inventory>/<role>.yaml) renders them with a path
relative to the repo's root. `knobkeeper render --write` writes them, `review` shows their diff in
the PR like any rendered file, and `check` fails when the committed copy is not what the knobs
render (as it does for knobs.toml and the entries), so Argo CD or Flux applies what was reviewed.

    repo_files(project, inventory)        # {repo path: rendered text}
    stale(project, inventory)             # [(repo path, "missing" | "differs")]
    write(project, inventory)             # the paths written (only those that were stale)
    problems(project, inventory)          # what `check` says: invalid (rendered or committed), stale
    after_change(project, knobs_text, new_entries)   # {path: text} a knob change commits with itself

A knob change (`set`, `unset`, `revert`, `restore`, `record`, an adopted sweep) renders every repo
file with the knobs.toml and entries it is about to commit and commits the ones that change in the
same commit, so the commit that changes a knob is the commit that changes its manifests (one PR, one
review, one sync).

Compared without their headers (strip_header): the header names the source commit, which the commit
that adds the files cannot know; the body is everything an object carries.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from knobkeeper.changelog.entries import load_entries
from knobkeeper.deploy.render import render_stack, strip_header
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.state import declared_from
from knobkeeper.deploy.stack import load_stack
from knobkeeper.deploy.target import target_of
from knobkeeper.fsio import atomic_write
from knobkeeper.errors import UserError
from knobkeeper.project import Project


def repo_files(project: Project, inventory: str, **state) -> dict[str, str]:
    """{repo path: text} of `inventory` (`state`: render_stack's declared and entries)."""
    stack = load_stack(project.root, inventory)
    if not target_of(stack).repo_files:
        return {}
    out: dict[str, str] = {}
    for rendered in render_stack(project, stack, **state).values():
        out.update({path: text for path, text in rendered.files.items() if not path.startswith("/")})
    return out


def stale(project: Project, inventory: str, files: dict[str, str] | None = None) -> list[tuple[str, str]]:
    out = []
    for path, text in sorted((files if files is not None else repo_files(project, inventory)).items()):
        on_disk = project.root / path
        if not on_disk.is_file():
            out.append((path, "missing"))
        elif strip_header(on_disk.read_text()) != strip_header(text):
            out.append((path, "differs"))
    return out


def write(project: Project, inventory: str) -> list[str]:
    """Write every stale repo file of `inventory` (all rendered first: nothing written on an error)."""
    files = repo_files(project, inventory)
    written = []
    for path, _ in stale(project, inventory, files):
        target = project.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(Path(target), files[path])
        written.append(path)
    return written


def problems(project: Project, inventory: str, stale_too: bool = True) -> list[tuple[str, str, str]]:
    """(path, what, fix) for each repo file of `inventory` that its target's own linter refuses (as
    rendered, and as committed where that differs) or (`stale_too`) that is not committed as rendered."""
    stack = load_stack(project.root, inventory)
    target = target_of(stack)
    files: dict[str, str] = {}
    for rendered in render_stack(project, stack).values():
        files.update({path: text for path, text in rendered.files.items() if not path.startswith("/")})
    out = [(path, f"as {inventory} renders it: {line}", "fix the inventory data or the knob value it renders")
           for path, line in target.lint(files)]
    for path, state in stale(project, inventory, files) if stale_too else []:
        fix = f"run `knobkeeper render {inventory} --write` and commit it"
        if state == "missing":
            out.append((path, f"not in the repo: {inventory} renders it (for Argo CD or Flux)", fix))
            continue
        committed = (project.root / path).read_text()
        out += [(path, f"committed copy: {line}", fix) for _, line in target.lint({path: committed})]
        out.append((path, f"differs from what {inventory} renders (the knobs, catalog or inventory changed)", fix))
    return out


def inventory_files(project: Project) -> list[str]:
    """Every pyinfra inventory of the repo: inventory/*.py (not _*.py), sorted."""
    folder = project.inventory_dir
    return sorted(project.rel(p) for p in folder.glob("*.py") if not p.name.startswith("_")) if folder.is_dir() else []


def after_change(project: Project, knobs_text: str, new_entries: list) -> dict[Path, str]:
    """{absolute path: text} of every repo file that the change (knobs.toml as `knobs_text`, plus
    `new_entries`) makes differ from what is on disk. An inventory that does not load is left to
    `check` (a knob change does not fail on it)."""
    catalog = load_catalog(project.catalog_path)
    declared = declared_from(project.knobs_path, tomllib.loads(knobs_text), catalog)
    entries = [*load_entries(project), *new_entries]
    out: dict[Path, str] = {}
    for inventory in inventory_files(project):
        try:
            files = repo_files(project, inventory, declared=declared, entries=entries)
        except UserError:
            continue
        for path, _ in stale(project, inventory, files):
            out[project.root / path] = files[path]
    return out
