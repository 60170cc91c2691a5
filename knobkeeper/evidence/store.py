"""Evidence files: build a doc (gated, judged), validate, write + commit, load by id, list,
summarise, verify.

Files: changelog/evidence/<UTC stamp>-<id>.json, raw source files in changelog/evidence/<stem>/.
This module is THE evidence reader: other parts use `paths`, `find`, `load`, `list_all`,
`gains(doc)` (the one place that says which levels count, and with which verdict),
`summary_line(doc)` and `verify(doc)` (the stored judgement recomputed from the runs).
Ids are literal hex prefixes, never patterns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

from knobkeeper import fmt, gitio
from knobkeeper.changelog.store import Message, commit_change
from knobkeeper.errors import UserError
from knobkeeper.evidence import judge as J
from knobkeeper.evidence import validity as V
from knobkeeper.evidence.schema import SCHEMA, SCHEMA_1, validate
from knobkeeper.project import Project
from knobkeeper.timeutil import file_stem, iso, new_id, utcnow

METRIC = "output_tokens_per_s"
ACTIONABLE = ("better", "worse")


# ---------------------------------------------------------------- building

def empty_setup() -> dict[str, Any]:
    return {"inventory": None, "git_sha": None, "engine": "unknown", "engine_version": None, "model": None,
            "device": None, "workload": {"api": None, "input_len": None, "output_len": None,
                                         "requests_per_run": None, "duration_s": None}}


def build_doc(*, knob: str, role: str, arms: dict[str, dict], runs: list[dict], setup: dict | None = None,
              source: dict | None = None, metric: str = METRIC, ident: str | None = None,
              created: str | None = None, extra: dict | None = None, notes: list[str] | None = None,
              sequential: dict | None = None, keep_invalid: bool = False,
              judge_options: dict | None = None) -> dict[str, Any]:
    """A complete evidence doc: validity gates, judgement and anomalies computed from `runs`.

    `notes`: file-level validity notes (duplicates counted once, an unverified knob);
    `sequential`: the stopping rule and looks of a sequential `ab run`; `judge_options`: the
    judgement's parameters other than its defaults (a canary's {"unit_noise", "alpha"}), kept in the
    doc so that `verify` judges the runs the same way. A doc without a valid level is refused
    (UserError) unless `keep_invalid`.
    """
    full_setup = empty_setup()
    for key, value in (setup or {}).items():
        if key == "workload" and isinstance(value, dict):
            full_setup["workload"].update(value)
        else:
            full_setup[key] = value
    runs = sorted(runs, key=lambda r: (r["concurrency"], r["arm"], r["repeat"]))
    doc = {
        "schema": SCHEMA,
        "id": ident or new_id(),
        "created": created or iso(utcnow()),
        "knob": knob,
        "role": role,
        "metric": metric,
        "arms": arms,
        "setup": full_setup,
        "runs": runs,
        **({"sequential": sequential} if sequential else {}),
        **({"judge_options": dict(judge_options)} if judge_options else {}),
        "source": {"tool": "knobkeeper", "raw_files": [], "format": None, **(source or {})},
        **(extra or {}),
    }
    doc = _judged(doc, list(notes or []))
    problems = validate(doc)
    if problems:
        raise UserError(f"evidence {doc['id']}: {problems[0]}")
    if not keep_invalid and not any(lv["valid"] for lv in doc["validity"]["levels"]):
        first = next((r for lv in doc["validity"]["levels"] for r in lv["reasons"]), "no levels")
        raise UserError(f"evidence for {knob}: no valid level (@{doc['validity']['levels'][0]['concurrency']}: "
                        f"{first}); nothing written (--keep-invalid keeps it, shown as invalid)"
                        if doc["validity"]["levels"] else f"evidence for {knob}: no runs; nothing written")
    return doc


def _judged(doc: dict, notes: list[str]) -> dict:
    """`doc` with validity, judgement and anomalies (re)computed from its runs."""
    validity, invalid = V.assess(doc["runs"], doc["metric"])
    validity["reasons"] = notes + [n for n in V.knob_note(doc["runs"]) if n not in notes]
    valid_runs = [r for r in doc["runs"] if int(r["concurrency"]) not in invalid]
    out = {k: v for k, v in doc.items() if k not in ("judgement", "anomalies", "validity")}
    out["schema"] = SCHEMA
    options = doc.get("judge_options") or {}
    out["judgement"] = J.judge(doc["runs"], doc["metric"], alpha=float(options.get("alpha", J.ALPHA)), invalid=invalid,
                               sequential=doc.get("sequential"), unit_noise=float(options.get("unit_noise") or 0.0))
    out["anomalies"] = J.anomalies(valid_runs, doc["metric"])
    out["validity"] = validity
    return out


def rejudge(doc: dict) -> dict:
    """The same doc judged by today's method (schema 2), its file-level notes kept."""
    notes = [n for n in (doc.get("validity") or {}).get("reasons", []) if not n.startswith("knob value unverified")]
    return _judged(doc, notes)


def _stored_judgement(doc: dict) -> tuple[dict, list[dict]]:
    """(the judgement the doc's runs give by the doc's own schema, anomalies)."""
    if doc.get("schema") == SCHEMA_1:
        judgement = J.judge(doc["runs"], doc["metric"], adjust=False)
        return judgement, J.anomalies(doc["runs"], doc["metric"])
    again = _judged(doc, [])
    return again["judgement"], again["anomalies"]


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


def verify(doc: dict) -> list[str]:
    """Every way the stored judgement departs from what its runs give, and every NaN.

    Recomputes the validity gates, the judgement (schema 1: per level, unadjusted; schema 2:
    the family, the guards and the sequential looks recorded) and compares verdict, effect, CI,
    raw and adjusted p per level and guard. A judgement that claims nothing (the kernels
    benchmark's raw timings: no levels) has nothing to contradict.
    """
    problems = _nans(doc)
    if problems:
        return problems
    stored = doc["judgement"]
    if not stored.get("levels"):
        return []
    try:
        fresh, _ = _stored_judgement(doc)
    except (KeyError, TypeError, ValueError) as exc:
        return [f"runs: cannot be judged ({type(exc).__name__}: {exc})"]
    problems += _compare_rows(stored["levels"], fresh["levels"], lambda lv: lv.get("concurrency"),
                              lambda k: f"at {k}")
    if doc.get("schema") != SCHEMA_1:
        problems += _compare_rows(stored.get("guards", []), fresh.get("guards", []),
                                  lambda g: (g.get("concurrency"), g.get("metric")), lambda k: f"for {k[1]} at {k[0]}")
    return problems


def _compare_rows(stored: list[dict], fresh: list[dict], key, where) -> list[str]:
    """Mismatches between stored and recomputed rows (levels or guards), matched by `key`."""
    fresh_rows = {key(r): r for r in fresh}
    stored_rows = {key(r): r for r in stored}
    out = []
    for k in sorted(set(fresh_rows) | set(stored_rows), key=str):
        s, f = stored_rows.get(k), fresh_rows.get(k)
        if s is None or f is None:
            out.append(f"{where(k)}: {'stored but not judgeable from the runs' if f is None else 'judgeable from the runs but not stored'}")
            continue
        out += _compare_row(where(k), s, f)
        if "regression" in f and bool(s.get("regression")) != f["regression"]:
            out.append(f"stored regression={s.get('regression')} {where(k)} but the runs give {f['regression']}")
    return out


def _compare_row(where: str, s: dict, f: dict) -> list[str]:
    if s.get("verdict") != f["verdict"]:
        ci = (f"CI {fmt.pct(f['ci_low'])}..{fmt.pct(f['ci_high'])}" if f.get("ci_low") is not None
              else f"effect {fmt.pct(f.get('effect'))}")
        return [f"stored verdict {s.get('verdict')} {where} but the runs give {f['verdict']}, {ci}"]
    out = []
    for field in ("effect", "ci_low", "ci_high", "p_value", "p_adjusted"):
        if field in s and not _close(s.get(field), f.get(field)):
            show = fmt.p_value if field.startswith("p_") else fmt.pct
            out.append(f"stored {field} {show(s.get(field))} {where} but the runs give {show(f.get(field))}")
    return out


# ---------------------------------------------------------------- writing

def commit_summary(doc: dict) -> str:
    """`evidence: KNOB=512 on decode (+12.8% @64, +5.7% @96)` — the commit's summary line."""
    cand = doc["arms"]["B"]["knobs"].get(doc["knob"])
    levels = [g for g in gains(doc) if g["verdict"] in ACTIONABLE]
    if levels:
        what = ", ".join(f"{fmt.pct(g['effect'])} @{g['concurrency']}" for g in levels)
    else:
        verdicts = sorted({lv["verdict"] for lv in doc["judgement"]["levels"]})
        what = ", ".join(verdicts) or "no levels"
    regressions = [g for g in doc["judgement"].get("guards", []) if g.get("regression")]
    if regressions:
        what += ", but " + ", ".join(f"{_guard_label(g)} {fmt.pct(g['effect'], 0)} @{g['concurrency']}"
                                     for g in regressions)
    canary = doc.get("canary") or {}
    if canary.get("verdict") == "worse":   # the errors test is the canary's, outside the judgement
        errors = [f.split(" (p ")[0] for f in canary.get("failed_guards") or [] if f.startswith("errors")]
        what += f"; canary worse{': ' + errors[0] if errors else ''}{', rolled back' if canary.get('rolled_back') else ''}"
    return f"evidence: {doc['knob']}={fmt.value(cand)} on {doc['role']} ({what})"


def write(project: Project, doc: dict, raw_files: Iterable[tuple[str, Path | bytes]] = (),
          *, no_commit: bool = False) -> Path:
    """Write the doc (+ raw files beside it) and commit exactly them; returns the JSON path.

    `raw_files`: (name, source path or bytes) pairs; they land in changelog/evidence/<stem>/name
    and `source.raw_files` lists them relative to the repo root.
    """
    from knobkeeper.timeutil import parse_time

    stem = file_stem(parse_time(doc["created"]), doc["id"])
    path = project.evidence_dir / f"{stem}.json"
    files: dict[Path, str | bytes] = {}
    rels = []
    for name, content in raw_files:
        target = project.evidence_dir / stem / name
        files[target] = content if isinstance(content, bytes) else Path(content).read_bytes()
        rels.append(project.rel(target))
    doc = {**doc, "source": {**doc["source"], "raw_files": rels or doc["source"].get("raw_files", [])}}
    problems = validate(doc)
    if problems:
        raise UserError(f"evidence {doc['id']}: {problems[0]}")
    files[path] = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    trailers = [("Evidence", doc["id"]), ("Knob", doc["knob"]), ("Role", doc["role"])]
    commit_change(project, files, Message(commit_summary(doc), summary_line(doc), trailers), no_commit=no_commit)
    return path


def git_sha(project: Project) -> str | None:
    return gitio.head_sha(project.root)


# ---------------------------------------------------------------- reading

def paths(project: Project) -> list[Path]:
    """Every evidence file, oldest first."""
    if not project.evidence_dir.is_dir():
        return []
    return sorted(p for p in project.evidence_dir.glob("*.json") if not p.name.startswith("."))


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


def load(project: Project, ident: str) -> dict:
    """The evidence doc with id `ident` (or a unique prefix of it)."""
    path = find(project, ident)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{project.rel(path)}: not JSON ({exc.msg} at line {exc.lineno})") from None
    problems = validate(doc)
    if problems:
        raise UserError(f"{project.rel(path)}: {problems[0]}")
    return doc


def list_all(project: Project) -> list[dict]:
    """One row per evidence file: id, created, knob, role, candidate value, summary."""
    rows = []
    for path in paths(project):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if validate(doc):
            continue
        rows.append({"id": doc["id"], "created": doc["created"], "knob": doc["knob"], "role": doc["role"],
                     "baseline": doc["arms"]["A"]["knobs"].get(doc["knob"]),
                     "candidate": doc["arms"]["B"]["knobs"].get(doc["knob"]),
                     "summary": summary_line(doc), "path": project.rel(path)})
    return rows


# ---------------------------------------------------------------- summaries for other parts

def adjusted(doc: dict) -> bool:
    """Whether the doc's verdicts are family-wise adjusted (schema 2) or per level (schema 1)."""
    return doc.get("schema") != SCHEMA_1


def gains(doc: dict) -> list[dict]:
    """Per valid level: concurrency, effect, ci_low, ci_high, verdict (relative; 0.128 = +12.8%),
    p_value (raw), p_adjusted (None for schema 1), adjusted (bool), regressions (guard rows judged
    "worse" at that level). Invalid levels are left out: they count for nothing."""
    regressions: dict[Any, list[dict]] = {}
    for g in doc["judgement"].get("guards") or []:
        if g.get("regression"):
            regressions.setdefault(g["concurrency"], []).append(g)
    return [{"concurrency": lv["concurrency"], "effect": lv.get("effect"), "ci_low": lv.get("ci_low"),
             "ci_high": lv.get("ci_high"), "verdict": lv["verdict"], "p_value": lv.get("p_value"),
             "p_adjusted": lv.get("p_adjusted") if adjusted(doc) else None, "adjusted": adjusted(doc),
             "regressions": regressions.get(lv["concurrency"], [])}
            for lv in doc["judgement"]["levels"] if lv["verdict"] != "invalid"]


def _guard_label(guard: dict) -> str:
    return J.GUARDS.get(guard["metric"], (None, None, guard["metric"]))[2]


def summary_line(doc: dict) -> str:
    """`+12.8% @64 (95% CI +10.1..+15.4%, better, p_adj 0.001), ...; anomaly: A 96 < 80 (-4.1%)`.

    Schema-1 verdicts say "unadjusted"; a guard regression is named after its level
    ("..., but p99 TTFT +40% @64"); an invalid level says why."""
    parts = []
    for lv in doc["judgement"]["levels"]:
        if lv["verdict"] == "invalid":
            reasons = lv.get("invalid") or ["a validity gate failed"]
            parts.append(f"@{lv['concurrency']} invalid ({fmt.safe(reasons[0])})")
            continue
        if lv.get("ci_low") is not None:
            ci = f"95% CI {fmt.pct(lv['ci_low'])}..{fmt.pct(lv['ci_high'])}"
        else:
            ci = f"n={lv['n_a']}/{lv['n_b']}"
        extra = f", needs {lv['repeats_needed']} runs/arm" if lv.get("repeats_needed") else ""
        if not adjusted(doc):
            extra += ", unadjusted"
        elif lv.get("p_adjusted") is not None:
            extra += f", p_adj {fmt.p_value(lv['p_adjusted'])}"
        parts.append(f"{fmt.pct(lv.get('effect'))} @{lv['concurrency']} ({ci}, {lv['verdict']}{extra})")
    text = ", ".join(parts) or "no levels"
    regressions = [g for g in doc["judgement"].get("guards") or [] if g.get("regression")]
    if regressions:
        text += "; but " + ", ".join(f"{_guard_label(g)} {fmt.pct(g['effect'])} @{g['concurrency']}"
                                    for g in regressions)
    for an in doc.get("anomalies") or []:
        conf = f", {an['confidence'] * 100:.0f}% conf." if an.get("confidence") is not None else ", unconfirmed"
        text += (f"; anomaly: {an['arm']} {an['to_concurrency']} < {an['from_concurrency']} "
                 f"({fmt.pct(an['change'])}{conf})")
    return text


# ---------------------------------------------------------------- ab import

def _catalog_knob(project: Project, name: str, role: str, where: str):
    """The catalog's knob `name` for `role` (None without a catalog), or a UserError naming
    `where`: unknown knob, a role it does not apply to, or a secret (whose value must never
    reach an evidence file, a raw copy or a commit message)."""
    if not project.catalog_path.exists():
        return None
    from knobkeeper.knobs.catalog import load_catalog

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


def _knob_seen(run: dict, knob: str, value: Any) -> dict:
    """What the result file's server info (`server_env`) says the engine ran with, vs the arm."""
    env = run.pop("server_env", None)
    return V.knob_seen(value, knob, env if isinstance(env, dict) else None, "server info in the result file")


def import_files(project: Project, *, baseline: list[str], candidate: list[str], role: str,
                 knob: str | None = None, baseline_value: str | None = None, fmt: str = "auto",
                 inventory: str | None = None, engine: str | None = None, no_commit: bool = False,
                 keep_raw: bool = True, keep_invalid: bool = False) -> dict:
    """Build one evidence doc from result files of the two arms, write and commit it; returns the doc.

    The repeats of each level are the runs found for it, in the order the files are given; the
    same file given twice and the same record twice count once (noted in `validity.reasons`).
    Kernels files (already evidence docs): arm A runs come from --baseline files, arm B runs
    from --candidate files (or from the baseline files when no candidate file is given); their
    knob, role and values are checked against the catalog exactly like --knob.
    Every file is read and checked before anything is written; the validity gates apply, and a
    file set with no valid level is refused unless `keep_invalid`.
    """
    import hashlib

    from knobkeeper.evidence import importers as I

    if not baseline:
        raise UserError("--baseline: give at least one result file of the baseline arm")
    notes: list[str] = []
    digests: dict[tuple[str, str], str] = {}

    def read_arm(arm: str, files: list[str]) -> list[tuple]:
        out = []
        for p in files:
            try:
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            except OSError:
                digest = None       # I.read names the file and why
            form, imp = I.read(p, fmt)
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
    form = formats.pop()
    if form == "kernels":
        runs_a = [r for _, _, imp in read_a for r in imp.arm_runs["A"]]
        src_b = read_b or read_a
        runs_b = [r for _, _, imp in src_b for r in imp.arm_runs["B"]]
        first = read_a[0][2].doc
        knob_name = first["knob"]
        for path, _, imp in read_a + read_b:
            if imp.doc["knob"] != knob_name:
                raise UserError(f"{path}: knob: {imp.doc['knob']} (the first file tests {knob_name})")
            if imp.doc["role"] != role:
                raise UserError(f"{path}: role: {imp.doc['role']!r} (--role is {role!r})")
        arms = {"A": first["arms"]["A"], "B": src_b[0][2].doc["arms"]["B"]}
        for arm_name, source in (("A", read_a[0][0]), ("B", src_b[0][0])):
            knobs = arms[arm_name].get("knobs") or {}
            arms[arm_name] = {**arms[arm_name], "knobs": {
                name: _checked_value(project, name, value, role, f"{source}: arms.{arm_name}.knobs.{name}")
                for name, value in knobs.items()}}
        if knob is not None:
            name, value = parse_knob_spec(project, knob, role)
            if name != knob_name:
                raise UserError(f"--knob {name}: the kernels files test {knob_name}")
            arms = {"A": arms["A"], "B": {**arms["B"], "knobs": {name: value}}}
        _catalog_knob(project, knob_name, role, f"{read_a[0][0]}: knob")
        setup = dict(first.get("setup") or {})
        tool = first.get("source", {}).get("tool") or "knobkeeper-kernels bench"
    else:
        if not candidate:
            raise UserError("--candidate: give at least one result file of the candidate arm")
        if knob is None:
            raise UserError("--knob: required (KNOB=VALUE, the candidate arm's value)")
        knob_name, value = parse_knob_spec(project, knob, role)
        base_value = None
        if baseline_value is not None:
            _, base_value = parse_knob_spec(project, f"{knob_name}={baseline_value}", role, "--baseline-value")
        arms = {"A": {"label": "baseline", "knobs": {knob_name: base_value}},
                "B": {"label": "candidate", "knobs": {knob_name: value}}}
        runs_a = [r for _, _, imp in read_a for r in imp.runs]
        runs_b = [r for _, _, imp in read_b for r in imp.runs]
        setup = {}
        workload = {}
        for _, _, imp in read_a + read_b:
            for key in ("api", "input_len", "output_len", "requests_per_run"):
                if key in imp.setup and workload.get(key) is None:
                    workload[key] = imp.setup[key]
            if imp.setup.get("model") and not setup.get("model"):
                setup["model"] = imp.setup["model"]
        setup["workload"] = workload
        tool = read_a[0][2].tool
    if not runs_a or not runs_b:
        raise UserError(f"--{'baseline' if not runs_a else 'candidate'}: the files hold no runs of that arm")
    runs = []
    in_a = {V.record_key(r) for r in runs_a}
    for arm, arm_runs in (("A", runs_a), ("B", runs_b)):
        for r in arm_runs:
            run = {**r, "arm": arm, "repeat": 0, "concurrency": int(r["concurrency"]),
                   "errors": int(r.get("errors") or 0)}
            if arm == "B" and V.record_key(r) in in_a:
                run["same_record_as_arm_A"] = True
            if "knob_seen" not in run or "server_env" in run:
                run["knob_seen"] = _knob_seen(run, knob_name, arms[arm]["knobs"].get(knob_name))
            runs.append(run)
    runs, duplicates = V.dedupe(runs)
    notes += duplicates
    setup.setdefault("inventory", inventory)
    setup["git_sha"] = setup.get("git_sha") or git_sha(project)
    if engine:
        setup["engine"] = engine
    elif not setup.get("engine"):
        setup["engine"] = {"sglang": "sglang", "vllm": "vllm"}.get(form, "unknown")
    doc = build_doc(knob=knob_name, role=role, arms=arms, runs=runs, setup=setup,
                    source={"tool": tool, "format": form}, notes=notes, keep_invalid=keep_invalid)
    raw: list[tuple[str, Path]] = []
    if keep_raw:
        for arm, items in (("A", read_a), ("B", read_b)):
            for i, (p, _, _) in enumerate(items, 1):
                raw.append((f"{arm}-{i}-{Path(p).name}", Path(p)))
    path = write(project, doc, raw, no_commit=no_commit)
    return json.loads(path.read_text())
