"""Evidence files: build one (gated, judged), write + commit it, load it by id, list them, verify.

Files: changelog/evidence/<UTC stamp>-<id>.json, raw source files in changelog/evidence/<stem>/.
This module is THE evidence reader and writer: other parts use `paths`, `find`, `load` (an
`Evidence`, knobkeeper.evidence.model), `list_all`, `summary_line(doc)`, `gains(doc)` (the levels
that count, and with which verdict), `verify(doc)` (the stored judgement recomputed from the
runs), and `history` / `altered` (the commit that added each file, and the files that no longer
hold its bytes). Files are append-only: `write` never replaces one, `rejudge_file` writes a new
one. Ids are literal hex prefixes, never patterns.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from knobkeeper import fmt, gitio
from knobkeeper.changelog.filecache import plain_file, refusal
from knobkeeper.changelog.store import Message, commit_change
from knobkeeper.declared import Declared, declared, plain
from knobkeeper.errors import UserError
from knobkeeper.evidence import importers, judge, schema, search, validity
from knobkeeper.evidence.importers import evidence_fields
from knobkeeper.evidence.model import (
    ACTIONABLE,
    METRIC,
    SCHEMA,
    SCHEMA_1,
    Arm,
    CanaryBlock,
    Evidence,
    Gain,
    Run,
    Sequential,
    Setup,
    Source,
    SweepPlan,
    Workload,
)
from knobkeeper.evidence.schema import validate
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.pinned import check_stack
from knobkeeper.project import Project
from knobkeeper.timeutil import file_stem, iso, new_id, parse_time, utcnow

# ---------------------------------------------------------------- building

def build_doc(*, knob: str, role: str, arms: Mapping[str, Arm | Mapping], runs: Iterable[Run | Mapping],
              setup: Setup | Mapping | None = None, source: Mapping | None = None, metric: str = METRIC,
              ident: str | None = None, created: str | None = None, extra: Mapping | None = None,
              notes: list[str] | None = None, sequential: Sequential | Mapping | None = None,
              keep_invalid: bool = False, judge_options: Mapping | None = None,
              canary: CanaryBlock | Mapping | None = None) -> Evidence:
    """A complete evidence doc: validity gates, judgement and anomalies computed from `runs`.

    `notes`: file-level validity notes (duplicates counted once, an unverified knob);
    `sequential`: the stopping rule and looks of a sequential `ab run`; `judge_options`: the
    judgement's parameters other than its defaults (a canary's {"unit_noise", "alpha"}), kept in the
    doc so that `verify` judges the runs the same way; `canary`: a canary's block; `extra`: more
    top-level keys, ones the schema does not declare (kept in the doc's `extra`). A doc without a
    valid level is refused (UserError) unless `keep_invalid`.
    """
    doc = Evidence(id=ident or new_id(), created=created or iso(utcnow()), knob=knob, role=role, metric=metric,
                   arms={name: Arm.of(arm) for name, arm in arms.items()}, setup=Setup.of(setup or {}),
                   runs=sorted((Run.of(r) for r in runs), key=lambda r: (r.concurrency, r.arm, r.repeat)),
                   sequential=Sequential.of(sequential) if sequential else None,
                   judge_options=dict(judge_options) if judge_options else None,
                   source=Source.from_json({"tool": "knobkeeper", "raw_files": [], "format": None, **(source or {})}),
                   canary=CanaryBlock.of(canary) if canary is not None else None, extra=dict(extra or {}))
    _judge(doc, list(notes or []))
    problems = validate(doc)
    if problems:
        raise UserError(f"evidence {doc.id}: {problems[0]}")
    levels = doc.validity.levels
    if not keep_invalid and not any(lv.valid for lv in levels):
        first = next((r for lv in levels for r in lv.reasons), "no levels")
        raise UserError(f"evidence for {knob}: no valid level (@{levels[0].concurrency}: {first}); nothing written "
                        f"(--keep-invalid keeps it, shown as invalid)" if levels
                        else f"evidence for {knob}: no runs; nothing written")
    return doc


def _judge(doc: Evidence, notes: list[str]) -> None:
    """(Re)compute `doc`'s validity, judgement and anomalies from its runs, by today's method."""
    assessed, invalid = validity.assess(doc.runs, doc.metric)
    assessed.reasons = notes + [n for n in validity.knob_note(doc.runs) if n not in notes]
    valid_runs = [r for r in doc.runs if int(r.concurrency) not in invalid]
    options = doc.judge_options or {}
    doc.schema = SCHEMA
    doc.judgement = judge.judge(doc.runs, doc.metric, alpha=float(options.get("alpha", judge.ALPHA)), invalid=invalid,
                                sequential=doc.sequential, unit_noise=float(options.get("unit_noise") or 0.0))
    doc.anomalies = judge.anomalies(valid_runs, doc.metric)
    doc.validity = assessed


def rejudge(doc: Evidence) -> Evidence:
    """A NEW evidence doc holding `doc`'s runs judged by today's method (schema 2): a new id, its
    `rejudges` naming `doc`, everything measured (Evidence.MEASURED) and the file-level notes kept.
    `created` stays the measurement's: how old the evidence is (review's staleness) is the age of
    its runs, not of their judgement. `doc` itself is never rewritten (evidence files are
    append-only: entries cite what a file held when they were written)."""
    again = copy.deepcopy(doc)
    again.id = new_id()
    again.rejudges = doc.id
    _judge(again, [n for n in doc.validity.reasons if not n.startswith("knob value unverified")])
    return again


def _fresh_judgement(doc: Evidence) -> Evidence:
    """`doc` judged again by its own schema's method (schema 1: per level, unadjusted)."""
    if doc.schema == SCHEMA_1:
        again = copy.deepcopy(doc)
        again.judgement = judge.judge(doc.runs, doc.metric, adjust=False)
        again.anomalies = judge.anomalies(doc.runs, doc.metric)
        return again
    again = copy.deepcopy(doc)
    _judge(again, [])
    return again


def _nans(value: Any, where: str = "") -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where or '(top level)'}: {value!r} (not a finite number)"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nans(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nans(v, f"{where}[{i}]")]
    return []


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)


def verify(doc: Evidence | Mapping[str, Any]) -> list[str]:
    """Every way the stored judgement departs from what its runs give, and every NaN.

    Recomputes the validity gates, the judgement (schema 1: per level, unadjusted; schema 2:
    the family, the guards and the sequential looks recorded) and compares verdict, effect, CI,
    raw and adjusted p per level and guard. A judgement that claims nothing (the kernels
    benchmark's raw timings: no levels) has nothing to contradict.
    """
    problems = _nans(plain(doc))
    if problems:
        return problems
    try:
        stored = Evidence.of(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return [f"(top level): cannot be read ({type(exc).__name__}: {exc})"]
    if not stored.judgement.levels:
        return []
    try:
        fresh = _fresh_judgement(stored).judgement
    except (KeyError, TypeError, ValueError) as exc:
        return [f"runs: cannot be judged ({type(exc).__name__}: {exc})"]
    # A file with a family claims adjusted p-values; one without (schema 1, a hand-made file) does not.
    claims = ("effect", "ci_low", "ci_high", "p_value") + (("p_adjusted",) if stored.judgement.family else ())
    problems += _compare_rows(stored.judgement.levels, fresh.levels, lambda lv: lv.concurrency,
                              lambda k: f"at {k}", claims)
    if stored.schema != SCHEMA_1:
        problems += _compare_rows(stored.judgement.guards, fresh.guards, lambda g: (g.concurrency, g.metric),
                                  lambda k: f"for {k[1]} at {k[0]}", claims + ("p_adjusted",))
    if stored.sweep is not None:
        problems += search.verify_sweep(stored)
    return problems


def _compare_rows(stored: list, fresh: list, key, where, claims: tuple[str, ...]) -> list[str]:
    """Mismatches between stored and recomputed rows (levels or guards), matched by `key`."""
    fresh_rows = {key(r): r for r in fresh}
    stored_rows = {key(r): r for r in stored}
    out = []
    for k in sorted(set(fresh_rows) | set(stored_rows), key=str):
        s, f = stored_rows.get(k), fresh_rows.get(k)
        if s is None or f is None:
            out.append(f"{where(k)}: {'stored but not judgeable from the runs' if f is None else 'judgeable from the runs but not stored'}")
            continue
        out += _compare_row(where(k), s, f, claims)
        if hasattr(f, "regression") and bool(s.regression) != f.regression:
            out.append(f"stored regression={s.regression} {where(k)} but the runs give {f.regression}")
    return out


def _compare_row(where: str, s, f, claims: tuple[str, ...]) -> list[str]:
    if s.verdict != f.verdict:
        ci = f"CI {f.ci_text()}" if f.ci_low is not None else f"effect {fmt.pct(f.effect)}"
        return [f"stored verdict {s.verdict} {where} but the runs give {f.verdict}, {ci}"]
    out = []
    for name in dict.fromkeys(claims):
        if not _close(getattr(s, name), getattr(f, name)):
            show = fmt.p_value if name.startswith("p_") else fmt.pct
            out.append(f"stored {name} {show(getattr(s, name))} {where} but the runs give {show(getattr(f, name))}")
    return out


# ---------------------------------------------------------------- writing

def commit_summary(doc: Evidence) -> str:
    """`evidence: KNOB=512 on decode (+12.8% @64, +5.7% @96)` — the commit's summary line."""
    levels = [g for g in doc.gains() if g.verdict in ACTIONABLE]
    if levels:
        what = ", ".join(f"{fmt.pct(g.effect)} @{g.concurrency}" for g in levels)
    else:
        what = ", ".join(sorted({lv.verdict for lv in doc.judgement.levels})) or "no levels"
    regressions = doc.judgement.regressions
    if regressions:
        what += ", but " + ", ".join(f"{g.label} {fmt.pct(g.effect, 0)} @{g.concurrency}" for g in regressions)
    if doc.sweep is not None:   # the sweep's outcome first; the levels are its confirming A/B's (or the leader's)
        block = doc.sweep
        outcome = (f"pick {fmt.value(doc.candidate)}" + (" confirmed" if block.pick.confirmed else "")
                   if block.pick.adopted else block.pick.outcome)
        what = f"sweep of {len(block.plan.candidates)}: {outcome}; {what}"
    if doc.interrupted:
        what = f"interrupted by {doc.interrupted.get('by')}: {what}"
    canary = doc.canary
    if canary is not None and canary.verdict == "worse":
        # the canary's own failures, outside the judgement (its regressions are said above): the
        # candidate's death, the errors test; the first one, up to its parenthesis
        own = [f.split(" (")[0] for f in canary.failed_guards
               if not any(f.startswith(f"{g.metric} ") for g in regressions)]
        what += f"; canary worse{': ' + own[0] if own else ''}{', rolled back' if canary.rolled_back else ''}"
    return f"evidence: {doc.knob}={fmt.value(doc.candidate)} on {doc.role} ({what})"


def write(project: Project, doc: Evidence, raw_files: Iterable[tuple[str, Path | bytes]] = (),
          *, no_commit: bool = False) -> Path:
    """Write the doc (+ raw files beside it) and commit exactly them; returns the JSON path.

    `raw_files`: (name, source path or bytes) pairs; they land in changelog/evidence/<stem>/name
    and `source.raw_files` lists them relative to the repo root.
    """
    doc = Evidence.of(doc)
    stem = file_stem(parse_time(doc.created), doc.id)
    path = project.evidence_dir / f"{stem}.json"
    if path.exists() or (project.evidence_dir / stem).exists():
        raise UserError(f"{project.rel(path)}: already exists; evidence files are append-only (entries cite what "
                        f"they hold): judge its runs again with `knobkeeper ab rejudge {doc.id}`, which writes a "
                        f"new file; nothing written")
    files: dict[Path, str | bytes] = {}
    rels = []
    for name, content in raw_files:
        target = project.evidence_dir / stem / name
        files[target] = content if isinstance(content, bytes) else Path(content).read_bytes()
        rels.append(project.rel(target))
    if rels:
        doc.source.raw_files = rels
    data = doc.to_json()
    problems = validate(data)
    if problems:
        raise UserError(f"evidence {doc.id}: {problems[0]}")
    files[path] = json.dumps(data, indent=2, allow_nan=False) + "\n"
    trailers = [("Evidence", doc.id), ("Knob", doc.knob), ("Role", doc.role)]
    body = doc.summary_line()
    if doc.sweep is not None:
        trailers.append(("Plan", doc.sweep.plan.id))
    if doc.rejudges:
        trailers.append(("Rejudges", doc.rejudges))
        body = (f"The runs of evidence {doc.rejudges} judged again by today's method; that file is kept as it "
                f"was.\n\n{body}")
    commit_change(project, files, Message(commit_summary(doc), body, trailers), no_commit=no_commit)
    return path


def rejudge_file(project: Project, ident: str, *, no_commit: bool = False) -> Evidence:
    """`knobkeeper ab rejudge ID`: write and commit the re-judgement of evidence `ident` (rejudge)
    as a new file; returns it. Refused (nothing written) when today's method says what the file
    says already: a second file would only repeat it."""
    old = load(project, ident)
    again = rejudge(old)
    if [again.judgement, again.validity, again.anomalies] == [old.judgement, old.validity, old.anomalies]:
        raise UserError(f"evidence {old.id}: today's method judges its runs as the file does "
                        f"({old.summary_line()}); nothing written")
    path = write(project, again, no_commit=no_commit)
    return read(path, project.rel(path))


# ---------------------------------------------------------------- a sweep's plan

def plan_path(project: Project, plan: SweepPlan) -> Path:
    return project.plans_dir / f"{file_stem(parse_time(plan.created), plan.id)}.json"


def write_plan(project: Project, plan: SweepPlan, summary: str, *, no_commit: bool = False) -> Path:
    """Write the plan (changelog/plans/<stem>.json) and commit exactly it, before any data."""
    path = plan_path(project, plan)
    text = json.dumps(plan.to_json(), indent=2, allow_nan=False) + "\n"
    commit_change(project, {path: text}, Message(summary, "", [("Plan", plan.id), ("Knob", plan.knob),
                                                               ("Role", plan.role)]), no_commit=no_commit)
    return path


def read_plan(path: Path, where: str) -> SweepPlan:
    """The plan in the file at `path`, or UserError naming `where`."""
    try:
        data = json.loads(plain_file(path).read_text())
    except OSError as exc:
        raise UserError(f"{where}: cannot be read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    plan, problems = SweepPlan.read(data)
    if problems:
        raise UserError(f"{where}: {problems[0]}")
    return plan


# ---------------------------------------------------------------- reading

def paths(project: Project) -> list[Path]:
    """Every evidence file, oldest first."""
    if not project.evidence_dir.is_dir() or refusal(project.evidence_dir, project.root):
        return []   # a link is no evidence (check and report name it: filecache.refused_files)
    return sorted(p for p in project.evidence_dir.glob("*.json")
                  if not p.name.startswith(".") and not refusal(p, project.root))


def find(project: Project, ident: str) -> Path:
    """The evidence file whose id is `ident` or starts with it (unique), or UserError."""
    ident = ident.strip().lower()
    if not ident or any(c not in "0123456789abcdef" for c in ident):
        raise UserError(f"evidence id {ident!r}: expected hex digits (see `knobkeeper ab list`)")
    hits = [p for p in paths(project) if p.stem.rsplit("-", 1)[-1].startswith(ident)]
    if not hits:
        raise UserError(f"evidence {ident!r}: no such evidence in {project.rel(project.evidence_dir)} "
                        f"(see `knobkeeper ab list`)")
    if len(hits) > 1:
        ids = ", ".join(p.stem.rsplit("-", 1)[-1] for p in hits[:5])
        raise UserError(f"evidence {ident!r}: ambiguous prefix, matches {ids}; give more digits")
    return hits[0]


def read(path: Path, where: str) -> Evidence:
    """The evidence in the file at `path` (validated), or UserError naming `where`."""
    try:
        data = json.loads(plain_file(path).read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not JSON ({exc.msg} at line {exc.lineno})") from None
    doc, problems = schema.read(data)
    if problems:
        raise UserError(f"{where}: {problems[0]}")
    return doc


def load(project: Project, ident: str) -> Evidence:
    """The evidence with id `ident` (or a unique prefix of it)."""
    path = find(project, ident)
    return read(path, project.rel(path))


@declared
class Listed(Declared):
    """One row of `ab list`."""

    id: str = ""
    created: str = ""
    knob: str = ""
    role: str = ""
    baseline: Any = None
    candidate: Any = None
    summary: str = ""
    path: str = ""
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)


def list_all(project: Project) -> list[Listed]:
    """One row per readable evidence file, oldest first: id, created, knob, role, the two values, summary."""
    rows = []
    for path in paths(project):
        try:
            doc = read(path, project.rel(path))
        except (OSError, UserError):
            continue
        rows.append(Listed(doc.id, doc.created, doc.knob, doc.role, doc.baseline, doc.candidate, doc.summary_line(),
                           project.rel(path)))
    return rows


# ---------------------------------------------------------------- what history holds of them
#
# Evidence files are append-only facts: entries cite a file by id for what it held when they were
# written, so a file's bytes (any number, not only its judgement) never change once committed.
# They are held immutable the way entries are: the bytes of the commit that first added each file
# (its blob) are what the file must still hold; `check` compares every file with that blob.
#
# Rejected: a digest of each file in the commit that adds it (an `Evidence-Digest:` trailer). It
# would hold only the files the store commits from now on: every evidence file already in a repo
# (schema 1 and 2), and every one committed with plain git (by hand, a script, a merge), carries no
# digest, so those would stay forgeable or need this blob comparison anyway; and the blob is the
# file's exact bytes already, kept by git, where a digest would be a second copy of that fact. Both
# trust history: a rewrite of the commit that added a file can change both the blob and a digest
# with it. That is what `check --base` sees: the base's tree still holds the old bytes.

@dataclass(frozen=True)
class Added:
    """The commit that first added a file under the evidence folder (JSON or raw file), and what it held."""

    path: str           # relative to the repo root
    commit: str
    subject: str
    blob: str           # the file's git object id in that commit


def history(project: Project) -> dict[str, Added]:
    """Every file ever committed under the evidence folder, by path: the FIRST commit that added it
    (in history order, never by clocks: a path deleted and added again keeps its first bytes), its
    summary line and its blob. One `git log` (merges read against their first parent, so a file a
    merge itself added counts too); empty outside git or without commits. A shallow clone sees
    only its own history: its oldest commit seems to add everything, as it holds it."""
    done = gitio.run(project.root, "log", "-z", "--topo-order", "--diff-merges=first-parent", "--diff-filter=A",
                     "--no-renames", "--raw", "--no-abbrev", "--format=%x01%H%x02%s", "--",
                     project.rel(project.evidence_dir))
    found: dict[str, Added] = {}
    commit = subject = ""
    tokens = done.stdout.split("\0") if done.returncode == 0 else []
    at = 0
    while at < len(tokens):
        token = tokens[at].lstrip("\n")
        if token.startswith("\1"):                                # a commit: \1SHA\2SUBJECT
            commit, _, subject = token[1:].partition("\2")
        elif token.startswith(":") and at + 1 < len(tokens):     # :MODE MODE OLD NEW A, then the path
            blob, path = token.split()[3], tokens[at + 1]
            found[path] = Added(path, commit, subject, blob)     # newest first: the last one seen is the first add
            at += 1
        at += 1
    return found


def altered(project: Project, added: Mapping[str, Added] | None = None) -> list[Added]:
    """The committed evidence files (`history`) whose file in the working tree holds other bytes
    than the commit that added them: edited since, committed or not (`git hash-object`, so the
    repository's own filters apply as `git add` would). A file no longer there is not altered
    (with --base, check names a deletion; an entry citing it names it missing); a link is refused
    elsewhere (filecache.refused_files)."""
    added = history(project) if added is None else added
    present = [a for a in added.values() if "\n" not in a.path and (project.root / a.path).is_file()
               and not refusal(project.root / a.path, project.root)]
    if not present:
        return []
    done = gitio.run(project.root, "hash-object", "--stdin-paths", input="".join(f"{a.path}\n" for a in present))
    blobs = done.stdout.split()
    if done.returncode != 0 or len(blobs) != len(present):   # one unreadable file fails the batch: one by one
        blobs = [gitio.run(project.root, "hash-object", "--", a.path).stdout.strip() for a in present]
    return [a for a, blob in zip(present, blobs) if blob != a.blob]


# ---------------------------------------------------------------- summaries for other parts

def gains(doc: Evidence) -> list[Gain]:
    """The levels that count (Evidence.gains): effect, interval, verdict, raw and adjusted p."""
    return Evidence.of(doc).gains()


def summary_line(doc: Evidence) -> str:
    """The doc's one-line judgement (Evidence.summary_line)."""
    return Evidence.of(doc).summary_line()


# ---------------------------------------------------------------- ab import

def _catalog_knob(project: Project, name: str, role: str, where: str):
    """The catalog's knob `name` for `role` (None without a catalog), or a UserError naming
    `where`: unknown knob, a role it does not apply to, or a secret (whose value must never
    reach an evidence file, a raw copy or a commit message)."""
    if not project.catalog_path.exists():
        return None

    try:
        knob = load_catalog(project.catalog_path).get(name)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    if role not in knob.roles:
        raise UserError(f"{where}: {name} does not apply to role {role!r} (roles: {', '.join(knob.roles)})")
    if knob.secret:
        raise UserError(f"{where}: {name} is a secret knob and cannot be A/B tested in evidence "
                        f"(its value would enter git); value not shown")
    return knob


def parse_knob_spec(project: Project, spec: str, role: str, option: str = "--knob") -> tuple[str, Any]:
    """`KNOB=VALUE` checked against the catalog (when the project has one)."""
    if "=" not in spec:
        raise UserError(f"{option} {fmt.safe(spec)!r}: expected KNOB=VALUE (e.g. SGLANG_SM120_MMA_TARGET_CTAS=512)")
    name, raw = spec.split("=", 1)
    name = name.strip()
    knob = _catalog_knob(project, name, role, option)
    if knob is not None:
        return name, knob.parse(raw)
    for cast in (int, float):
        try:
            return name, cast(raw)
        except ValueError:
            pass
    return name, raw


def _checked_value(project: Project, name: str, value: Any, role: str, where: str) -> Any:
    """A knob value read from a result file, checked as `--knob` checks one (None = unset)."""
    knob = _catalog_knob(project, name, role, where)
    if knob is None or value is None:
        return value
    try:
        return knob.parse(fmt.value(value))
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def _knob_seen(run: Run, knob: str, value: Any):
    """What the result file's server info (`server_env`) says the engine ran with, vs the arm."""
    env = run.extra.pop("server_env", None)
    return validity.knob_seen(value, knob, env if isinstance(env, dict) else None, "server info in the result file")


@dataclass
class _Arms:
    """What the result files of both arms say: the knob, the arms, their runs, the setup, the tool."""

    knob: str
    arms: dict[str, Arm]
    runs_a: list[dict]
    runs_b: list[dict]
    setup: Setup
    tool: str
    form: str
    notes: list[str] = field(default_factory=list)


# The setup keys a reader may report (importers.Imported.setup), beside the workload's; the tool and
# its version become Setup.bench_tool / bench_version; the rest is kept in the setup's and the
# workload's extra (the tokenizer the tool counted with, the tool's backend and request format).
_SETUP_KEYS = ("model", "served_model_name", "engine", "engine_version", "device", "tool", "tool_version",
               "tokenizer")
_WORKLOAD_KEYS = ("api", "input_len", "output_len", "dataset", "requests_per_run")
_WORKLOAD_EXTRA = ("backend", "request_format")


def import_files(project: Project, *, baseline: list[str], candidate: list[str], role: str,
                 knob: str | None = None, baseline_value: str | None = None, fmt: str = "auto",
                 inventory: str | None = None, engine: str | None = None, no_commit: bool = False,
                 keep_raw: bool = True, keep_invalid: bool = False, stack: str | None = None) -> Evidence:
    """Build one evidence doc from result files of the two arms, write and commit it; returns the doc.

    `stack`: the stack whose `role` was measured, where the repo holds more than one (setup.stack;
    None: the stack the inventories do not name). The evidence backs changes of that stack's role only.

    The repeats of each level are the runs found for it, in the order the files are given; the
    same file given twice and the same record twice count once (noted in `validity.reasons`).
    Kernels files (already evidence docs): arm A runs come from --baseline files, arm B runs
    from --candidate files (or from the baseline files when no candidate file is given); their
    knob, role and values are checked against the catalog exactly like --knob.
    Every file is read and checked before anything is written; the validity gates apply, and a
    file set with no valid level is refused unless `keep_invalid`.
    """
    if not baseline:
        raise UserError("--baseline: give at least one result file of the baseline arm")
    if stack:
        try:
            check_stack(project.inventory_dir, stack)
        except UserError as exc:
            raise UserError(f"--stack: {exc}") from None
    read_a, read_b, notes = _read_files(baseline, candidate, fmt)
    found = (_kernels_arms(project, read_a, read_b, role, knob) if read_a[0][1] == "kernels"
             else _tool_arms(project, read_a, read_b, role, knob, baseline_value))
    if not found.runs_a or not found.runs_b:
        raise UserError(f"--{'baseline' if not found.runs_a else 'candidate'}: the files hold no runs of that arm")
    runs, duplicates = validity.dedupe(_arm_runs(found))
    found.setup.inventory = found.setup.inventory or inventory
    found.setup.stack = stack or found.setup.stack
    if engine:
        found.setup.engine = engine
    doc = build_doc(knob=found.knob, role=role, arms=found.arms, runs=runs, setup=found.setup,
                    source={"tool": found.tool, "format": found.form}, notes=notes + duplicates,
                    keep_invalid=keep_invalid)
    raw: list[tuple[str, Path]] = []
    if keep_raw:
        for arm, items in (("A", read_a), ("B", read_b)):
            for i, (p, _, _) in enumerate(items, 1):
                raw.append((f"{arm}-{i}-{Path(p).name}", Path(p)))
    path = write(project, doc, raw, no_commit=no_commit)
    return read(path, project.rel(path))


def _read_files(baseline: list[str], candidate: list[str], fmt: str) -> tuple[list[tuple], list[tuple], list[str]]:
    """Every file of both arms read (path, format, importers.Imported): one tool's files only, the
    same file given twice in an arm counted once (a note says so)."""
    notes: list[str] = []
    digests: dict[tuple[str, str], str] = {}

    def read_arm(arm: str, files: list[str]) -> list[tuple]:
        out = []
        for p in files:
            try:
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            except OSError:
                digest = None       # importers.read names the file and why
            form, imp = importers.read(p, fmt)
            if digest is not None and (arm, digest) in digests:
                notes.append(f"arm {arm}: {Path(p).name} is the same file as {digests[arm, digest]}, counted once")
                continue
            if digest is not None:
                digests[arm, digest] = Path(p).name
            out.append((p, form, imp))
        return out

    read_a = read_arm("A", baseline)
    read_b = read_arm("B", candidate)
    formats = {f for _, f, _ in read_a + read_b}
    if len(formats) > 1:
        raise UserError(f"--baseline/--candidate: files of different formats ({', '.join(sorted(formats))}); "
                        f"import one tool's results at a time")
    return read_a, read_b, notes


def _kernels_arms(project: Project, read_a: list[tuple], read_b: list[tuple], role: str, knob: str | None) -> _Arms:
    """Kernels files are evidence docs already: their knob, role and arm values checked against the
    catalog like --knob; arm B from the candidate files, or from the baseline files without any."""
    src_b = read_b or read_a
    first = Evidence.from_json(read_a[0][2].doc)
    for path, _, imp in read_a + read_b:
        doc = Evidence.from_json(imp.doc)
        if doc.knob != first.knob:
            raise UserError(f"{path}: knob: {doc.knob} (the first file tests {first.knob})")
        if doc.role != role:
            raise UserError(f"{path}: role: {doc.role!r} (--role is {role!r})")
    arms = {"A": first.arms["A"], "B": Evidence.from_json(src_b[0][2].doc).arms["B"]}
    for arm_name, source in (("A", read_a[0][0]), ("B", src_b[0][0])):
        arm = arms[arm_name]
        arms[arm_name] = Arm(arm.label, {name: _checked_value(project, name, value, role,
                                                              f"{source}: arms.{arm_name}.knobs.{name}")
                                         for name, value in arm.knobs.items()}, extra=dict(arm.extra))
    if knob is not None:
        name, value = parse_knob_spec(project, knob, role)
        if name != first.knob:
            raise UserError(f"--knob {name}: the kernels files test {first.knob}")
        arms["B"] = Arm(arms["B"].label, {name: value})
    _catalog_knob(project, first.knob, role, f"{read_a[0][0]}: knob")
    said = first.setup
    setup = Setup.build(project, inventory=said.inventory, engine=said.engine, engine_version=said.engine_version,
                        model=said.model, device=said.device, bench_tool=said.bench_tool,
                        bench_version=said.bench_version, workload=said.workload, extra=said.extra)
    setup.git_sha = said.git_sha or setup.git_sha     # the commit the benchmark ran at, when it says
    return _Arms(first.knob, arms, [r for _, _, imp in read_a for r in imp.arm_runs["A"]],
                 [r for _, _, imp in src_b for r in imp.arm_runs["B"]], setup,
                 first.source.tool or "knobkeeper-kernels bench", "kernels")


def _tool_arms(project: Project, read_a: list[tuple], read_b: list[tuple], role: str, knob: str | None,
               baseline_value: str | None) -> _Arms:
    """A benchmark tool's files: the arms from --knob (and --baseline-value), the setup from what
    the files say (the first file that says each thing)."""
    if not read_b:
        raise UserError("--candidate: give at least one result file of the candidate arm")
    if knob is None:
        raise UserError("--knob: required (KNOB=VALUE, the candidate arm's value)")
    knob_name, value = parse_knob_spec(project, knob, role)
    base_value = None
    if baseline_value is not None:
        _, base_value = parse_knob_spec(project, f"{knob_name}={baseline_value}", role, "--baseline-value")
    arms = {"A": Arm("baseline", {knob_name: base_value}), "B": Arm("candidate", {knob_name: value})}
    said: dict[str, Any] = {}
    for _, _, imp in read_a + read_b:
        for key in _SETUP_KEYS + _WORKLOAD_KEYS + _WORKLOAD_EXTRA:
            if imp.setup.get(key) is not None and said.get(key) is None:
                said[key] = imp.setup[key]
    form, tool = read_a[0][1], read_a[0][2].tool
    engine = said.get("engine") or {"sglang": "sglang", "vllm": "vllm"}.get(form, "unknown")
    setup = Setup.build(project, engine=engine, engine_version=said.get("engine_version"), model=said.get("model"),
                        served_model_name=said.get("served_model_name"), device=said.get("device"),
                        bench_tool=said.get("tool") or tool, bench_version=said.get("tool_version"),
                        workload=setup_workload(said),
                        extra={"tokenizer": said["tokenizer"]} if said.get("tokenizer") else None)
    return _Arms(knob_name, arms, [r for _, _, imp in read_a for r in imp.runs],
                 [r for _, _, imp in read_b for r in imp.runs], setup, tool, form)


def setup_workload(said: Mapping[str, Any]) -> Workload:
    """The workload a reader's setup describes (importers.Imported.setup)."""
    return Workload(**{k: said.get(k) for k in _WORKLOAD_KEYS},
                    extra={k: said[k] for k in _WORKLOAD_EXTRA if said.get(k) is not None})


def _arm_runs(found: _Arms) -> list[Run]:
    """Both arms' runs as evidence runs: arm and level set, a candidate record identical to a
    baseline one flagged, and what the engine ran with taken from the file's server info."""
    runs = []
    in_a = {validity.record_key(r) for r in found.runs_a}
    for arm, arm_runs in (("A", found.runs_a), ("B", found.runs_b)):
        for r in arm_runs:
            run = Run.from_json({**evidence_fields(r), "arm": arm, "repeat": 0, "concurrency": int(r["concurrency"])})
            if arm == "B" and validity.record_key(r) in in_a:
                run.extra["same_record_as_arm_A"] = True
            if run.knob_seen is None or "server_env" in run.extra:
                run.knob_seen = _knob_seen(run, found.knob, found.arms[arm].knobs.get(found.knob))
            runs.append(run)
    return runs
