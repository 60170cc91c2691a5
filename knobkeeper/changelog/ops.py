"""The knob changes: set, unset, revert, restore, record. Each is one entry (or several for
record), the new knobs.toml, and exactly one git commit — or nothing at all.

Every function validates under the repo lock before it writes, so a UserError leaves the tree
and the history as they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from knobkeeper import gitio
from knobkeeper.changelog.entries import Entry, entry_path, history, load_entries, new_entry_time, replay, shown_old
from knobkeeper.changelog.filecache import files_with_id_prefix
from knobkeeper.changelog.secrets import secret_path, secret_value, value_files
from knobkeeper.changelog.store import Message, commit_change, git_author, repo_lock
from knobkeeper.deploy import repo_files
from knobkeeper.deploy.canary_state import refuse_change
from knobkeeper.engine.pins import pins_for
from knobkeeper.fsio import atomic_write
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import Catalog, Knob, Value, fingerprint, load_catalog
from knobkeeper.knobs.pinned import settable
from knobkeeper.knobs.state import declared_from, load_document, read_declared, value_of, with_value
from knobkeeper.knobs.values import split_scope, stack_hint
from knobkeeper.project import Project
from knobkeeper.timeutil import new_id

# Actions whose value a revert can take back.
REVERTIBLE = ("set", "restore", "record")


@dataclass
class Change:
    """What a mutating command did: the entries it wrote and the commit that holds them."""

    entries: list[Entry]
    commit: str | None
    branch: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def entry(self) -> Entry:
        return self.entries[0]


@dataclass
class RestoreVerdict:
    """What a restore guard decided: record a refutation of the revert, why, and what to warn about."""

    refutes: bool = False
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class CommitOptions:
    no_commit: bool = False
    branch: str | None = None


def _context(project: Project, change: bool = True) -> tuple[Catalog, dict]:
    """The catalog and declared state a change starts from (`change`: refuse unexplained edits)."""
    if change:
        refuse_unexplained_edits(project)
    catalog = load_catalog(project.catalog_path)
    declared = read_declared(project.knobs_path, catalog)
    return catalog, declared


def _one_id(project: Project, folder: Path, suffix: str, ident: str, option: str, what: str, see: str) -> str:
    """The full id of the one `*suffix` file in `folder` whose id starts with `ident` (literally: no glob)."""
    matches = [p for p in files_with_id_prefix(folder, ident.strip()) if p.suffix == suffix] if ident.strip() else []
    if not matches:
        raise UserError(f"{option} {ident!r}: no such {what} in {project.rel(folder)}/ (see `{see}`)")
    if len(matches) > 1:
        raise UserError(f"{option} {ident!r}: ambiguous; give more characters")
    return matches[0].stem.rsplit("-", 1)[-1]


def _check_evidence(project: Project, ids: list[str], knob: Knob, role: str, value: Value | None) -> list[str]:
    """Evidence ids must name files in changelog/evidence/ whose evidence backs this change (the
    same knob, on the same role, with `value` as its candidate: Evidence.backs); returns the full ids."""
    full = [_one_id(project, project.evidence_dir, ".json", i, "--evidence", "evidence", "knobkeeper ab show") for i in ids]
    for ident in full:
        problem = _load_evidence(project, ident).backs(knob.name, role, value, show=knob.display)
        if problem:
            raise UserError(f"--evidence {ident}: {problem}; give the evidence of this change")
    return full


def _load_evidence(project: Project, ident: str):
    """The evidence `ident` through THE evidence reader (knobkeeper.evidence.store). Imported here,
    not at the top, for start-up cost: the store brings the judgement and the importers, and with
    it at the top `import knobkeeper.changelog.ops` took 193-212 ms instead of 132-153 ms (-X
    importtime, 5 runs each), paid by every knob change, most of which cite no evidence."""
    from knobkeeper.evidence import store

    return store.load(project, ident)


def _check_incident(project: Project, ident: str) -> str:
    return _one_id(project, project.incidents_dir, ".toml", ident, "--incident", "incident", "knobkeeper incident list")


def refuse_unexplained_edits(project: Project) -> None:
    """A change commits knobs.toml whole, so it must start from HEAD's values: refuse when the
    working file declares values HEAD does not (a hand edit, or an earlier `--no-commit`), which
    would otherwise be committed without their entry. Comments and layout may differ."""
    rel = project.rel(project.knobs_path)
    shown = gitio.run(project.root, "show", f"HEAD:{rel}")
    try:
        committed = declared_from(project.knobs_path, tomllib.loads(shown.stdout)) if shown.returncode == 0 else {}
    except (tomllib.TOMLDecodeError, UserError):
        committed = None
    def values(declared: dict | None) -> dict | None:  # empty tables declare nothing
        return None if declared is None else {role: table for role, table in declared.items() if table}

    if values(read_declared(project.knobs_path)) == values(committed):
        return
    if unexplained_edits(project):
        raise UserError(f"{rel} has changes no entry explains; run `knobkeeper record` or undo them")
    raise UserError(f"{rel} has changes that are not committed yet (an earlier `--no-commit`?); "
                    f"commit them with their entries (git commit) or undo them first")


def _canary_free(project: Project, role: str, verb: str) -> None:
    """A running canary owns its role (knobkeeper.deploy.canary_state): no change of a knob there
    under its measurement."""
    refuse_change(project, role, verb)


def _reason(reason: str | None, what: str) -> str:
    if reason is None or not reason.strip():
        raise UserError(f"{what}: --reason is required (say why, for whoever audits this later)")
    return reason.strip()


def _summary(entry: Entry, knob: Knob) -> str:
    if entry.action in ("unset",) or (entry.action == "revert" and entry.new is None):
        return f"{entry.scope}: {entry.action} {entry.knob} (was {shown_old(entry, knob.display)})"
    return f"{entry.scope}: {entry.action} {entry.knob}={knob.display(entry.new)}"


def _trailers(entries: list[Entry], catalog: Catalog) -> list[tuple[str, str]]:
    trailers: list[tuple[str, str]] = []
    for entry in entries:
        knob = catalog.get(entry.knob)
        trailers += [
            ("Knob", entry.knob), ("Role", entry.role), ("Action", entry.action),
            ("Old", shown_old(entry, knob.display)), ("New", knob.display(entry.new)), ("Entry", entry.id),
        ]
        if entry.stack:
            trailers.append(("Stack", entry.stack))
        if entry.reverts:
            trailers.append(("Reverts", entry.reverts))
        if entry.restores:
            trailers.append(("Restores", entry.restores))
        if entry.refutes:
            trailers.append(("Refutes", entry.refutes))
        if entry.incident:
            trailers.append(("Incident", entry.incident))
        for ev in entry.evidence:
            trailers.append(("Evidence", ev))
    return trailers


def _write(project: Project, catalog: Catalog, entries: list[Entry], knobs_text: str,
           options: CommitOptions, secret_files: dict[Path, str] | None = None) -> Change:
    """Write the entries, knobs.toml and any secret values, and commit them as one change."""
    files: dict[Path, str] = {project.knobs_path: knobs_text}
    for entry in entries:
        files[entry_path(project, entry)] = entry.to_toml()
    # The rendered files kept in the repo (a Kubernetes stack's manifests) change in this same commit.
    files.update(repo_files.after_change(project, knobs_text, entries))
    if len(entries) == 1:
        summary = _summary(entries[0], catalog.get(entries[0].knob))
        body = entries[0].reason
    else:
        summary = f"record: {len(entries)} hand edits of knobs.toml"
        body = entries[0].reason + "\n\n" + "\n".join(
            f"- {e.scope}: {e.knob} {shown_old(e, catalog.get(e.knob).display)} -> {catalog.get(e.knob).display(e.new)}"
            for e in entries
        )
    if entries[0].hypothesis:
        body += f"\n\nHypothesis: {entries[0].hypothesis}"
    message = Message(summary=summary, body=body, trailers=_trailers(entries, catalog))
    # Secret values go to the git-ignored store, never into a commit, under the same journal.
    sha = commit_change(project, files, message, no_commit=options.no_commit, branch=options.branch, locked=True,
                        private_files=secret_files)
    return Change(entries=entries, commit=sha, branch=options.branch)


def _where(key: str) -> dict[str, str | None]:
    """An entry's role and stack from a scope ("decode", "vllm.decode"): the `role` every change
    function takes is a scope, so a one-stack repo's calls read as they always did."""
    stack, role = split_scope(key)
    return {"role": role, "stack": stack or None}


def _before(project: Project, knob: Knob, key: str, declared: Value | None) -> dict[str, Value | str | None]:
    """The `old` and `old_from` of a change to `knob` in scope `key` whose declared value was
    `declared`: that value; where none was declared, what the stack's inventories run for the role
    by their data knob_defaults (deploy/render.py applies them), and that it came from there; else
    nothing (the engine's own default). The inventories are those that run the role in that stack
    (engine.pins, as set judges the knob); where they run different values, no `old`, and
    `old_from` names each rather than picking one."""
    if declared is not None or knob.secret:  # a secret has no inventory default (render refuses one)
        return {"old": declared, "old_from": None}
    stack, role = split_scope(key)
    pins = pins_for(project.inventory_dir, stack, role)
    inventories = [p.inventory for p in pins]
    ran: dict[str, Value | None] = {}
    for pin in pins:
        label = pin.inventory if inventories.count(pin.inventory) == 1 else f"{pin.inventory} ({', '.join(pin.hosts)})"
        value = dict(pin.knob_defaults).get(knob.name)
        try:
            ran[label] = None if value is None else knob.from_data(value)
        except UserError:
            ran[label] = value  # the render refuses it, naming it; shown here as written
    if all(v is None for v in ran.values()):
        return {"old": None, "old_from": None}
    if len({(type(v), v) for v in ran.values()}) == 1:
        return {"old": next(iter(ran.values())), "old_from": f"inventory default: {', '.join(ran)}"}
    each = ", ".join(f"{'engine default' if v is None else knob.display(v)} in {label}" for label, v in ran.items())
    return {"old": None, "old_from": f"inventory defaults differ: {each}"}


def _new_entry(project: Project, **fields) -> Entry:
    return Entry(id=new_id(), time=new_entry_time(), author=git_author(project), **fields)


def set_knob(project: Project, name: str, raw_value: str, role: str, reason: str | None,
             evidence: list[str] | None = None, options: CommitOptions | None = None,
             allow_undeclared: bool | None = None) -> Change:
    """Declare KNOB=VALUE for ROLE (refused when the engine version pinned for ROLE does not read it)."""
    options = options or CommitOptions()
    with repo_lock(project):
        _canary_free(project, role, f"set {name}")
        catalog, declared = _context(project)
        knob = catalog.for_role(name, role)
        value = knob.parse(raw_value)
        reason = _reason(reason, f"set {name}")
        stored: Value = fingerprint(value) if knob.secret else value
        evidence_ids = _check_evidence(project, evidence or [], knob, role, stored)
        engine_warnings = settable(project.inventory_dir, knob, role, allow_undeclared)
        old = value_of(declared, role, name)
        if old == stored and type(old) is type(stored):
            if knob.secret and secret_value(project, role, name, str(stored)) is None:
                return _store_secret_only(project, role, name, str(value))
            raise UserError(f"{name} is already {knob.display(stored)} on {role}; nothing to change")
        entry = _new_entry(project, action="set", knob=name, **_where(role), reason=reason,
                           **_before(project, knob, role, old), new=stored, evidence=evidence_ids)
        text = with_value(load_document(project.knobs_path), role, name, stored)
        secrets = value_files(project, role, name, str(value)) if knob.secret else None
        change = _write(project, catalog, [entry], text, options, secrets)
        change.warnings += engine_warnings
        return change


def set_knobs(project: Project, items: list[tuple[str, str, str]], reason: str, *,
              extra_files: dict[Path, str] | None = None, summary: str | None = None,
              no_commit: bool = False) -> Change:
    """Declare several (role, KNOB, VALUE) in one commit, one entry each, with `extra_files` (an import
    writes its inventory beside them: `knobkeeper import srtctl`). Secrets are refused (their values
    belong in the store, through `set`); a knob already at its value gets no entry."""
    with repo_lock(project):
        for role in dict.fromkeys(r for r, _, _ in items):
            _canary_free(project, role, "set")
        catalog, declared = _context(project)
        document = load_document(project.knobs_path)
        text = project.knobs_path.read_text()
        entries: list[Entry] = []
        for role, name, raw in items:
            knob = catalog.for_role(name, role)
            if knob.secret:
                raise UserError(f"{name} is a secret knob: set it with `knobkeeper set {name} --value-file PATH`")
            value = knob.parse(raw)
            settable(project.inventory_dir, knob, role, None)
            old = value_of(declared, role, name)
            if old == value and type(old) is type(value):
                continue
            entries.append(_new_entry(project, action="set", knob=name, role=role, reason=reason,
                                      **_before(project, knob, role, old), new=value))
            text = with_value(document, role, name, value)
        files: dict[Path, str] = {**(extra_files or {})}
        if entries:
            files[project.knobs_path] = text
        for entry in entries:
            files[entry_path(project, entry)] = entry.to_toml()
        if entries:
            files.update(repo_files.after_change(project, text, entries))
        body = reason + ("\n\n" + "\n".join(f"- {e.role}: {e.knob} {shown_old(e, catalog.get(e.knob).display)} -> "
                                            f"{catalog.get(e.knob).display(e.new)}" for e in entries) if entries else "")
        message = Message(summary=summary or f"set {len(entries)} knobs", body=body,
                          trailers=_trailers(entries, catalog) if entries else [("Action", "import")])
        sha = commit_change(project, files, message, no_commit=no_commit, locked=True)
        return Change(entries=entries, commit=sha)


def _store_secret_only(project: Project, role: str, name: str, value: str) -> Change:
    """knobs.toml already declares this value's fingerprint, but this machine lacks the value
    (a fresh clone): store it, with no entry and no commit, since nothing declared changes."""
    for path, content in value_files(project, role, name, value).items():
        atomic_write(path, content, mode=0o600)
    return Change(entries=[], commit=None, warnings=[
        f"{name} on {role}: knobs.toml already declares {fingerprint(value)}; stored its value on this machine "
        f"(nothing to commit)"])


def unset_knob(project: Project, name: str, role: str, reason: str | None,
               options: CommitOptions | None = None) -> Change:
    """Remove KNOB from ROLE's declared state (the engine's own default applies)."""
    options = options or CommitOptions()
    with repo_lock(project):
        _canary_free(project, role, f"unset {name}")
        catalog, declared = _context(project)
        catalog.for_role(name, role)
        reason = _reason(reason, f"unset {name}")
        old = value_of(declared, role, name)
        if old is None:
            hint = stack_hint(_other_stacks(role, [key for key, table in declared.items() if name in table]), "unset it")
            raise UserError(f"{name} is not set on {role}; nothing to unset{hint}")
        entry = _new_entry(project, action="unset", knob=name, **_where(role), reason=reason, old=old, new=None)
        text = with_value(load_document(project.knobs_path), role, name, None)
        return _write(project, catalog, [entry], text, options)


def _require_secret_value(project: Project, knob: Knob, role: str, value: Value | None, verb: str) -> None:
    """A revert/restore of a secret goes back to a fingerprint: its value must be in the store."""
    if knob.secret and value is not None and secret_value(project, role, knob.name, str(value)) is None:
        raise UserError(f"{verb} {knob.name} on {role}: the secret value {value} is not in "
                        f"{project.rel(secret_path(project, role, knob.name, str(value)))} on this machine; "
                        f"set it again with `knobkeeper set {knob.name} --role {role} --value-file PATH`")


def _other_stacks(key: str, scopes: list[str]) -> list[str]:
    """The stacks ("" : the unnamed one) of `scopes` that are key's role in another stack: where a
    command given `key` should have looked (`stack_hint` words it as `set` does)."""
    stack, role = split_scope(key)
    return sorted({s for s, r in map(split_scope, scopes) if r == role and s != stack})


def revert_target(entries: list[Entry], name: str, role: str) -> Entry:
    """The latest set/restore/record of the knob, which a revert takes back."""
    past = history(entries, role, name)
    if not past:
        hint = stack_hint(_other_stacks(role, [e.scope for e in entries if e.knob == name]), "revert it")
        raise UserError(f"revert {name} on {role}: nothing to revert (no changelog entry for it){hint}")
    latest = past[-1]
    if latest.action not in REVERTIBLE:
        raise UserError(
            f"revert {name} on {role}: nothing to revert (its latest change, {latest.id}, is a {latest.action}; "
            f"revert takes back a set, restore or record)"
        )
    return latest


def revert_knob(project: Project, name: str, role: str, reason: str | None, incident: str | None = None,
                hypothesis: str | None = None, options: CommitOptions | None = None) -> Change:
    """Take back the latest set/restore of KNOB on ROLE; its value returns to what it was before."""
    options = options or CommitOptions()
    with repo_lock(project):
        _canary_free(project, role, f"revert {name}")
        catalog, declared = _context(project)
        knob = catalog.for_role(name, role)
        reason = _reason(reason, f"revert {name}")
        target = revert_target(load_entries(project), name, role)
        # An old value knobs.toml did not declare (the inventories' default) comes back by removing
        # the declaration: the role then runs what its inventories give it, as before the change.
        back = None if target.old_from is not None else target.old
        _require_secret_value(project, knob, role, back, "revert")
        incident_id = _check_incident(project, incident) if incident else None
        entry = _new_entry(project, action="revert", knob=name, **_where(role), reason=reason,
                           **_before(project, knob, role, value_of(declared, role, name)), new=back,
                           reverts=target.id, incident=incident_id,
                           hypothesis=hypothesis.strip() if hypothesis else None)
        text = with_value(load_document(project.knobs_path), role, name, back)
        return _write(project, catalog, [entry], text, options)


def restore_target(entries: list[Entry], name: str, role: str) -> tuple[Entry, Entry]:
    """(the latest revert of the knob, the entry it reverted)."""
    past = history(entries, role, name)
    if not past or past[-1].action != "revert":
        latest = f"its latest change is a {past[-1].action} ({past[-1].id})" if past else "it has no changelog entry"
        hint = "" if past else stack_hint(_other_stacks(role, [e.scope for e in entries if e.knob == name]), "restore it")
        raise UserError(f"restore {name} on {role}: nothing reverted to restore ({latest}){hint}")
    revert = past[-1]
    by_id = {e.id: e for e in entries}
    if revert.reverts not in by_id:
        raise UserError(f"restore {name} on {role}: revert {revert.id} names entry {revert.reverts}, which is missing")
    return revert, by_id[revert.reverts]


def restore_knob(project: Project, name: str, role: str, reason: str | None = None,
                 evidence: list[str] | None = None, refutes: bool = False,
                 options: CommitOptions | None = None, guard=None) -> Change:
    """Re-apply the value the latest revert removed, carrying the original entry's evidence.

    `guard(entries, revert)` may raise UserError (the audit refuses a confirmed revert without --force)
    or return a RestoreVerdict (the audit records a refuted revert's refutation and says why).
    """
    options = options or CommitOptions()
    with repo_lock(project):
        _canary_free(project, role, f"restore {name}")
        catalog, declared = _context(project)
        knob = catalog.for_role(name, role)
        entries = load_entries(project)
        revert, original = restore_target(entries, name, role)
        verdict = guard(entries, revert) if guard is not None else None
        if verdict is not None:
            refutes = refutes or verdict.refutes
        _require_secret_value(project, knob, role, original.new, "restore")
        extra = _check_evidence(project, evidence or [], knob, role, original.new)
        carried, dropped = _still_backing(project, original.evidence, knob, role, original.new)
        carried = list(dict.fromkeys([*carried, *extra]))
        why = reason.strip() if reason and reason.strip() else f"restore {original.id}: revert {revert.id} did not hold"
        if verdict is not None and verdict.reason:
            why = f"{reason.strip()}; {verdict.reason}" if reason and reason.strip() else verdict.reason
        entry = _new_entry(project, action="restore", knob=name, **_where(role), reason=why,
                           **_before(project, knob, role, value_of(declared, role, name)), new=original.new,
                           restores=revert.id,
                           evidence=carried, incident=revert.incident,
                           refutes=revert.id if refutes else None)
        text = with_value(load_document(project.knobs_path), role, name, original.new)
        change = _write(project, catalog, [entry], text, options)
        change.warnings += dropped
        if verdict is not None:
            change.warnings += verdict.warnings
        return change


def _still_backing(project: Project, ids: list[str], knob: Knob, role: str,
                   value: Value | None) -> tuple[list[str], list[str]]:
    """(the ids of `ids` whose evidence backs restoring `value`, a warning per one left behind).
    The original entry's evidence is carried over only where it backs the value restored: an entry
    written before set checked the binding may name another knob's A/B, and a restore must not
    carry that claim forward; refusing instead would leave such a knob unrestorable."""
    kept, warnings = [], []
    for ident in ids:
        try:
            problem = _load_evidence(project, ident).backs(knob.name, role, value, show=knob.display)
        except UserError as exc:
            problem = str(exc)
        if problem:
            warnings.append(f"not carried over from the restored entry: {problem}")
        else:
            kept.append(ident)
    return kept, warnings


def unexplained_edits(project: Project) -> list[tuple[str, str, Value | None, Value | None]]:
    """(role, knob, explained, declared) for every value knobs.toml holds that the entries don't explain."""
    catalog, declared = _context(project, change=False)
    explained = replay(load_entries(project))
    drift = []
    for role in sorted(set(declared) | set(explained)):
        names = set(declared.get(role, {})) | set(explained.get(role, {}))
        for name in sorted(names):
            want, have = explained.get(role, {}).get(name), declared.get(role, {}).get(name)
            if want != have or type(want) is not type(have):
                drift.append((role, name, want, have))
    return drift


def record_edits(project: Project, reason: str | None, options: CommitOptions | None = None) -> Change:
    """Turn hand edits of knobs.toml into entries, one per changed knob, in one commit."""
    options = options or CommitOptions()
    with repo_lock(project):
        catalog, _ = _context(project, change=False)
        reason = _reason(reason, "record")
        drift = unexplained_edits(project)
        if not drift:
            raise UserError(f"{project.rel(project.knobs_path)}: no hand edits to record (it matches the changelog)")
        entries = []
        for role, name, old, new in drift:
            knob = catalog.for_role(name, role)
            if knob.secret and new is not None:
                raise UserError(f"{project.rel(project.knobs_path)}: [{role}] {name} is a secret; use `knobkeeper set` so its value stays out of git")
            entries.append(_new_entry(project, action="record", knob=name, **_where(role), reason=reason,
                                      **_before(project, knob, role, old), new=new))
        return _write(project, catalog, entries, project.knobs_path.read_text(), options)


def import_srtctl(project: Project, recipe_path: str | Path, *, commit: bool = True, **options):
    """`knobkeeper import srtctl`: write inventory/<name>.py and the recipe's knobs (one entry each)
    in one commit; `options` as deploy.slurm.srtctl.prepare_import takes them. Returns its Imported."""
    # Lazy: the recipe reader (PyYAML) is start-up cost every other command would pay.
    from knobkeeper.deploy.slurm.srtctl import prepare_import

    imported, target, text = prepare_import(project, recipe_path, **options)
    name = Path(recipe_path).name
    change = set_knobs(project, imported.knobs, f"imported from the srtctl recipe {name}", extra_files={target: text},
                       summary=f"import srtctl recipe {name} as {imported.inventory}", no_commit=not commit)
    imported.commit = change.commit
    return imported
