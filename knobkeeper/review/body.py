"""What a change-review PR body says about base..head, as data (`collect`); markdown.py writes it.

The changelog entries ADDED in the range are the knob changes (the files say it; commit messages
are not parsed). Each side is read from a snapshot of its tree, opened as a Project of its own,
through the functions everything else uses: entries, the evidence store, incidents, audit's revert
status, and the deploy's render for every (host, service) of every inventory.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobkeeper import audit, fmt
from knobkeeper.changelog.entries import Entry, load_entries, replay
from knobkeeper.changelog.incidents import load_incidents
from knobkeeper.deploy.render import Source
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.pinned import ignored_knobs
from knobkeeper.knobs.state import read_declared
from knobkeeper.project import Project
from knobkeeper.review.gitrange import changed_paths, commits_between, resolve_range, snapshot
from knobkeeper.review.renders import (InventoryRender, inventories, rebase_paths, relative, render_inventory,
                                      show_paths_from)
from knobkeeper.review.restarts import plan_inventory
from knobkeeper.timeutil import id_from_stem, parse_time

STALE_DAYS = 30
SPEED_METRICS = ("output_tokens_per_s", "requests_per_s", "input_tokens_per_s", "total_tokens_per_s")
EVIDENCE_EXPECTED = ("set", "restore", "record")


@dataclass
class EvidenceView:
    id: str
    doc: Any                    # knobkeeper.evidence.model.Evidence, None when missing or invalid
    problem: str | None = None


@dataclass
class ChangeView:
    entry: Entry
    risk: str | None
    display_old: str
    display_new: str
    evidence: list[EvidenceView] = field(default_factory=list)


@dataclass
class FileDiff:
    inventory: str
    role: str
    hosts: list[str]
    path: str
    diff: str


@dataclass
class Review:
    base: str
    head: str
    commits: list[str]
    changes: list[ChangeView]
    reverts: list[dict]
    diffs: list[FileDiff]
    plans: list[dict]
    warnings: list[str]
    modified_entries: list[str] = field(default_factory=list)
    range_note: str | None = None  # set when --base was not an ancestor of --head


def display(catalog: Any, name: str, value: Any) -> str:
    """A knob value as the catalog shows it (a secret: its fingerprint), else as fmt shows values."""
    if catalog is not None and name in catalog:
        return catalog.get(name).display(value)
    return fmt.value(value)


def load_evidence(project: Project, ident: str) -> EvidenceView:
    try:
        return EvidenceView(ident, store.load(project, ident))
    except UserError as exc:
        return EvidenceView(ident, None, relative(str(exc), project.root))


def drift(declared: dict, explained: dict) -> list[tuple[str, str, Any, Any]]:
    """(role, knob, what the entries say, what knobs.toml says) wherever they differ."""
    out = []
    for role in sorted(set(declared) | set(explained)):
        for name in sorted(set(declared.get(role, {})) | set(explained.get(role, {}))):
            want, have = explained.get(role, {}).get(name), declared.get(role, {}).get(name)
            if want != have or type(want) is not type(have):
                out.append((role, name, want, have))
    return out


def _evidence_warnings(change: ChangeView, ev: EvidenceView, catalog: Any) -> list[str]:
    e, doc = change.entry, ev.doc
    where = f"{e.role} {e.knob} (entry {e.id})"
    if doc is None:
        return [f"{where}: evidence {ev.id} is missing or invalid: {ev.problem}"]
    # A change that takes no value (unset) is backed by what the evidence tested, whatever it was.
    problem = doc.backs(e.knob, e.scope, doc.candidate if e.new is None else e.new,
                        show=lambda value: display(catalog, e.knob, value))
    out = [f"{where}: {problem}"] if problem else []
    try:
        age = (parse_time(e.time) - parse_time(doc.created)).days
    except ValueError:
        age = 0
    if age > STALE_DAYS:
        out.append(f"{where}: stale evidence {ev.id}: {age} days older than the change (over {STALE_DAYS})")
    levels = doc.judgement.levels
    if doc.metric in SPEED_METRICS and not any(lv.verdict == "better" for lv in levels):
        shown = ", ".join(f"{lv.verdict} @{lv.concurrency}" for lv in levels) or "no levels"
        out.append(f"{where}: evidence {ev.id} is not significant at any level ({shown})")
    worse = [f"@{lv.concurrency}" for lv in levels if lv.verdict == "worse"]
    if worse:
        out.append(f"{where}: evidence {ev.id} shows the candidate worse at {', '.join(worse)}")
    return out


def _is_correctness(doc: Any) -> bool:
    """Evidence about outputs, not speed: a non-throughput metric, or a `correctness` section."""
    if doc is None:
        return False
    return bool(doc.extra.get("correctness")) or doc.metric not in SPEED_METRICS


def _render_all(project: Project, tree: Project, sha: str) -> dict[str, InventoryRender]:
    out = {}
    home = Path.home() if "HOME" in os.environ else None
    for inv in inventories(tree):
        r = render_inventory(tree, inv, Source(sha), rebase=project.root)
        rebase_paths(r, tree.root, project.root)
        show_paths_from(r, project.root, home)
        out[inv] = r
    return out


def _reverts(tree: Project, new: list[Entry], entries: list[Entry], incidents: list, warnings: list[str]) -> list[dict]:
    """One row per revert or restore added in the range: the revert, its incident, its status."""
    try:
        statuses, problem = audit.revert_statuses(tree, entries, incidents), None
    except UserError as exc:
        statuses, problem = {}, f"revert status unavailable: {exc}"
    if problem and any(e.action in ("revert", "restore") for e in new):
        warnings.append(problem)
    by_id = {e.id: e for e in entries}
    inc_by_id = {i.id: i for i in incidents}
    rows = []
    for e in new:
        if e.action == "revert":
            rid = e.id
        elif e.action == "restore" and e.restores:
            rid = e.restores
        else:
            continue
        revert = by_id.get(rid)
        st = statuses.get(rid)
        incident_id = revert.incident if revert else None
        inc = inc_by_id.get(incident_id) if incident_id else None
        rows.append({
            "entry": e, "revert": revert, "revert_id": rid,
            "incident": incident_id, "incident_title": inc.title if inc else None,
            "incident_state": inc.status if inc else None,
            "status": st.status if st else "unknown", "why": st.why if st else (problem or ""),
        })
    return rows


def collect(project: Project, base: str | None = None, head: str | None = None) -> Review:
    """Everything the PR body says about base..head."""
    rng = resolve_range(project, base, head)
    base_sha, head_sha = rng.base, rng.head
    commits = commits_between(project, base_sha, head_sha)
    entry_changes = changed_paths(project, base_sha, head_sha, "changelog/entries")
    added = {Path(p).name for p, s in entry_changes.items() if s == "A" and p.endswith(".toml")}
    modified = sorted(p for p, s in entry_changes.items() if s != "A" and p.endswith(".toml"))
    warnings: list[str] = [f"{p}: a committed entry was {'deleted' if entry_changes[p] == 'D' else 'modified'}; "
                           f"entries are immutable (add a new entry with set/unset/revert instead)" for p in modified]
    warnings += _evidence_rewrites(project, base_sha, head_sha)
    with snapshot(project, base_sha) as base_tree:
        renders_base = _render_all(project, base_tree, base_sha)
    with snapshot(project, head_sha) as tree:
        try:
            catalog = load_catalog(tree.catalog_path)
        except UserError as exc:
            catalog = None
            warnings.append(f"catalog unreadable at head: {relative(str(exc), tree.root)}")
        entries = load_entries(tree)
        try:
            incidents = load_incidents(tree)
        except UserError as exc:
            incidents = []
            warnings.append(f"incidents unreadable at head: {relative(str(exc), tree.root)}")
        new = [e for e in entries if f"{e.stem}.toml" in added]
        changes: list[ChangeView] = []
        for e in new:
            risk = catalog.get(e.knob).risk if catalog is not None and e.knob in catalog else None
            view = ChangeView(e, risk, display(catalog, e.knob, e.old), display(catalog, e.knob, e.new))
            view.evidence = [load_evidence(tree, ident) for ident in e.evidence]
            changes.append(view)
        reverts = _reverts(tree, new, entries, incidents, warnings)
        renders_head = _render_all(project, tree, head_sha)
        # Drift at head: knobs.toml values the head's entries do not explain (a hand edit in the range).
        try:
            for role, name, want, have in drift(read_declared(tree.knobs_path), replay(entries)):
                warnings.append(f"inventory/knobs.toml at head: [{role}] {name} = {display(catalog, name, have)} is not "
                                f"explained by the changelog (entries say {display(catalog, name, want)}); "
                                f"run `knobkeeper record --reason ...`")
        except UserError as exc:
            warnings.append(f"knobs.toml unreadable at head: {relative(str(exc), tree.root)}")
        warnings += _engine_warnings(tree, {(e.scope, e.knob) for e in new})

    for c in changes:
        warnings += _change_warnings(c, catalog)
    diffs, plans = _diffs_and_plans(renders_base, renders_head, warnings)
    return Review(base_sha, head_sha, commits, changes, reverts, diffs, plans, warnings, modified, rng.note)


def _evidence_rewrites(project: Project, base: str, head: str) -> list[str]:
    """One warning per evidence file (JSON or raw file) committed at the base and modified or deleted
    in the range: evidence is append-only, a re-judgement is a new file (`check` fails on either)."""
    folder = project.rel(project.evidence_dir)
    out = []
    for path, status in sorted(changed_paths(project, base, head, folder).items()):
        if status not in ("M", "D") or Path(path).name.startswith("."):
            continue
        line = (f"{path}: a committed evidence file was {'deleted' if status == 'D' else 'modified'}; evidence files "
                f"are append-only (entries cite what it held): restore it (`git checkout {base[:10]} -- {path}`)")
        if status == "M" and path.endswith(".json") and path.rsplit("/", 1)[0] == folder:
            line += f"; to judge its runs again, `knobkeeper ab rejudge {id_from_stem(Path(path).stem)}` writes a new file"
        out.append(line)
    return out


def _engine_warnings(tree: Project, changed: set[tuple[str, str]]) -> list[str]:
    """For each knob this range changes: what the engine version its role pins would make of it (not
    declared: the engine ignores it; or declared with another type), forks included."""
    try:
        lines = ignored_knobs(tree, include_other_origin=True)
    except UserError as exc:
        return [f"engine registry: {relative(str(exc), tree.root)}"]
    return [fmt.safe(line) for line in lines if any(f"[{role}] {knob}:" in line for role, knob in changed)]


def _change_warnings(c: ChangeView, catalog: Any) -> list[str]:
    e = c.entry
    out = [w for ev in c.evidence for w in _evidence_warnings(c, ev, catalog)]
    if e.action in EVIDENCE_EXPECTED and e.new is not None and not e.evidence and c.risk in ("perf", "numerics"):
        out.append(f"{e.role} {e.knob} (entry {e.id}): {e.action} of a {c.risk} knob with no evidence "
                   f"(attach an A/B: `knobkeeper ab import ...`, then link it)")
    if e.action == "revert" and not e.incident:
        out.append(f"{e.role} {e.knob} (entry {e.id}): revert without an incident; its status stays "
                   f"unexplained (next time: `knobkeeper revert ... --incident ID`)")
    if c.risk == "numerics" and e.new is not None and e.action in EVIDENCE_EXPECTED \
            and not any(_is_correctness(ev.doc) for ev in c.evidence):
        out.append(f"{e.role} {e.knob} (entry {e.id}): risk=numerics without correctness evidence "
                   f"(outputs may change; attach an accuracy/eval result)")
    return out


def _diffs_and_plans(base: dict[str, InventoryRender], head: dict[str, InventoryRender],
                     warnings: list[str]) -> tuple[list[FileDiff], list[dict]]:
    diffs: list[FileDiff] = []
    plans: list[dict] = []
    for inv in sorted(set(base) | set(head)):
        old, new = base.get(inv), head.get(inv)
        if new is None:
            warnings.append(f"{inv}: removed in this range")
            continue
        if new.error:
            warnings.append(f"{inv}: does not render at head: {new.error}")
            continue
        if old is None or old.error:
            if old is not None:
                warnings.append(f"{inv}: did not render at base ({old.error}); every file is shown as new")
            old = InventoryRender(inv)
        diffs += _file_diffs(old, new)
        plans.append(plan_inventory(old, new))
    return diffs, plans


def _file_diffs(old: InventoryRender, new: InventoryRender) -> list[FileDiff]:
    """The diff of every file whose text changes beyond its header; hosts of one role whose files
    change the same way (headers aside) are shown once."""
    grouped: dict[tuple[str, str, str], tuple[list[str], str]] = {}
    for key in sorted(set(old.files) | set(new.files)):
        a, b = old.files.get(key), new.files.get(key)
        f = b or a
        if a is not None and b is not None and a.body == b.body:
            continue  # at most the header changed (source commit, digest, provenance)
        diff = "".join(difflib.unified_diff(
            (a.shown if a else "").splitlines(keepends=True), (b.shown if b else "").splitlines(keepends=True),
            fromfile=f"a/{f.path.lstrip('/')}" if a else "/dev/null", tofile=f"b/{f.path.lstrip('/')}" if b else "/dev/null",
            n=3))
        body_diff = "".join(difflib.unified_diff((a.body if a else "").splitlines(keepends=True),
                                                 (b.body if b else "").splitlines(keepends=True), n=0))
        slot = (f.role or "(host)", f.path, body_diff)
        hosts, text = grouped.get(slot, ([], diff))
        hosts.append(f.host)
        grouped[slot] = (hosts, text)
    order_index = {r: i for i, r in enumerate(new.order)}
    return [FileDiff(new.inventory, role, sorted(hosts), path, text) for (role, path, _), (hosts, text) in sorted(
        grouped.items(), key=lambda kv: (order_index.get(kv[0][0], len(order_index)), kv[0][1], kv[1][0]))]
