"""Changelog entries (changelog/entries/<stamp>-<id>.toml): one TOML file per knob change.

An entry is immutable once committed. Fields: id, time (UTC), author, action
(set | unset | revert | restore | record), knob, role, stack (absent: the unnamed stack, as in every
one-stack repo), old, new (absent = unset; a secret's values are fingerprints), reason, and links:
reverts, restores, incident, hypothesis, evidence. `scope` ("decode", "vllm.decode") is the
knobs.toml table it changes: replay, provenance and history key on it.

`old` is what the role ran before the change. Where knobs.toml declared no value, that is what the
stack's inventories run by their data `knob_defaults`, and `old_from` says so: `old` is then the
inventories' value, not a declared one (a revert of the entry removes the declaration again), e.g.

    old = "1"
    old_from = "inventory default: inventory/local_vllm.py"

or, when the stack's inventories run different values, no `old` and
`old_from = "inventory defaults differ: 1 in inventory/local_vllm.py, engine default in ..."`.
`shown_old` is how every command and the review show it.

The ORDER of entries is the order of history (see order.py): the commit that brought each file
into HEAD's first-parent line, a merged branch's entries where it was merged, in the branch's
own order. Entries added by one commit, and entries not committed yet (last), keep file-name
order. The stamp in `time` is for display
only: an author's clock can be wrong and a branch can merge after newer work.

Parsed entries and the commit order are cached in .git/knobkeeper/ (see filecache.py); the files
and git stay the truth.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

import tomlkit

from knobkeeper import fmt, timeutil

from knobkeeper.changelog.filecache import find_one, load_folder, plain_file
from knobkeeper.changelog.order import commit_order
from knobkeeper.changelog.store import settle
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import Value
from knobkeeper.knobs.values import scope
from knobkeeper.project import Project
from knobkeeper.tomlio import read_toml
from knobkeeper.timeutil import file_stem, id_from_stem, iso, parse_time

ACTIONS = ("set", "unset", "revert", "restore", "record")


@dataclass
class Entry:
    id: str
    time: str
    author: str
    action: str
    knob: str
    role: str
    reason: str
    old: Value | None = None
    new: Value | None = None
    reverts: str | None = None
    restores: str | None = None
    incident: str | None = None
    hypothesis: str | None = None
    evidence: list[str] = field(default_factory=list)
    refutes: str | None = None  # a restore that records the revert it restores was refuted
    stack: str | None = None  # None: the unnamed stack
    old_from: str | None = None  # `old` was not declared: the inventories' knob_defaults (module docstring)

    @property
    def scope(self) -> str:
        return scope(self.stack, self.role)

    @property
    def moment(self) -> datetime:
        return parse_time(self.time)

    @property
    def stem(self) -> str:
        return file_stem(self.moment, self.id)

    def to_toml(self) -> str:
        doc = tomlkit.document()
        for key, value in asdict(self).items():
            if value is None or value == []:
                continue
            doc[key] = value
        return tomlkit.dumps(doc)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != []}


def shown_old(entry: Entry, display: Callable[[Any], str] = fmt.value) -> str:
    """The entry's old value as people read it: `512`, `(unset)`, `1 (inventory default:
    inventory/local_vllm.py)` or `(unset; inventory defaults differ: ...)`. `display` shows a value
    (a catalog knob's display keeps a secret a fingerprint)."""
    if entry.old_from is None:
        return display(entry.old)
    if entry.old is None:
        return f"(unset; {entry.old_from})"
    return f"{display(entry.old)} ({entry.old_from})"


def entry_path(project: Project, entry: Entry) -> Path:
    return project.entries_dir / f"{entry.stem}.toml"


_TEXT_FIELDS = ("id", "author", "action", "knob", "role", "reason")
_LINK_FIELDS = ("reverts", "restores", "incident", "hypothesis", "refutes")
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _from_dict(path: Path, data: dict[str, Any]) -> Entry:
    missing = [k for k in ("id", "time", "author", "action", "knob", "role", "reason") if k not in data]
    if missing:
        raise UserError(f"{path}: missing field {missing[0]!r} (an entry needs id, time, author, action, knob, role, reason)")
    known = set(Entry.__dataclass_fields__)
    unknown = [k for k in data if k not in known]
    if unknown:
        raise UserError(f"{path}: unknown field {unknown[0]!r}")
    for key in _TEXT_FIELDS:
        if not isinstance(data[key], str) or not data[key].strip():
            raise UserError(f"{path}: {key}: expected a non-empty string")
    for key in (*_LINK_FIELDS, "old_from"):
        if key in data and not isinstance(data[key], str):
            raise UserError(f"{path}: {key}: expected a string (an entry id or text)")
    if "stack" in data and (not isinstance(data["stack"], str) or not _NAME.fullmatch(data["stack"])):
        raise UserError(f"{path}: stack: expected a stack name ([A-Za-z0-9_-])")
    if "." in data["role"]:
        raise UserError(f"{path}: role = {data['role']!r}: a role name holds no '.' (the stack goes in `stack`)")
    if not isinstance(data["time"], str):
        raise UserError(f"{path}: time: expected an ISO 8601 UTC time string, e.g. 2026-11-29T16:47:37.123456Z")
    try:
        parse_time(data["time"])
    except ValueError as exc:
        raise UserError(f"{path}: time: {exc}") from None
    for key in ("old", "new"):
        if key in data and (isinstance(data[key], (dict, list)) or not isinstance(data[key], (int, float, bool, str))):
            raise UserError(f"{path}: {key}: expected a value (integer, number, true/false or string)")
    evidence = data.get("evidence", [])
    if not isinstance(evidence, list) or not all(isinstance(x, str) for x in evidence):
        raise UserError(f"{path}: evidence: expected a list of evidence id strings")
    if data["action"] not in ACTIONS:
        raise UserError(f"{path}: action = {data['action']!r}: expected one of {', '.join(ACTIONS)}")
    if id_from_stem(path.stem) != data["id"]:
        raise UserError(f"{path}: id = {data['id']!r} does not match the file name")
    return Entry(**data)


def parse_entry_file(path: Path) -> Entry:
    return _from_dict(path, read_toml(plain_file(path)))


def load_entries(project: Project) -> list[Entry]:
    """Every entry, in history order (see the module docstring)."""
    settle(project)
    parsed = load_folder(project.entries_dir, project.private_dir / "entries.json",
                         lambda path: parse_entry_file(path).to_json())
    return in_history_order(project, [Entry(**data) for data in parsed])


def in_history_order(project: Project, entries: Iterable[Entry]) -> list[Entry]:
    """`entries` sorted by the commit that added each (uncommitted ones last); ties by file name.

    For readers that parse entry files themselves (check): replay() needs this order."""
    order = commit_order(project)
    last = len(order)
    by_name = sorted(entries, key=lambda e: e.stem)
    return sorted(by_name, key=lambda e: order.get(e.id, last))  # stable: ties keep file-name order


def find_entry(project: Project, ident: str, entries: Iterable[Entry] | None = None) -> Entry:
    """By id or unique id prefix (at least 4 characters)."""
    if entries is None:
        settle(project)
    return find_one(ident, "entry", project.entries_dir, "knobkeeper log", parse_entry_file, entries,
                    project.rel(project.entries_dir))


def history(entries: Iterable[Entry], key: str, knob: str) -> list[Entry]:
    """The entries of `knob` in scope `key` ("decode", "vllm.decode"), in history order."""
    return [e for e in entries if e.scope == key and e.knob == knob]


def replay(entries: Iterable[Entry]) -> dict[str, dict[str, Value]]:
    """The declared state the entries explain ({scope: {knob: value}}): each entry's `new` in order."""
    state: dict[str, dict[str, Value]] = {}
    for entry in entries:
        role = state.setdefault(entry.scope, {})
        if entry.new is None:
            role.pop(entry.knob, None)
        else:
            role[entry.knob] = entry.new
    return state


def latest_by_knob(entries: Iterable[Entry]) -> dict[tuple[str, str], Entry]:
    """(scope, knob) -> the entry that last changed it: the provenance a rendered file names."""
    latest: dict[tuple[str, str], Entry] = {}
    for entry in entries:
        latest[(entry.scope, entry.knob)] = entry
    return latest


def new_entry_time() -> str:
    return iso(timeutil.utcnow())   # through the module: a test sets the clock back there
