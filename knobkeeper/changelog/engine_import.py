"""`knobkeeper catalog import ENGINE`: an engine version's registry of variables, generated from the
engine itself (knobkeeper.knobs.registry) and committed into inventory/engines/ as ONE change: a
commit whose message says what was added, what this version no longer declares, which were
renamed and which defaults changed. The change part of the registry, so it lives with the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobkeeper.changelog.store import Message, commit_change, repo_lock
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.pinned import catalog_type_problems
from knobkeeper.knobs.registry import (Registry, diff_registries, dump, generate, imported_versions, load_registry,
                                       parse_registry, registry_path, show_default, version_key)


@dataclass
class ImportResult:
    path: Path
    version: str
    count: int
    commit: str | None
    changed: bool
    summary: list[str]


def _message_lines(doc: dict[str, Any], previous: Registry | None) -> tuple[str, list[str]]:
    engine, version = doc["engine"], doc["version"]
    new = parse_registry(doc, "new registry")
    summary = f"catalog import: {engine} {version} ({len(new.knobs)} variables)"
    if previous is None:
        return summary, [f"First registry of {engine}: {len(new.knobs)} variables added."]
    d = diff_registries(previous, new)
    body = [f"Against {previous.label()}: {len(d.added)} added, {len(d.removed)} no longer declared, "
            f"{len(d.renamed)} renamed, {len(d.defaults)} defaults changed."]

    def listing(title: str, items: list[str]) -> None:
        if items:
            shown = items[:40]
            more = f" (and {len(items) - len(shown)} more)" if len(items) > len(shown) else ""
            body.append(f"{title}: " + ", ".join(shown) + more)

    listing("Added", d.added)
    listing("No longer declared", d.removed)
    listing("Renamed", [f"{o} -> {n}" for o, n in d.renamed])
    listing("Defaults changed", [f"{n} {show_default(o)} -> {show_default(v)}" for n, o, v in d.defaults])
    return summary, body


def import_registry(project: Any, engine: str, version: str | None = None, wheel: Path | None = None,
                    from_installed: bool = False, wheelhouse: Path | None = None, no_commit: bool = False) -> ImportResult:
    """Generate the registry of one engine version into inventory/engines/ and commit it (one commit).

    Idempotent: an unchanged registry writes and commits nothing. Refused (nothing written) when a
    catalog entry's type disagrees with the engine's.
    """
    doc = generate(engine, version=version, wheel=wheel, from_installed=from_installed, wheelhouse=wheelhouse)
    text = dump(doc)
    inventory_dir = project.inventory_dir
    path = registry_path(inventory_dir, engine, doc["version"])
    with repo_lock(project):
        catalog = load_catalog(project.catalog_path)
        problems = catalog_type_problems(catalog, parse_registry(doc, str(path)))
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(problems[0] + more)
        if path.exists() and path.read_text() == text:
            return ImportResult(path, doc["version"], doc["count"], None, False,
                                [f"{project.rel(path)}: already up to date ({doc['count']} variables); nothing to commit"])
        older = [v for v in imported_versions(inventory_dir, engine) if version_key(v) < version_key(doc["version"])]
        newer = [v for v in imported_versions(inventory_dir, engine) if version_key(v) > version_key(doc["version"])]
        base = older[-1] if older else (newer[0] if newer else None)
        previous = load_registry(inventory_dir, engine, base) if base else None
        summary, body = _message_lines(doc, previous)
        message = Message(summary=summary, body="\n\n".join(body),
                          trailers=[("Engine", engine), ("Engine-Version", doc["version"]), ("Registry", project.rel(path))])
        sha = commit_change(project, {path: text}, message, no_commit=no_commit, locked=True)
    return ImportResult(path, doc["version"], doc["count"], sha, True, [summary, *body])
