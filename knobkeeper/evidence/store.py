"""Evidence files: build a doc (judged), validate, write + commit, load by id, list, summarise.

Files: changelog/evidence/<UTC stamp>-<id>.json, raw source files in changelog/evidence/<stem>/.
Other parts use `load(project, id)`, `summary_line(doc)` and `gains(doc)`.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any, Iterable

from knobkeeper.changelog.store import Message, commit_change
from knobkeeper.errors import UserError
from knobkeeper.evidence import judge as J
from knobkeeper.evidence.schema import SCHEMA, validate
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
              created: str | None = None, extra: dict | None = None) -> dict[str, Any]:
    """A complete evidence doc: judgement and anomalies computed from `runs`, validated."""
    full_setup = empty_setup()
    for key, value in (setup or {}).items():
        if key == "workload" and isinstance(value, dict):
            full_setup["workload"].update(value)
        else:
            full_setup[key] = value
    doc = {
        "schema": SCHEMA,
        "id": ident or new_id(),
        "created": created or iso(utcnow()),
        "knob": knob,
        "role": role,
        "metric": metric,
        "arms": arms,
        "setup": full_setup,
        "runs": sorted(runs, key=lambda r: (r["concurrency"], r["arm"], r["repeat"])),
        "judgement": J.judge(runs, metric),
        "anomalies": J.anomalies(runs, metric),
        "source": {"tool": "knobkeeper", "raw_files": [], "format": None, **(source or {})},
        **(extra or {}),
    }
    problems = validate(doc)
    if problems:
        raise UserError(f"evidence {doc['id']}: {problems[0]}")
    return doc


def rejudge(doc: dict) -> dict:
    """The same doc with judgement and anomalies recomputed (after a method change)."""
    return {**doc, "judgement": J.judge(doc["runs"], doc["metric"]), "anomalies": J.anomalies(doc["runs"], doc["metric"])}


# ---------------------------------------------------------------- writing

def _fmt_value(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def commit_summary(doc: dict) -> str:
    """`evidence: KNOB=512 on decode (+12.8% @64, +5.7% @96)` — the commit's summary line."""
    cand = doc["arms"]["B"]["knobs"].get(doc["knob"])
    levels = [lv for lv in doc["judgement"]["levels"] if lv["verdict"] in ACTIONABLE]
    if levels:
        what = ", ".join(f"{J.fmt_pct(lv['effect'])} @{lv['concurrency']}" for lv in levels)
    else:
        verdicts = sorted({lv["verdict"] for lv in doc["judgement"]["levels"]})
        what = ", ".join(verdicts) or "no levels"
    return f"evidence: {doc['knob']}={_fmt_value(cand)} on {doc['role']} ({what})"


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
    done = subprocess.run(["git", "-C", str(project.root), "rev-parse", "-q", "--verify", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or None


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

def gains(doc: dict) -> list[dict]:
    """Per level: concurrency, effect, ci_low, ci_high, verdict (relative; 0.128 = +12.8%)."""
    return [{"concurrency": lv["concurrency"], "effect": lv.get("effect"), "ci_low": lv.get("ci_low"),
             "ci_high": lv.get("ci_high"), "verdict": lv["verdict"]} for lv in doc["judgement"]["levels"]]


def summary_line(doc: dict) -> str:
    """`+12.8% @64 (95% CI +10.1..+15.4%, better), +5.7% @96 (...); anomaly: A 96 < 80 (-4.1%)`."""
    parts = []
    for lv in doc["judgement"]["levels"]:
        if lv.get("ci_low") is not None:
            ci = f"95% CI {J.fmt_pct(lv['ci_low'])}..{J.fmt_pct(lv['ci_high'])}"
        else:
            ci = f"n={lv['n_a']}/{lv['n_b']}"
        extra = f", needs {lv['repeats_needed']} runs/arm" if lv.get("repeats_needed") else ""
        parts.append(f"{J.fmt_pct(lv.get('effect'))} @{lv['concurrency']} ({ci}, {lv['verdict']}{extra})")
    text = ", ".join(parts) or "no levels"
    for an in doc.get("anomalies") or []:
        conf = f", {an['confidence'] * 100:.0f}% conf." if an.get("confidence") is not None else ", unconfirmed"
        text += (f"; anomaly: {an['arm']} {an['to_concurrency']} < {an['from_concurrency']} "
                 f"({J.fmt_pct(an['change'])}{conf})")
    return text


# ---------------------------------------------------------------- ab import

def parse_knob_spec(project: Project, spec: str, role: str, option: str = "--knob") -> tuple[str, Any]:
    """`KNOB=VALUE` checked against the catalog (when the project has one)."""
    if "=" not in spec:
        raise UserError(f"{option} {spec!r}: expected KNOB=VALUE (e.g. SGLANG_SM120_MMA_TARGET_CTAS=512)")
    name, raw = spec.split("=", 1)
    name = name.strip()
    if project.catalog_path.exists():
        from knobkeeper.knobs.catalog import load_catalog

        knob = load_catalog(project.catalog_path).get(name)
        if role not in knob.roles:
            raise UserError(f"{option} {name}: does not apply to role {role!r} (roles: {', '.join(knob.roles)})")
        if knob.secret:
            raise UserError(f"{option} {name}: a secret knob cannot be A/B tested in evidence (its value would enter git)")
        return name, knob.parse(raw)
    for cast in (int, float):
        try:
            return name, cast(raw)
        except ValueError:
            pass
    return name, raw


def import_files(project: Project, *, baseline: list[str], candidate: list[str], role: str,
                 knob: str | None = None, baseline_value: str | None = None, fmt: str = "auto",
                 inventory: str | None = None, engine: str | None = None, no_commit: bool = False,
                 keep_raw: bool = True) -> dict:
    """Build one evidence doc from result files of the two arms, write and commit it; returns the doc.

    The repeats of each level are the runs found for it, in the order the files are given.
    Kernels files (already evidence docs): arm A runs come from --baseline files, arm B runs
    from --candidate files (or from the baseline files when no candidate file is given).
    Every file is read and checked before anything is written.
    """
    from knobkeeper.evidence import importers as I

    if not baseline:
        raise UserError("--baseline: give at least one result file of the baseline arm")
    read_a = [(p, *I.read(p, fmt)) for p in baseline]
    read_b = [(p, *I.read(p, fmt)) for p in candidate]
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
        arms = {"A": first["arms"]["A"], "B": src_b[0][2].doc["arms"]["B"]}
        if knob is not None:
            name, value = parse_knob_spec(project, knob, role)
            if name != knob_name:
                raise UserError(f"--knob {name}: the kernels files test {knob_name}")
            arms = {"A": arms["A"], "B": {**arms["B"], "knobs": {name: value}}}
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
    for arm, arm_runs in (("A", runs_a), ("B", runs_b)):
        seen: dict[int, int] = {}
        for r in arm_runs:
            conc = int(r["concurrency"])
            seen[conc] = seen.get(conc, 0) + 1
            runs.append({**r, "arm": arm, "repeat": seen[conc], "concurrency": conc,
                         "errors": int(r.get("errors") or 0)})
    levels_a = {r["concurrency"] for r in runs if r["arm"] == "A"}
    levels_b = {r["concurrency"] for r in runs if r["arm"] == "B"}
    if not levels_a & levels_b:
        raise UserError(f"--baseline/--candidate: no concurrency level in common "
                        f"(baseline {sorted(levels_a)}, candidate {sorted(levels_b)})")
    setup.setdefault("inventory", inventory)
    setup["git_sha"] = setup.get("git_sha") or git_sha(project)
    if engine:
        setup["engine"] = engine
    elif not setup.get("engine"):
        setup["engine"] = {"sglang": "sglang", "vllm": "vllm"}.get(form, "unknown")
    doc = build_doc(knob=knob_name, role=role, arms=arms, runs=runs, setup=setup,
                    source={"tool": tool, "format": form})
    raw: list[tuple[str, Path]] = []
    if keep_raw:
        for arm, items in (("A", read_a), ("B", read_b)):
            for i, (p, _, _) in enumerate(items, 1):
                raw.append((f"{arm}-{i}-{Path(p).name}", Path(p)))
    path = write(project, doc, raw, no_commit=no_commit)
    return json.loads(path.read_text())


# ---------------------------------------------------------------- verification (interim: the review helper's
# minimal version for `check`; the evidence helper's verify replaces it)

def _non_finite(value: Any, where: str) -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where} is {value}"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{where}[{i}]")]
    return []


def verify(doc: dict) -> list[str]:
    """Every way the stored judgement departs from the one its runs give (verdict and effect per
    level, recomputed with the judge), and every NaN or infinity anywhere in the doc."""
    from knobkeeper import fmt

    problems = _non_finite(doc, "")
    if problems:
        return problems
    judgement = doc.get("judgement") or {}
    try:
        again = J.judge(doc["runs"], doc["metric"], judgement.get("mde", J.MDE), judgement.get("alpha", J.ALPHA))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return [f"runs: cannot be judged ({exc})"]
    stored = {lv.get("concurrency"): lv for lv in judgement.get("levels") or []}
    fresh = {lv["concurrency"]: lv for lv in again["levels"]}
    for conc in sorted(set(stored) | set(fresh), key=str):
        have, want = stored.get(conc), fresh.get(conc)
        if have is None or want is None:
            problems.append(f"level {conc}: {'missing from the judgement' if have is None else 'has no runs'}")
            continue
        effect_ok = (have.get("effect") is None and want["effect"] is None) or (
            have.get("effect") is not None and want["effect"] is not None
            and math.isclose(have["effect"], want["effect"], rel_tol=1e-9, abs_tol=1e-12))
        if have.get("verdict") != want["verdict"] or not effect_ok:
            problems.append(f"level {conc}: stored {fmt.pct(have.get('effect'))} {have.get('verdict')!r}, "
                            f"the runs give {fmt.pct(want['effect'])} {want['verdict']!r}")
    return problems
