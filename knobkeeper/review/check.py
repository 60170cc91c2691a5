"""`check`: the CI / pre-commit gate over the working tree. One Problem per thing wrong, each
`path: what is wrong; how to fix`. `check()` runs one function per kind of problem, in order; each
reads what earlier ones loaded (the catalog, knobs.toml, the entries) from the shared `_Run`, and
a later one that needs something an earlier one could not load skips rather than repeat its error.

Nothing a secret knob holds is ever printed: a value pasted into knobs.toml for a secret knob is
named, not shown.
"""

from __future__ import annotations

import json

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobkeeper import fmt, lint
from knobkeeper.changelog.entries import Entry, in_history_order, parse_entry_file, replay
from knobkeeper.changelog.filecache import LINK_FIX, refusal, refused_files
from knobkeeper.changelog.incidents import parse_incident_file
from knobkeeper.changelog.secrets import tracked_secret_files
from knobkeeper.changelog.store import journal_file, settle
from knobkeeper.deploy import canary_state, experiment_state, repo_files
from knobkeeper.deploy.stack import load_stack
from knobkeeper.engine.contract import contract_problems
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.evidence.schema import SCHEMA
from knobkeeper.evidence.sweep import plan_problems
from knobkeeper.knobs.catalog import check_env_name, is_fingerprint, load_catalog
from knobkeeper.knobs.pinned import ignored_knobs
from knobkeeper.knobs.state import read_declared
from knobkeeper.project import Project
from knobkeeper.review.body import drift
from knobkeeper.review.gitrange import changed_paths, resolve_ref
from knobkeeper.review.renders import RenderedFile, inventories, relative, render_errors_per_host, render_inventory
from knobkeeper.timeutil import id_from_stem


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
    warnings: list[str] = field(default_factory=list)  # worth a look, not a failure (kv_both, ...)
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


@dataclass
class _Run:
    """One check run: the project, what was loaded so far, and the result being built."""

    project: Project
    base: str | None = None          # the --base as given
    base_sha: str | None = None
    result: CheckResult = field(default_factory=CheckResult)
    catalog: Any = None              # None: could not be loaded (already a problem)
    declared: dict | None = None
    entries: list[Entry] = field(default_factory=list)
    entries_ok: bool = True
    bad_values: set[tuple[str, str]] = field(default_factory=set)
    unloadable: set[str] = field(default_factory=set)  # inventories that do not load (named once, by check_render)
    hand_edits: bool = False         # knobs.toml differs from the changelog (`record` rewrites the repo files with it)
    halted: bool = False             # the files are half written: no later check can judge them
    _evidence_history: dict | None = None

    @property
    def evidence_history(self) -> dict:
        """store.history: the commit that first added each evidence file (one `git log` per run)."""
        if self._evidence_history is None:
            self._evidence_history = store.history(self.project)
        return self._evidence_history

    def add(self, path: str, what: str, fix: str) -> None:
        self.result.problems.append(Problem(path, what, fix))

    def rel(self, path: Path) -> str:
        return self.project.rel(path)

    def own_message(self, exc: UserError, path: Path) -> str:
        """An error's text without the repo's path and without the file name the problem line starts with."""
        return relative(str(exc), self.project.root).removeprefix(f"{self.rel(path)}: ")


# --------------------------------------------------------------------------- one function per kind

def check_unfinished_change(run: _Run) -> None:
    """First, before anything is read: a change that did not finish (its process died, or a write
    failed and so did putting its files back: a full disk) is rolled back, and said. Read before
    that, its half-written knobs.toml looked like a hand edit (`knobkeeper record` was advised for a
    change that had failed). One that cannot be rolled back yet is a problem, and nothing after it
    is judged: every later check would read the half-written files."""
    journal = run.rel(journal_file(run.project))
    try:
        back = settle(run.project)
    except OSError as exc:
        run.halted = True
        run.add(journal, f"a change that did not finish cannot be rolled back yet ({exc.strerror or exc})",
                "free disk space, then run `knobkeeper check` again: it rolls the change back first")
        return
    except UserError as exc:
        run.halted = True
        run.add(journal, run.own_message(exc, journal_file(run.project)), "then run `knobkeeper check` again")
        return
    if back is not None:
        what = f"the change `{fmt.safe(back.change)}`" if back.change else "a change"
        run.result.warnings.append(
            f"{what} failed before its commit (a write failed, e.g. on a full disk, or its process died) and was "
            f"rolled back: {', '.join(back.files)} are as they were before it, and nothing of it was committed; "
            f"run the command again (free disk space first if the disk is full)")


def check_catalog(run: _Run) -> None:
    """The catalog loads, and every knob name is a name a shell reads as a variable."""
    path = run.project.catalog_path
    try:
        catalog = load_catalog(path)
    except UserError as exc:
        run.add(run.rel(path), run.own_message(exc, path), "fix the catalog")
        return
    bad = False
    for name in catalog.knobs:
        try:
            check_env_name(name, f"knobs.{name}")
        except UserError as exc:
            bad = True
            run.add(run.rel(path), str(exc), "rename the entry (a knob name reaches every launch script unquoted)")
    run.catalog = None if bad else catalog


def check_declared(run: _Run) -> None:
    """knobs.toml parses and every value obeys the catalog; a secret knob holds only a fingerprint."""
    path = run.project.knobs_path
    rel = run.rel(path)
    catalog_rel = run.rel(run.project.catalog_path)
    try:
        run.declared = read_declared(path)
    except UserError as exc:
        run.add(rel, run.own_message(exc, path), "fix the file (git checkout inventory/knobs.toml undoes a bad edit)")
        return
    if run.catalog is None:
        return
    for role, table in run.declared.items():
        for name, value in table.items():
            secret = name in run.catalog and run.catalog.get(name).secret
            try:
                knob = run.catalog.for_role(name, role)
                if secret:
                    if not is_fingerprint(value):
                        run.bad_values.add((role, name))
                        run.add(rel, f"[{role}] plaintext value for secret knob {name} (not shown)",
                                f"knobs.toml holds only the value's sha256: fingerprint; remove the line, rotate the "
                                f"secret if it was committed, and set it with `knobkeeper set {name} --role {role}`")
                    continue
                knob.check(value)
            except UserError as exc:
                run.bad_values.add((role, name))
                shown = fmt.quoted(value) if not secret or is_fingerprint(value) else "(a plaintext value, not shown)"
                run.add(rel, f"[{role}] {name} = {shown} violates the catalog: {exc}",
                        f"use a value the catalog accepts (see `knobkeeper catalog {name}`) and record it, "
                        f"or add the knob to {catalog_rel}")


def check_secret_store(run: _Run) -> None:
    """Nothing under the secret store is tracked by git (an ignore rule is all that kept it out)."""
    store = run.rel(run.project.secrets_dir)
    for path in tracked_secret_files(run.project):
        run.add(path, "a secret's value is tracked by git",
                f"`git rm --cached {path}`, keep {store}/ ignored, and rotate the secret (it is in git history)")


def check_refused_files(run: _Run) -> None:
    """No entry, incident, evidence or deploy record is a symbolic link or resolves outside the
    repository: every reader leaves such a file out, and this is the one place that names it."""
    for path, why in refused_files(run.project):
        run.entries_ok = run.entries_ok and path.parent != run.project.entries_dir and path != run.project.entries_dir
        run.add(run.rel(path), why, LINK_FIX)


def check_abandoned_canary(run: _Run) -> None:
    """No canary died with its candidate still on some of a role's services (deploy/canary_state)."""
    line = canary_state.abandoned_line(run.project)
    if line:
        what, _, fix = line.partition("; ")
        run.add(run.rel(canary_state.marker_path(run.project)), what, fix)


def check_experiments(run: _Run) -> None:
    """No ab run or sweep died with the stack on one of its arms (deploy/experiment_state), and every
    sweep's evidence follows the plan committed before it (knobkeeper.evidence.sweep.plan_problems)."""
    line = experiment_state.abandoned_line(run.project)
    if line:
        what, _, fix = line.partition("; ")
        run.add(run.rel(experiment_state.marker_path(run.project)), what, fix)
    for path in store.paths(run.project):
        rel = run.rel(path)
        try:
            doc = store.read(path, rel)
        except UserError:
            continue   # check_evidence names it
        for text in plan_problems(run.project, doc, rel):
            run.add(rel, f"sweep {doc.id}: {text}", "a sweep's evidence must follow the plan committed before its data: "
                    "restore both from git, or run the sweep again")


def check_entries(run: _Run) -> None:
    """Every entry file parses, and knobs.toml holds what the entries replay to."""
    project = run.project
    paths = sorted(project.entries_dir.glob("*.toml")) if project.entries_dir.is_dir() else []
    for path in [p for p in paths if not refusal(p, project.root)]:   # links: check_refused_files
        try:
            run.entries.append(parse_entry_file(path))
        except UserError as exc:
            run.entries_ok = False
            run.add(run.rel(path), run.own_message(exc, path),
                    "fix the entry file (entries are written by knobkeeper; restore it with `git checkout`)")
    run.entries = in_history_order(project, run.entries)  # replay follows history, never the clocks
    run.result.counts["entries"] = len(run.entries)
    if not run.entries_ok or run.declared is None:
        return
    knobs_rel = run.rel(project.knobs_path)
    for role, name, want, have in drift(run.declared, replay(run.entries)):
        run.hand_edits = True
        if (role, name) in run.bad_values:
            continue  # already reported, without its value
        if have is None:
            what = f"[{role}] {name} was removed by hand (the changelog says {_shown(run, name, want)})"
        else:
            what = (f"[{role}] {name} = {_shown(run, name, have)} is not explained by the changelog "
                    f"(entries say {_shown(run, name, want)})")
        run.add(knobs_rel, what, "run `knobkeeper record --reason ...` to record the hand edit, "
                                 "or undo it with `git checkout inventory/knobs.toml`")


def _shown(run: _Run, name: str, value: Any) -> str:
    """A declared value for a problem line: a secret knob's only as its fingerprint."""
    if run.catalog is not None and name in run.catalog and run.catalog.get(name).secret:
        return run.catalog.get(name).display(value)
    return fmt.quoted(value)


def check_links(run: _Run) -> None:
    """Entries name evidence, incidents and other entries that exist."""
    project = run.project

    def stems(folder: Path, ext: str) -> set[str]:
        return {id_from_stem(p.stem) for p in folder.glob(f"*.{ext}")} if folder.is_dir() else set()

    evidence_ids, incident_ids = stems(project.evidence_dir, "json"), stems(project.incidents_dir, "toml")
    entry_ids = {e.id for e in run.entries}
    for e in run.entries:
        rel = run.rel(project.entries_dir / f"{e.stem}.toml")
        for ident in e.evidence:
            if ident not in evidence_ids:
                run.add(rel, f"evidence {ident} is missing from {run.rel(project.evidence_dir)}/",
                        "commit the evidence file (`knobkeeper ab import ...`) or restore it from git")
        if e.incident and e.incident not in incident_ids:
            run.add(rel, f"incident {e.incident} is missing from {run.rel(project.incidents_dir)}/",
                    "commit the incident file (`knobkeeper incident open ...`) or restore it from git")
        for key in ("reverts", "restores", "refutes"):
            ident = getattr(e, key)
            if ident and ident not in entry_ids:
                run.add(rel, f"{key} = {ident!r} names an entry that does not exist", "restore the missing entry from git")
        _check_backing(run, rel, e, [i for i in e.evidence if i in evidence_ids])


def _check_backing(run: _Run, rel: str, e: Entry, idents: list[str]) -> None:
    """Each evidence an entry names backs its change (Evidence.backs: that knob, on that role, with
    the entry's new value as its candidate). An unreadable file is check_evidence's problem."""
    for ident in idents:
        try:
            doc = store.load(run.project, ident)
        except UserError:
            continue
        value = doc.candidate if e.new is None else e.new  # an unset is backed by what was tested
        shown = (lambda v: run.catalog.get(e.knob).display(v)) if run.catalog is not None and e.knob in run.catalog \
            else fmt.value
        problem = doc.backs(e.knob, e.scope, value, show=shown)
        if problem:
            run.add(rel, f"its evidence does not back it: {problem}",
                    "name the evidence of this change (a new entry with the right --evidence); entries are immutable")


def _claimed_schema(path: Path, default: str) -> str:
    """The schema an evidence file says it follows (a schema-1 file is judged as one), else `default`."""
    try:
        claimed = json.loads(path.read_text()).get("schema")
    except (ValueError, AttributeError, OSError):
        return default
    return claimed if isinstance(claimed, str) else default


def check_evidence(run: _Run) -> None:
    """Every evidence file loads through the store, its id matches its name, its raw files exist, and
    its judgement is what its runs give (store.verify: recomputed, no NaN)."""
    project = run.project
    files = store.paths(project)
    run.result.counts["evidence"] = len(files)
    committed = _committed_claims(project, run.evidence_history) if files else {}
    fix = "regenerate it with `knobkeeper ab import` or restore it from git"
    for path in files:
        rel = run.rel(path)
        ident = id_from_stem(path.stem)
        try:
            doc = store.load(project, ident)
        except UserError as exc:
            text = relative(str(exc), project.root)
            if text.startswith(f"{rel}: "):  # the store names the file: the JSON or the schema is wrong
                what = text.removeprefix(f"{rel}: ")
                text = what if what.startswith("not JSON") else f"fails schema {_claimed_schema(path, SCHEMA)}: {what}"
            run.add(rel, text, fix)
            continue
        if doc.id != ident:
            run.add(rel, f"id {doc.id!r} does not match the file name", "rename the file or fix its id")
        for raw in doc.source.raw_files:
            if not (project.root / raw).exists():
                run.add(rel, f"source.raw_files names {raw}, which is missing", "commit the raw file or drop it from the list")
        for text in store.verify(doc):
            run.add(rel, f"judgement does not follow from its runs: {text}",
                    "re-judge it from its runs (`knobkeeper ab import` again) or restore it from git")
        for text in doc.disagreements(committed.get(rel)):
            run.add(rel, f"disagrees with itself: {text}",
                    f"restore it from git (`git log --follow -- {rel}` shows what it held) or measure again")


_ADDED = re.compile(r"evidence: (?P<knob>[^=\s]+)=(?P<value>.*?) on (?P<role>\S+) \(")


def _committed_claims(project: Project, history: dict) -> dict[str, dict[str, str]]:
    """What the commit that added each evidence file said it held, by the file's path: the store's
    summary `evidence: KNOB=VALUE on ROLE (...)` gives knob, value and role (store.history: the
    first commit that added it). Files added otherwise (by hand, by a merge) claim nothing here."""
    folder = project.rel(project.evidence_dir)
    claims: dict[str, dict[str, str]] = {}
    for path, added in history.items():
        found = _ADDED.match(added.subject)
        if found and path.endswith(".json") and path.rsplit("/", 1)[0] == folder:
            claims[path] = {**found.groupdict(), "commit": added.commit}
    return claims


def check_immutable_evidence(run: _Run) -> None:
    """Every committed evidence file (its JSON and its raw files) holds the bytes of the commit that
    added it (store.altered: evidence is append-only, like entries); with --base, none committed at
    the base was modified or deleted since (what a rewrite of history shows)."""
    project = run.project
    reported: set[str] = set()
    for added in store.altered(project, run.evidence_history):
        reported.add(added.path)
        run.add(added.path, f"changed since {added.commit[:10]}, the commit that added it (evidence files are "
                            f"append-only: entries cite what it held)",
                _evidence_fix(run, added.path, added.commit, modified=True))
    if not run.base_sha:
        return
    folder = project.rel(project.evidence_dir)
    for path, status in sorted(changed_paths(project, run.base_sha, None, folder).items()):
        if status in ("M", "D") and path not in reported and not Path(path).name.startswith("."):
            run.add(path, f"a committed evidence file was {'deleted' if status == 'D' else 'modified'} since "
                          f"{run.base[:20]}", _evidence_fix(run, path, run.base_sha, modified=status == "M"))


def _evidence_fix(run: _Run, path: str, sha: str, *, modified: bool) -> str:
    """How to put back an evidence file (JSON or raw file) that `sha` holds as it must stay, and,
    for a modified evidence JSON, the one way to a new judgement of its runs."""
    fix = f"restore it (`git checkout {sha[:10]} -- {path}`)"
    if modified and path.endswith(".json") and path.rsplit("/", 1)[0] == run.rel(run.project.evidence_dir):
        fix += (f"; to judge its runs again, `knobkeeper ab rejudge {id_from_stem(Path(path).stem)}` writes a new "
                f"evidence file that names it")
    return fix


def check_rejudgements(run: _Run) -> None:
    """A re-judgement (`rejudges`) names evidence that exists and holds exactly its measurements
    (Evidence.departures_from): it judges those runs again, it cannot bring other numbers in."""
    project = run.project
    files = store.paths(project)
    ids = {id_from_stem(p.stem) for p in files}
    for path in files:
        try:
            doc = store.read(path, run.rel(path))
        except UserError:
            continue   # check_evidence names it
        if not doc.rejudges:
            continue
        if doc.rejudges not in ids:
            run.add(run.rel(path), f"rejudges {doc.rejudges}, which is missing from {run.rel(project.evidence_dir)}/",
                    "restore the evidence it re-judges from git")
            continue
        try:
            original = store.load(project, doc.rejudges)
        except UserError:
            continue   # check_evidence names it
        differ = doc.departures_from(original)
        if differ:
            run.add(run.rel(path), f"rejudges {original.id}, but its {', '.join(differ)} differ from that file's",
                    f"a re-judgement holds the runs it judges unchanged: write it with `knobkeeper ab rejudge "
                    f"{original.id}`, or import new measurements as new evidence (`knobkeeper ab import`)")


def check_incidents(run: _Run) -> None:
    """Every incident file parses and names reverts that are entries."""
    project = run.project
    paths = sorted(p for p in project.incidents_dir.glob("*.toml") if not refusal(p, project.root)) \
        if project.incidents_dir.is_dir() else []
    run.result.counts["incidents"] = len(paths)
    entry_ids = {e.id for e in run.entries}
    for path in paths:
        try:
            inc = parse_incident_file(path)
        except UserError as exc:
            run.add(run.rel(path), run.own_message(exc, path),
                    "fix the incident file (written by `knobkeeper incident`; restore it with `git checkout`)")
            continue
        named = [n.refutes for n in inc.notes] + [n.confirms for n in inc.notes] + \
                (inc.resolution.implicates if inc.resolution else [])
        for ident in filter(None, named):
            if ident not in entry_ids:
                run.add(run.rel(path), f"names revert {ident}, which is not an entry", "restore the entry from git")


def check_immutable_entries(run: _Run) -> None:
    """With --base: no entry committed at the base was modified or deleted since."""
    if not run.base_sha:
        return
    for path, status in sorted(changed_paths(run.project, run.base_sha, None, "changelog/entries").items()):
        if status in ("M", "D") and path.endswith(".toml"):
            run.add(path, f"a committed entry was {'deleted' if status == 'D' else 'modified'} since {run.base[:20]}",
                    f"entries are immutable: restore it (`git checkout {run.base_sha[:10]} -- {path}`) and add a new "
                    f"entry with set/unset/revert")


def check_render(run: _Run) -> None:
    """Every host of every inventory renders; what renders lints (bash -n, shellcheck, systemd, ini)."""
    invs = inventories(run.project)
    res = run.result
    res.counts["inventories"] = len(invs)
    tools = {"bash -n": lint.available("bash"), "shellcheck": lint.available("shellcheck"),
             "systemd-analyze verify": lint.available("systemd-analyze"), "configparser": True}
    res.ran = [t for t, ok in tools.items() if ok]
    res.skipped = [f"{t} (not installed)" for t, ok in tools.items() if not ok]
    if run.catalog is None or run.declared is None or run.bad_values:
        # Every host would fail to render with the problem already reported.
        res.skipped.insert(0, "rendering (fix the catalog and knobs.toml problems first)")
        return
    hosts = nfiles = 0
    for inv in invs:
        render = render_inventory(run.project, inv)
        if render.error:
            _render_errors(run, inv)
            continue
        hosts += len({h for h, _ in render.files})
        nfiles += len(render.files)
        units = _lint_files(run, inv, render)
        if units and tools["systemd-analyze verify"]:
            _verify_units(run, inv)
    res.counts["hosts"], res.counts["files"] = hosts, nfiles


def check_repo_files(run: _Run) -> None:
    """Rendered files kept in the repo (a Kubernetes stack's manifests, applied by Argo CD or Flux):
    valid by their target's strict linter, as rendered and as committed, and committed as rendered."""
    if run.catalog is None or run.declared is None or run.bad_values:
        return  # already reported: nothing renders
    for inv in inventories(run.project):
        if inv in run.unloadable:
            continue
        try:
            # Files stale only because of a hand edit of knobs.toml: one problem (the edit), one fix
            # (`record`, which commits the repo files with it), not one per manifest.
            found = repo_files.problems(run.project, inv, stale_too=not run.hand_edits)
        except UserError:
            continue  # check_render named it
        for path, what, fix in found:
            run.add(path, fmt.safe(what), fix)


def check_engine_contract(run: _Run) -> None:
    """What the pinned engine versions would make of it: declared knobs they would ignore (or that
    are declared for a role running another engine), launch flags their own parser rejects,
    prefill/decode pairs that would not work together (knobkeeper.engine.contract)."""
    if run.catalog is None or run.declared is None or run.bad_values:
        return  # already reported; the engine cannot judge what does not load
    fix_knob = ("remove the knob, declare it for the stack and role whose engine reads it, or give its catalog "
                "entry a source (fork, build, PR) and set it with --allow-undeclared")
    for line in ignored_knobs(run.project):
        path, _, what = line.partition(": ")
        run.add(path, fmt.safe(what), fix_knob)
    for inv in inventories(run.project):
        if inv in run.unloadable:
            continue
        try:
            problems, skipped, warnings = contract_problems(load_stack(run.project.root, inv), inv)
        except UserError as exc:
            run.add(inv, relative(str(exc), run.project.root), "fix the inventory so that it loads")
            continue
        for line in problems:
            path, _, what = line.partition(": ")
            run.add(path, fmt.safe(what), "use flags and values the pinned engine version accepts (see its --help)")
        run.result.skipped += [line.removeprefix("skipped: ") for line in skipped]
        run.result.warnings += [fmt.safe(line) for line in warnings]


def _render_errors(run: _Run, inv: str) -> None:
    for host, error in render_errors_per_host(run.project, inv):
        if not host:  # the inventory itself does not load: its error names its file and line
            run.unloadable.add(inv)
            run.add(inv, error.removeprefix(f"{inv}: "), "fix the inventory so that it loads")
            continue
        template = re.search(r"(templates/[\w.\-]+)", error)
        where = template.group(1) if template else inv
        run.add(where, f"fails to render for host {host} of {inv}: {error}",
                "fix the template or the host/group data it reads")


def _by_role_order(render, items):
    order = {r: i for i, r in enumerate(render.order)}
    return sorted(items, key=lambda kv: (order.get(kv[1].role, -1), kv[0]))


def _lint_files(run: _Run, inv: str, render) -> list[RenderedFile]:
    """Lint launch scripts and supervisord sections; return the units (verified apart). Files of
    several hosts that differ only in their header are linted once, named with all hosts."""
    groups: dict[tuple[str, str], list[RenderedFile]] = {}
    for (_, path), f in _by_role_order(render, render.files.items()):
        groups.setdefault((path, f.body), []).append(f)
    units = []
    for (path, _), group in groups.items():
        f = group[0]
        where = f"{inv} {_hosts(g.host for g in group)}" + (f" service {f.service}" if f.service else "")
        tpl = f"templates/{f.template}"
        if path.endswith(".sh"):
            for name, linter in (("bash -n", lint.bash_syntax), ("shellcheck", lint.shellcheck)):
                for text in linter(f.text) or []:
                    run.add(tpl, f"rendered {path} ({where}) fails {name}: {text}",
                            "fix the template (or the data it renders)")
        elif path.endswith(".service"):
            units.append(f)
        elif path.endswith(".conf"):
            for text in lint.ini_parse(f.text):
                run.add(tpl, f"rendered {path} ({where}) does not parse: {text}", "fix the template")
    return units


def _hosts(names) -> str:
    names = list(names)
    return f"host{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _verify_units(run: _Run, inv: str) -> None:
    """Render again with the prefix inside a temp dir, so ExecStart names a script that exists."""
    with tempfile.TemporaryDirectory(prefix="kk-verify-") as tmp:
        prefix = str(Path(tmp) / "p")
        render = render_inventory(run.project, inv, data={"prefix": prefix})
        if render.error:
            run.add(inv, f"does not render with prefix={prefix}: {render.error}", "fix the inventory data")
            return
        groups: dict[tuple[str, str, str], list[tuple[str, RenderedFile, RenderedFile]]] = {}
        for (host, service), _ in sorted(render.services.items(),
                                         key=lambda kv: (render.order.index(_role_of(render, *kv[0])), kv[0])):
            files = render.service_files(host, service)
            launch = next((f for p, f in files.items() if p.endswith(".sh")), None)
            unit = next((f for p, f in files.items() if p.endswith(".service")), None)
            if unit is not None and launch is not None:
                groups.setdefault((service, unit.body, launch.body), []).append((host, unit, launch))
        for (service, _, _), members in groups.items():
            _, unit, launch = members[0]
            found = lint.systemd_verify(f"{service}.service", unit.text, launch.path, launch.text)
            for text in found or []:
                run.add("templates/systemd.service.j2",
                        f"rendered unit {service}.service ({inv} {_hosts(m[0] for m in members)}) fails "
                        f"systemd-analyze verify: {text.replace(prefix, '{prefix}')}",
                        "fix the template (or the data it renders)")


def _role_of(render, host: str, service: str) -> str:
    return next(iter(render.service_files(host, service).values())).role


CHECKS = (check_unfinished_change, check_catalog, check_declared, check_secret_store, check_refused_files,
          check_abandoned_canary, check_experiments, check_entries, check_links, check_evidence,
          check_immutable_evidence, check_rejudgements, check_incidents, check_immutable_entries, check_render,
          check_repo_files, check_engine_contract)


def check(project: Project, base: str | None = None) -> CheckResult:
    """Every problem of the working tree, one Problem each (see the module docstring)."""
    run = _Run(project, base, resolve_ref(project, base, "--base") if base else None)
    for step in CHECKS:
        step(run)
        if run.halted:
            break
    return run.result
