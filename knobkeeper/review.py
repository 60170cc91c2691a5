"""Change review: the body of a change-review PR (`review`) and the CI / pre-commit gate (`check`).

`review_body(project, base, head)` reads the commits base..head: the changelog entries ADDED in that
range are the knob changes (the files say it; commit messages are not parsed). Each side is read from
a snapshot of its tree (`git archive REF` into a temporary directory), opened as a Project of its own,
through the same functions everything else uses: entries, evidence store, incidents, audit's revert
status, and knobkeeper.deploy.render for every (host, service) of every inventory, so what is
reviewed is what is deployed. The text is deterministic: no clock, stable sort orders, paths of the
snapshots replaced by the repo's own path.

`check(project, base)` inspects the working tree and returns one Problem per thing wrong, each
`path: what is wrong; how to fix`.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
import subprocess
import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from knobkeeper.changelog.entries import Entry, load_entries, parse_entry_file, replay
from knobkeeper.errors import UserError
from knobkeeper.project import Project
from knobkeeper.timeutil import id_from_stem, parse_time

STALE_DAYS = 30
SPEED_METRICS = ("output_tokens_per_s", "requests_per_s", "input_tokens_per_s", "total_tokens_per_s")
EVIDENCE_EXPECTED = ("set", "restore", "record")


# =========================================================================== git

def _git(project: Project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(project.root), *args], capture_output=True, text=True)


def resolve_ref(project: Project, ref: str, option: str) -> str:
    """The full sha of `ref`, or a UserError naming the option."""
    done = _git(project, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}")
    if done.returncode != 0 or not done.stdout.strip():
        raise UserError(f"{option} {ref}: not a commit in {project.root} (a branch, tag or sha; see `git log`)")
    return done.stdout.strip()


def default_base(project: Project, head: str = "HEAD") -> str:
    """The merge-base of `head` with origin/main (when present) or main."""
    for ref in ("origin/main", "main"):
        if _git(project, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}").returncode == 0:
            done = _git(project, "merge-base", ref, head)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
    raise UserError("--base: no main or origin/main branch to compare with; pass --base REF")


def resolve_range(project: Project, base: str | None = None, head: str | None = None) -> tuple[str, str]:
    head_sha = resolve_ref(project, head or "HEAD", "--head")
    base_sha = resolve_ref(project, base, "--base") if base else default_base(project, head_sha)
    return base_sha, head_sha


def commits_between(project: Project, base: str, head: str) -> list[str]:
    done = _git(project, "rev-list", "--reverse", f"{base}..{head}")
    return done.stdout.split()


def changed_paths(project: Project, base: str, head: str | None, under: str) -> dict[str, str]:
    """{path: status letter (A, M, D)} under `under` between base and head (None = the working tree)."""
    args = ["diff", "--name-status", "--no-renames", base]
    if head:
        args.append(head)
    done = _git(project, *args, "--", under)
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
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
        archive = subprocess.run(["git", "-C", str(project.root), "archive", "--format=tar", sha],
                                 capture_output=True)
        if archive.returncode != 0:
            raise UserError(f"git archive {sha[:10]}: {archive.stderr.decode(errors='replace').strip()}")
        tar_path = Path(tmp) / "tree.tar"
        tar_path.write_bytes(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(root, filter="data")
        yield Project(root)


# =========================================================================== render (the deploy's own)

@dataclass
class RenderedFile:
    inventory: str  # "inventory/local.py"
    host: str
    role: str       # "" for a host-wide file (supervisord.conf)
    service: str    # "" for a host-wide file
    path: str       # where the file goes on the host
    text: str
    knobs: str = ""  # the service's knob values as rendered (a secret: its fingerprint), JSON

    @property
    def body(self) -> str:
        """The text without its header: what the process or service manager would see differently."""
        return _strip_header(self.text)


@dataclass
class InventoryRender:
    inventory: str
    order: list[str] = field(default_factory=list)
    roles: dict[str, Any] = field(default_factory=dict)  # name -> topology.Role
    files: dict[tuple[str, str], RenderedFile] = field(default_factory=dict)  # (host, path) -> file
    services: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, service) -> digest
    error: str | None = None


def inventories(project: Project) -> list[str]:
    """Every pyinfra inventory file: inventory/*.py, sorted."""
    if not project.inventory_dir.is_dir():
        return []
    return sorted(project.rel(p) for p in project.inventory_dir.glob("*.py") if not p.name.startswith("_"))


def _strip_header(text: str) -> str:
    """A rendered file without its leading comment block (shebang and knobkeeper header)."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or lines[i].startswith(";")):
        i += 1
    return "".join(lines[i:])


def _relative(message: str, *roots: Path) -> str:
    for root in roots:
        message = message.replace(f"{root}/", "")
    return message


def _rebased(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, (dict, list, tuple)) and old in json.dumps(value, default=str):
        return json.loads(json.dumps(value, default=str).replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))
    return value


def load_stack_as(project: Project, inventory: str, data: dict | None = None, rebase: Path | None = None) -> Any:
    """The inventory's Stack; with `rebase`, host data that names the snapshot's root names `rebase`
    instead (an inventory that places files relative to its repo, like local.py, renders the paths, and
    so the digests, the real repo's deploy renders)."""
    from knobkeeper.deploy.stack import _host_data, load_inventory, stack_from_inventory

    inv = load_inventory(project.root, inventory, data)
    if rebase is not None and rebase != project.root:
        old, new = str(project.root), str(rebase)
        for host in inv:
            for key, value in _host_data(host).items():
                moved = _rebased(value, old, new)
                if moved != value:
                    setattr(host.data, key, moved)
    return stack_from_inventory(inv, Path(inventory).stem)


def render_inventory(project: Project, inventory: str, source: Any = None, data: dict | None = None,
                     rebase: Path | None = None) -> InventoryRender:
    """Every file of every (host, service) of one inventory, via knobkeeper.deploy.render."""
    from knobkeeper.deploy import render as R

    out = InventoryRender(inventory)
    try:
        stack = load_stack_as(project, inventory, data, rebase)
    except UserError as exc:
        out.error = _relative(str(exc), project.root)
        return out
    out.order, out.roles = list(stack.order), dict(stack.roles)
    source = source or R.source_of(project.root)
    try:
        rendered = R.render_stack(project, stack, source=source)
        for plan in stack.hosts.values():
            if plan.supervisor is not None:
                for path, text in R.render_supervisord(plan, source, project.templates_dir).items():
                    out.files[(plan.name, path)] = RenderedFile(inventory, plan.name, "", "", path, text)
    except UserError as exc:
        out.error = _relative(str(exc), project.root)
        return out
    for (host, name), svc in rendered.items():
        out.services[(host, name)] = svc.digest
        for path, text in svc.files.items():
            out.files[(host, path)] = RenderedFile(inventory, host, svc.service.role, name, path, text,
                                                   json.dumps(svc.knobs, sort_keys=True))
    return out


def render_errors_per_host(project: Project, inventory: str, source: Any = None) -> list[tuple[str, str]]:
    """(host, error) for every host whose files fail to render ('' as host when the inventory fails)."""
    from knobkeeper.deploy import render as R
    from knobkeeper.deploy.stack import Stack, load_stack

    try:
        stack = load_stack(project.root, inventory)
    except UserError as exc:
        return [("", _relative(str(exc), project.root))]
    source = source or R.source_of(project.root)
    errors = []
    for name, plan in stack.hosts.items():
        one = Stack(inventory=stack.inventory, roles=stack.roles, order=stack.order, hosts={name: plan},
                    commands={k: v for k, v in stack.commands.items() if k[0] == name})
        try:
            R.render_stack(project, one, source=source)
            if plan.supervisor is not None:
                R.render_supervisord(plan, source, project.templates_dir)
        except UserError as exc:
            errors.append((name, _relative(str(exc), project.root)))
    return errors


def _rebase_paths(render: InventoryRender, old_root: Path, new_root: Path) -> None:
    """Texts rendered in a snapshot name the snapshot's path; show the repo's own (what deploy renders)."""
    old, new = str(old_root), str(new_root)
    files = {}
    for (host, path), f in render.files.items():
        f.path, f.text = f.path.replace(old, new), f.text.replace(old, new)
        files[(host, f.path)] = f
    render.files = files
    if render.error:
        render.error = render.error.replace(old, new)


# =========================================================================== review: data

@dataclass
class EvidenceView:
    id: str
    doc: dict | None
    problem: str | None = None  # missing or invalid


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


def _name_only(author: str) -> str:
    return author.split("<", 1)[0].strip() or author


def _display(catalog: Any, name: str, value: Any) -> str:
    if catalog is not None and name in catalog:
        return catalog.get(name).display(value)
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _load_evidence(project: Project, ident: str) -> EvidenceView:
    try:
        from knobkeeper.evidence import store
    except ImportError:  # pragma: no cover - the store is part of the package
        store = None
    if store is not None and hasattr(store, "load"):
        try:
            return EvidenceView(ident, store.load(project, ident))
        except UserError as exc:
            return EvidenceView(ident, None, _relative(str(exc), project.root))
    from knobkeeper.evidence.schema import validate

    hits = sorted(project.evidence_dir.glob(f"*-{ident}.json")) if project.evidence_dir.is_dir() else []
    if not hits:
        return EvidenceView(ident, None, f"evidence {ident}: no such file in changelog/evidence/")
    doc = json.loads(hits[0].read_text())
    problems = validate(doc)
    return EvidenceView(ident, None if problems else doc, problems[0] if problems else None)


def _revert_statuses(project: Project, entries: list[Entry], incidents: list) -> tuple[dict[str, Any], str | None]:
    """revert id -> audit.RevertStatus, or ({}, why) when the audit cannot say."""
    try:
        from knobkeeper import audit
        fn = audit.revert_statuses
    except (ImportError, AttributeError):
        return {}, "revert status unavailable: knobkeeper.audit has no revert_statuses()"
    try:
        return fn(project, entries, incidents), None
    except UserError as exc:
        return {}, f"revert status unavailable: {exc}"


def _evidence_warnings(change: ChangeView, ev: EvidenceView, catalog: Any) -> list[str]:
    e, doc = change.entry, ev.doc
    where = f"{e.role} {e.knob} (entry {e.id})"
    if doc is None:
        return [f"{where}: evidence {ev.id} is missing or invalid: {ev.problem}"]
    out = []
    if doc.get("knob") != e.knob or doc.get("role") != e.role:
        out.append(f"{where}: evidence {ev.id} tests {doc.get('knob')} on {doc.get('role')}, not this knob")
    cand = doc.get("arms", {}).get("B", {}).get("knobs", {}).get(e.knob)
    if doc.get("knob") == e.knob and e.new is not None and cand != e.new:
        out.append(f"{where}: stale evidence {ev.id}: it tested {_display(catalog, e.knob, cand)}, "
                   f"the change sets {change.display_new}")
    try:
        age = (parse_time(e.time) - parse_time(doc["created"])).days
    except (KeyError, ValueError):
        age = 0
    if age > STALE_DAYS:
        out.append(f"{where}: stale evidence {ev.id}: {age} days older than the change (over {STALE_DAYS})")
    levels = doc.get("judgement", {}).get("levels", [])
    verdicts = [lv.get("verdict") for lv in levels]
    if doc.get("metric") in SPEED_METRICS and "better" not in verdicts:
        shown = ", ".join(f"{lv.get('verdict')} @{lv.get('concurrency')}" for lv in levels) or "no levels"
        out.append(f"{where}: evidence {ev.id} is not significant at any level ({shown})")
    worse = [f"@{lv.get('concurrency')}" for lv in levels if lv.get("verdict") == "worse"]
    if worse:
        out.append(f"{where}: evidence {ev.id} shows the candidate worse at {', '.join(worse)}")
    return out


def _is_correctness(doc: dict | None) -> bool:
    """Evidence about outputs, not speed: a non-throughput metric, or a `correctness` section."""
    if not doc:
        return False
    return bool(doc.get("correctness")) or doc.get("metric") not in SPEED_METRICS


def collect(project: Project, base: str | None = None, head: str | None = None) -> Review:
    """Everything the PR body says about base..head."""
    base_sha, head_sha = resolve_range(project, base, head)
    commits = commits_between(project, base_sha, head_sha)
    entry_changes = changed_paths(project, base_sha, head_sha, "changelog/entries")
    added = {Path(p).name for p, s in entry_changes.items() if s == "A" and p.endswith(".toml")}
    modified = sorted(p for p, s in entry_changes.items() if s != "A" and p.endswith(".toml"))
    warnings: list[str] = [f"{p}: a committed entry was {'deleted' if entry_changes[p] == 'D' else 'modified'}; "
                           f"entries are immutable (add a new entry with set/unset/revert instead)" for p in modified]
    renders: dict[str, dict[str, InventoryRender]] = {"base": {}, "head": {}}
    from knobkeeper.deploy.render import Source

    with snapshot(project, base_sha) as base_tree:
        for inv in inventories(base_tree):
            r = render_inventory(base_tree, inv, Source(base_sha), rebase=project.root)
            _rebase_paths(r, base_tree.root, project.root)
            renders["base"][inv] = r
    with snapshot(project, head_sha) as tree:
        from knobkeeper.changelog.incidents import load_incidents
        from knobkeeper.knobs.catalog import load_catalog

        try:
            catalog = load_catalog(tree.catalog_path)
        except UserError as exc:
            catalog = None
            warnings.append(f"catalog unreadable at head: {_relative(str(exc), tree.root)}")
        entries = load_entries(tree)
        try:
            incidents = load_incidents(tree)
        except UserError as exc:
            incidents = []
            warnings.append(f"incidents unreadable at head: {_relative(str(exc), tree.root)}")
        by_id = {e.id: e for e in entries}
        new = [e for e in entries if f"{e.stem}.toml" in added]
        changes: list[ChangeView] = []
        for e in new:
            risk = catalog.get(e.knob).risk if catalog is not None and e.knob in catalog else None
            view = ChangeView(e, risk, _display(catalog, e.knob, e.old), _display(catalog, e.knob, e.new))
            view.evidence = [_load_evidence(tree, ident) for ident in e.evidence]
            changes.append(view)
        statuses, status_problem = _revert_statuses(tree, entries, incidents)
        if status_problem and any(e.action in ("revert", "restore") for e in new):
            warnings.append(status_problem)
        inc_by_id = {i.id: i for i in incidents}
        reverts = []
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
            reverts.append({
                "entry": e, "revert": revert, "revert_id": rid,
                "incident": incident_id, "incident_title": inc.title if inc else None,
                "incident_state": inc.status if inc else None,
                "status": st.status if st else "unknown", "why": st.why if st else (status_problem or ""),
            })
        for inv in inventories(tree):
            r = render_inventory(tree, inv, Source(head_sha), rebase=project.root)
            _rebase_paths(r, tree.root, project.root)
            renders["head"][inv] = r
        # Drift at head: knobs.toml values the head's entries do not explain (a hand edit in the range).
        try:
            from knobkeeper.knobs.state import read_declared

            declared = read_declared(tree.knobs_path)
            explained = replay(entries)
            for role, name, want, have in _drift(declared, explained):
                warnings.append(f"inventory/knobs.toml at head: [{role}] {name} = {_display(catalog, name, have)} is not "
                                f"explained by the changelog (entries say {_display(catalog, name, want)}); "
                                f"run `knobkeeper record --reason ...`")
        except UserError as exc:
            warnings.append(f"knobs.toml unreadable at head: {_relative(str(exc), tree.root)}")

    for c in changes:
        e = c.entry
        for ev in c.evidence:
            warnings += _evidence_warnings(c, ev, catalog)
        if e.action in EVIDENCE_EXPECTED and e.new is not None and not e.evidence and c.risk in ("perf", "numerics"):
            warnings.append(f"{e.role} {e.knob} (entry {e.id}): {e.action} of a {c.risk} knob with no evidence "
                            f"(attach an A/B: `knobkeeper ab import ...`, then link it)")
        if e.action == "revert" and not e.incident:
            warnings.append(f"{e.role} {e.knob} (entry {e.id}): revert without an incident; its status stays "
                            f"unexplained (next time: `knobkeeper revert ... --incident ID`)")
        if c.risk == "numerics" and e.new is not None and e.action in EVIDENCE_EXPECTED \
                and not any(_is_correctness(ev.doc) for ev in c.evidence):
            warnings.append(f"{e.role} {e.knob} (entry {e.id}): risk=numerics without correctness evidence "
                            f"(outputs may change; attach an accuracy/eval result)")

    diffs, plans = _diffs_and_plans(renders, warnings)
    return Review(base_sha, head_sha, commits, changes, reverts, diffs, plans, warnings, modified)


def _drift(declared: dict, explained: dict) -> list[tuple[str, str, Any, Any]]:
    drift = []
    for role in sorted(set(declared) | set(explained)):
        for name in sorted(set(declared.get(role, {})) | set(explained.get(role, {}))):
            want, have = explained.get(role, {}).get(name), declared.get(role, {}).get(name)
            if want != have or type(want) is not type(have):
                drift.append((role, name, want, have))
    return drift


def _diffs_and_plans(renders: dict[str, dict[str, InventoryRender]], warnings: list[str]) -> tuple[list[FileDiff], list[dict]]:
    diffs: list[FileDiff] = []
    plans: list[dict] = []
    for inv in sorted(set(renders["base"]) | set(renders["head"])):
        old, new = renders["base"].get(inv), renders["head"].get(inv)
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
        grouped: dict[tuple[str, str, str], tuple[list[str], str]] = {}
        changed_services: dict[str, set[str]] = {}
        changed_hosts: dict[str, set[str]] = {}
        for key in sorted(set(old.files) | set(new.files)):
            a, b = old.files.get(key), new.files.get(key)
            f = b or a
            if a is not None and b is not None and a.body == b.body:
                if a.knobs != b.knobs:  # a secret's value changed: same text, new fingerprint
                    changed_services.setdefault(f.role, set()).add(f.service)
                    changed_hosts.setdefault(f.role, set()).add(f.host)
                continue  # at most the header changed (source commit, digest, provenance)
            if f.service:
                changed_services.setdefault(f.role, set()).add(f.service)
                changed_hosts.setdefault(f.role, set()).add(f.host)
            diff = "".join(difflib.unified_diff(
                (a.text if a else "").splitlines(keepends=True), (b.text if b else "").splitlines(keepends=True),
                fromfile=f"a{f.path}" if a else "/dev/null", tofile=f"b{f.path}" if b else "/dev/null", n=3))
            # Hosts of one role whose files change the same way (headers aside) are shown once.
            body_diff = "".join(difflib.unified_diff((a.body if a else "").splitlines(keepends=True),
                                                     (b.body if b else "").splitlines(keepends=True), n=0))
            slot = (f.role or "(host)", f.path, body_diff)
            hosts, text = grouped.get(slot, ([], diff))
            hosts.append(f.host)
            grouped[slot] = (hosts, text)
        order_index = {r: i for i, r in enumerate(new.order)}
        for (role, path, _), (hosts, text) in sorted(
                grouped.items(), key=lambda kv: (order_index.get(kv[0][0], len(order_index)), kv[0][1], kv[1][0])):
            diffs.append(FileDiff(inv, role, sorted(hosts), path, text))
        plans.append(_plan(inv, new, changed_services, changed_hosts))
    return diffs, plans


def _plan(inv: str, render: InventoryRender, services: dict[str, set[str]], hosts: dict[str, set[str]]) -> dict:
    from knobkeeper.deploy.topology import downstream

    restart = [r for r in render.order if r in services]
    gated = downstream(render.order, render.roles, restart) - set(restart) if restart else set()
    steps = []
    for role in render.order:
        if role in services:
            steps.append({"role": role, "action": "restart", "services": sorted(services[role]),
                          "hosts": sorted(hosts[role]), "health": render.roles[role].health})
        elif role in gated:
            deps = [d for d in render.roles[role].after if d in restart]
            steps.append({"role": role, "action": "gate", "after": deps, "health": render.roles[role].health})
        else:
            steps.append({"role": role, "action": "keep"})
    keep = [r for r in render.order if r not in services]
    if not restart:
        summary = "no restart: no rendered file changes"
    elif not keep:
        summary = "full co-restart in dependency order: " + " -> ".join(restart)
    else:
        summary = f"{' and '.join(restart)} only: {' and '.join(keep)} keep running"
        if gated:
            summary += "; " + "; ".join(
                f"the {g} is still gated on the restarted {' and '.join(d for d in render.roles[g].after if d in restart)} workers"
                for g in render.order if g in gated)
    decode_only = restart == ["decode"]
    return {"inventory": inv, "order": list(render.order), "steps": steps, "summary": summary,
            "decode_only": decode_only}


# =========================================================================== review: markdown

def _cell(text: Any) -> str:
    s = " ".join(str(text).split())
    return s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def _num(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.1f}"
    return str(x)


def _p(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def summary_line(review: Review) -> str:
    n = len(review.changes)
    actions: dict[str, int] = {}
    for c in review.changes:
        actions[c.entry.action] = actions.get(c.entry.action, 0) + 1
    what = ", ".join(f"{k} {a}" for a, k in sorted(actions.items())) or "none"
    roles = sorted({c.entry.role for c in review.changes})
    restarts = "; ".join(f"{p['inventory']}: {p['summary'].split(':')[0]}" for p in review.plans) or "no inventories"
    return (f"{n} knob change{'s' if n != 1 else ''} ({what})"
            f"{' on ' + ', '.join(roles) if roles else ''} in {len(review.commits)} "
            f"commit{'s' if len(review.commits) != 1 else ''} ({review.base[:10]}..{review.head[:10]}); "
            f"restarts: {restarts}; {len(review.warnings)} warning{'s' if len(review.warnings) != 1 else ''}")


def title(review: Review) -> str:
    if len(review.changes) == 1:
        c = review.changes[0]
        return f"knobs: {c.entry.action} {c.entry.knob} on {c.entry.role}: {c.display_old} -> {c.display_new}"
    return f"knobs: {len(review.changes)} changes on {', '.join(sorted({c.entry.role for c in review.changes})) or 'no role'}"


def to_markdown(review: Review) -> str:
    out: list[str] = []
    w = out.append
    w("## Knob change review")
    w("")
    w(f"**Summary:** {_cell(summary_line(review))}")
    w("")
    w("### Knob changes")
    w("")
    if review.changes:
        w("| role | knob | old -> new | action | reason | entry | author |")
        w("|---|---|---|---|---|---|---|")
        for c in review.changes:
            e = c.entry
            w(f"| {e.role} | `{e.knob}` | {_cell(c.display_old)} -> {_cell(c.display_new)} | {e.action} | "
              f"{_cell(e.reason)} | `{e.id}` | {_cell(_name_only(e.author))} |")
    else:
        w("No changelog entries were added in this range.")
    w("")
    w("### Evidence")
    w("")
    if not review.changes:
        w("No knob changes, no evidence.")
        w("")
    for c in review.changes:
        e = c.entry
        w(f"#### {e.role} `{e.knob}` {_cell(c.display_old)} -> {_cell(c.display_new)} (entry `{e.id}`, risk {c.risk or 'unknown'})")
        w("")
        if not c.evidence:
            w("No evidence linked." if e.action in EVIDENCE_EXPECTED and e.new is not None
              else f"No evidence linked (a {e.action} takes a value back; none expected).")
            w("")
        for ev in c.evidence:
            if ev.doc is None:
                w(f"Evidence `{ev.id}`: **missing or invalid** ({_cell(ev.problem)})")
                w("")
                continue
            doc = ev.doc
            setup = doc.get("setup") or {}
            arms = doc.get("arms", {})
            a_val = arms.get("A", {}).get("knobs", {}).get(doc.get("knob"))
            b_val = arms.get("B", {}).get("knobs", {}).get(doc.get("knob"))
            w(f"Evidence `{ev.id}` ({doc.get('created', '')[:10]}, {_cell(doc.get('source', {}).get('tool', '?'))}, "
              f"engine {_cell(setup.get('engine') or '?')}, metric `{doc.get('metric')}`): "
              f"A = {_cell(_display(None, '', a_val))}, B = {_cell(_display(None, '', b_val))}")
            w("")
            w("| concurrency | n (A/B) | mean A | mean B | effect | 95% CI | p | verdict |")
            w("|---|---|---|---|---|---|---|---|")
            for lv in doc.get("judgement", {}).get("levels", []):
                ci = f"{_pct(lv.get('ci_low'))} .. {_pct(lv.get('ci_high'))}" if lv.get("ci_low") is not None else "n/a"
                w(f"| {lv.get('concurrency')} | {lv.get('n_a')}/{lv.get('n_b')} | {_num(lv.get('mean_a'))} | "
                  f"{_num(lv.get('mean_b'))} | {_pct(lv.get('effect'))} | {ci} | {_p(lv.get('p_value'))} | "
                  f"{lv.get('verdict')} |")
            w("")
            anomalies = doc.get("anomalies") or []
            if anomalies:
                w("Anomalies:")
                for an in anomalies:
                    conf = (f"{an['confidence'] * 100:.0f}% confidence" if an.get("confidence") is not None
                            else "unconfirmed")
                    w(f"- arm {an.get('arm')}: throughput at {an.get('to_concurrency')} is {_pct(an.get('change'))} "
                      f"vs {an.get('from_concurrency')} ({conf})")
            else:
                w("Anomalies: none.")
            w("")
    w("### Reverts")
    w("")
    if review.reverts:
        w("| change | knob | revert | incident | status | why |")
        w("|---|---|---|---|---|---|")
        for r in review.reverts:
            e = r["entry"]
            inc = "none" if not r["incident"] else (
                f"`{r['incident']}` {_cell(r['incident_title'])} ({r['incident_state']})" if r["incident_title"]
                else f"`{r['incident']}` (missing)")
            w(f"| {e.action} `{e.id}` | {e.role} `{e.knob}` | `{r['revert_id']}` | {inc} | **{r['status']}** | "
              f"{_cell(r['why'])} |")
    else:
        w("No reverts or restores in this range.")
    w("")
    w("### Rendered files")
    w("")
    if review.diffs:
        w("Rendered at base and head by knobkeeper.deploy.render; files whose only change is their header "
          "(source commit, digest, knob provenance) are not shown.")
        w("")
        current = None
        for d in review.diffs:
            if (d.inventory, d.role) != current:
                current = (d.inventory, d.role)
                w(f"#### {d.inventory}: {d.role}")
                w("")
            same = f" (shown for {d.hosts[0]}; the same change on every host listed)" if len(d.hosts) > 1 else ""
            w(f"`{d.path}` on {', '.join(d.hosts)}{same}:")
            w("")
            w("```diff")
            w(d.diff.rstrip("\n"))
            w("```")
            w("")
    else:
        w("No rendered file changes (rendered at base and head by knobkeeper.deploy.render).")
        w("")
    w("### Restart plan")
    w("")
    for p in review.plans:
        w(f"#### {p['inventory']}: {_cell(p['summary'])}")
        w("")
        for i, s in enumerate(p["steps"], 1):
            if s["action"] == "restart":
                w(f"{i}. **{s['role']}**: restart {', '.join(s['services'])} on {', '.join(s['hosts'])}, "
                  f"then wait for {s['health']}")
            elif s["action"] == "gate":
                w(f"{i}. {s['role']}: keeps running; its gate ({s['health']}) is checked again after "
                  f"{' and '.join(s['after'])}")
            else:
                w(f"{i}. {s['role']}: keeps running (no rendered file changed)")
        if p["decode_only"]:
            w("")
            w("A decode-only restart suffices.")
        w("")
    if not review.plans:
        w("No inventories to deploy.")
        w("")
    w("### Warnings")
    w("")
    if review.warnings:
        for text in review.warnings:
            w(f"- {_cell(text)}")
    else:
        w("None.")
    w("")
    w(f"<sub>Generated by `knobkeeper review --base {review.base[:10]} --head {review.head[:10]}`.</sub>")
    return "\n".join(out) + "\n"


def review_body(project: Project, base: str | None = None, head: str | None = None) -> str:
    return to_markdown(collect(project, base, head))


def gh_command(body_file: str, review: Review, base_branch: str = "main") -> str:
    return shlex.join(["gh", "pr", "create", "--base", base_branch, "--title", title(review), "--body-file", body_file])


# =========================================================================== check

@dataclass(frozen=True)
class Problem:
    path: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.path}: {self.what}; {self.fix}"


@dataclass
class CheckResult:
    problems: list[Problem] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        c = self.counts
        linters = ", ".join(self.ran) or "none"
        skipped = f"; skipped: {', '.join(self.skipped)}" if self.skipped else ""
        return (f"check: OK: {c.get('entries', 0)} entries, {c.get('evidence', 0)} evidence, {c.get('incidents', 0)} "
                f"incidents; rendered {c.get('files', 0)} files for {c.get('hosts', 0)} hosts in "
                f"{c.get('inventories', 0)} inventories; linters: {linters}{skipped}")


def _fmt(value: Any) -> str:
    if value is None:
        return "(unset)"
    return json.dumps(value) if isinstance(value, (str, bool)) else str(value)


def check(project: Project, base: str | None = None) -> CheckResult:
    """Every problem of the working tree, one Problem each (see the module docstring)."""
    res = CheckResult()
    add = lambda path, what, fix: res.problems.append(Problem(path, what, fix))  # noqa: E731
    base_sha = resolve_ref(project, base, "--base") if base else None
    knobs_rel = project.rel(project.knobs_path)
    catalog_rel = project.rel(project.catalog_path)

    # --- catalog and declared values
    from knobkeeper.knobs.catalog import load_catalog
    from knobkeeper.knobs.state import read_declared

    catalog = None
    try:
        catalog = load_catalog(project.catalog_path)
    except UserError as exc:
        add(catalog_rel, _relative(str(exc), project.root).removeprefix(f"{catalog_rel}: "), "fix the catalog")
    declared = None
    try:
        declared = read_declared(project.knobs_path)
    except UserError as exc:
        add(knobs_rel, _relative(str(exc), project.root).removeprefix(f"{knobs_rel}: "),
            "fix the file (git checkout inventory/knobs.toml undoes a bad edit)")
    bad_values: set[tuple[str, str]] = set()
    if catalog is not None and declared is not None:
        for role in declared:
            for name, value in declared[role].items():
                try:
                    knob = catalog.for_role(name, role)
                    if knob.secret:
                        if not isinstance(value, str):
                            raise UserError(f"{name}: a secret knob holds its fingerprint string")
                    else:
                        knob.check(value)
                except UserError as exc:
                    bad_values.add((role, name))
                    add(knobs_rel, f"[{role}] {name} = {_fmt(value)} violates the catalog: {exc}",
                        f"use a value the catalog accepts (see `knobkeeper catalog {name}`) and record it, "
                        f"or add the knob to {catalog_rel}")

    # --- entries: parse each file, replay, compare
    entries: list[Entry] = []
    entry_files = sorted(project.entries_dir.glob("*.toml")) if project.entries_dir.is_dir() else []
    entries_ok = True
    for path in entry_files:
        try:
            entries.append(parse_entry_file(path))
        except UserError as exc:
            entries_ok = False
            add(project.rel(path), _relative(str(exc), project.root).removeprefix(f"{project.rel(path)}: "),
                "fix the entry file (entries are written by knobkeeper; restore it with `git checkout`)")
    res.counts["entries"] = len(entries)
    if entries_ok and declared is not None:
        for role, name, want, have in _drift(declared, replay(entries)):
            if have is None:
                what = f"[{role}] {name} was removed by hand (the changelog says {_fmt(want)})"
            else:
                what = f"[{role}] {name} = {_fmt(have)} is not explained by the changelog (entries say {_fmt(want)})"
            add(knobs_rel, what, "run `knobkeeper record --reason ...` to record the hand edit, "
                                 "or undo it with `git checkout inventory/knobs.toml`")

    # --- links: evidence, incidents, other entries
    def stems(folder: Path, ext: str) -> set[str]:
        return {id_from_stem(p.stem) for p in folder.glob(f"*.{ext}")} if folder.is_dir() else set()

    evidence_ids, incident_ids = stems(project.evidence_dir, "json"), stems(project.incidents_dir, "toml")
    entry_ids = {e.id for e in entries}
    for e in entries:
        rel = project.rel(project.entries_dir / f"{e.stem}.toml")
        for ident in e.evidence:
            if ident not in evidence_ids:
                add(rel, f"evidence {ident} is missing from {project.rel(project.evidence_dir)}/",
                    "commit the evidence file (`knobkeeper ab import ...`) or restore it from git")
        if e.incident and e.incident not in incident_ids:
            add(rel, f"incident {e.incident} is missing from {project.rel(project.incidents_dir)}/",
                "commit the incident file (`knobkeeper incident open ...`) or restore it from git")
        for key in ("reverts", "restores", "refutes"):
            ident = getattr(e, key)
            if ident and ident not in entry_ids:
                add(rel, f"{key} = {ident!r} names an entry that does not exist",
                    "restore the missing entry from git")

    # --- evidence files
    from knobkeeper.evidence.schema import validate

    ev_files = sorted(p for p in project.evidence_dir.glob("*.json") if not p.name.startswith(".")) \
        if project.evidence_dir.is_dir() else []
    res.counts["evidence"] = len(ev_files)
    for path in ev_files:
        rel = project.rel(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            add(rel, f"not JSON ({exc})", "regenerate it with `knobkeeper ab import` or restore it from git")
            continue
        problems = validate(doc)
        for text in problems[:5]:
            add(rel, f"fails schema knobkeeper.evidence/1: {text}",
                "regenerate it with `knobkeeper ab import` or fix the field")
        if not problems and doc.get("id") != id_from_stem(path.stem):
            add(rel, f"id {doc.get('id')!r} does not match the file name", "rename the file or fix its id")
        if not problems:
            for raw in doc.get("source", {}).get("raw_files") or []:
                if not (project.root / raw).exists():
                    add(rel, f"source.raw_files names {raw}, which is missing", "commit the raw file or drop it from the list")

    # --- incidents
    from knobkeeper.changelog.incidents import parse_incident_file

    inc_files = sorted(project.incidents_dir.glob("*.toml")) if project.incidents_dir.is_dir() else []
    res.counts["incidents"] = len(inc_files)
    for path in inc_files:
        try:
            inc = parse_incident_file(path)
        except UserError as exc:
            add(project.rel(path), _relative(str(exc), project.root).removeprefix(f"{project.rel(path)}: "),
                "fix the incident file (written by `knobkeeper incident`; restore it with `git checkout`)")
            continue
        named = [n.refutes for n in inc.notes] + [n.confirms for n in inc.notes] + \
                (inc.resolution.implicates if inc.resolution else [])
        for ident in filter(None, named):
            if ident not in entry_ids:
                add(project.rel(path), f"names revert {ident}, which is not an entry", "restore the entry from git")

    # --- committed entries are immutable
    if base_sha:
        for path, status in sorted(changed_paths(project, base_sha, None, "changelog/entries").items()):
            if status in ("M", "D") and path.endswith(".toml"):
                add(path, f"a committed entry was {'deleted' if status == 'D' else 'modified'} since {base[:20]}",
                    "entries are immutable: restore it (`git checkout " + base_sha[:10] + " -- " + path +
                    "`) and add a new entry with set/unset/revert")

    # --- render every host of every inventory, lint what renders
    _check_render(project, res, add)
    return res


def _check_render(project: Project, res: CheckResult, add) -> None:
    from knobkeeper import lint

    invs = inventories(project)
    res.counts["inventories"] = len(invs)
    tools = {"bash -n": lint.available("bash"), "shellcheck": lint.available("shellcheck"),
             "systemd-analyze verify": lint.available("systemd-analyze"), "configparser": True}
    res.ran = [t for t, ok in tools.items() if ok]
    res.skipped = [f"{t} (not installed)" for t, ok in tools.items() if not ok]
    hosts = 0
    nfiles = 0
    for inv in invs:
        render = render_inventory(project, inv)
        if render.error:
            for host, error in render_errors_per_host(project, inv):
                template = re.search(r"(templates/[\w.\-]+)", error)
                where = template.group(1) if template else inv
                add(where, f"fails to render {'for host ' + host + ' ' if host else ''}of {inv}: {error}",
                    "fix the template or the host/group data it reads")
            continue
        hosts += len({h for h, _ in render.files})
        nfiles += len(render.files)
        order = {r: i for i, r in enumerate(render.order)}
        # Files of several hosts that differ only in their header are linted once, named with all hosts.
        groups: dict[tuple[str, str], list[RenderedFile]] = {}
        for (host, path), f in sorted(render.files.items(), key=lambda kv: (order.get(kv[1].role, -1), kv[0])):
            groups.setdefault((path, f.body), []).append(f)
        units = []
        for (path, _), group in groups.items():
            f = group[0]
            hosts_text = ", ".join(g.host for g in group)
            where = f"{inv} host{'s' if len(group) > 1 else ''} {hosts_text}" + (f" service {f.service}" if f.service else "")
            if path.endswith(".sh"):
                for name, fn in (("bash -n", lint.bash_syntax), ("shellcheck", lint.shellcheck)):
                    for text in fn(f.text) or []:
                        add("templates/launch.sh.j2", f"rendered {path} ({where}) fails {name}: {text}",
                            "fix the template (or the data it renders)")
            elif path.endswith(".service"):
                units.append(f)
            elif path.endswith(".conf"):
                for text in lint.ini_parse(f.text):
                    tpl = "templates/supervisor.conf.j2" if f.service else "templates/supervisord.conf.j2"
                    add(tpl, f"rendered {path} ({where}) does not parse: {text}", "fix the template")
        if units and tools["systemd-analyze verify"]:
            _verify_units(project, inv, units, add)
    res.counts["hosts"], res.counts["files"] = hosts, nfiles


def _verify_units(project: Project, inv: str, units: list[RenderedFile], add) -> None:
    """Render again with the prefix inside a temp dir, so ExecStart names a script that exists."""
    from knobkeeper import lint

    with tempfile.TemporaryDirectory(prefix="kk-verify-") as tmp:
        prefix = str(Path(tmp) / "p")
        render = render_inventory(project, inv, data={"prefix": prefix})
        if render.error:
            add(inv, f"does not render with prefix={prefix}: {render.error}", "fix the inventory data")
            return
        by_service: dict[tuple[str, str], dict[str, RenderedFile]] = {}
        for (host, path), f in render.files.items():
            if f.service:
                by_service.setdefault((host, f.service), {})[path] = f
        order = {r: i for i, r in enumerate(render.order)}
        groups: dict[tuple[str, str, str], list[tuple[str, RenderedFile, RenderedFile]]] = {}
        for (host, service), files in sorted(by_service.items(),
                                             key=lambda kv: (order.get(next(iter(kv[1].values())).role, -1), kv[0])):
            launch = next((f for p, f in files.items() if p.endswith(".sh")), None)
            unit = next((f for p, f in files.items() if p.endswith(".service")), None)
            if unit is not None and launch is not None:
                groups.setdefault((service, unit.body, launch.body), []).append((host, unit, launch))
        for (service, _, _), members in groups.items():
            host, unit, launch = members[0]
            hosts = ", ".join(m[0] for m in members)
            found = lint.systemd_verify(f"{service}.service", unit.text, launch.path, launch.text)
            for text in found or []:
                add("templates/systemd.service.j2",
                    f"rendered unit {service}.service ({inv} host{'s' if len(members) > 1 else ''} {hosts}) fails "
                    f"systemd-analyze verify: {text.replace(prefix, '{prefix}')}",
                    "fix the template (or the data it renders)")
