"""The evidence file (changelog/evidence/<stem>.json): one A/B result, schema version 2, and the
rules a file must follow, as data (RULES). model.py holds the typed records read from it.

One JSON object:

    schema      "knobkeeper.evidence/2" (files of "knobkeeper.evidence/1" still load: their
                verdicts were per level, without family-wise adjustment, and readers say so)
    id          8 hex digits; the file is changelog/evidence/<UTC stamp>-<id>.json
                (raw files it came from, if kept, sit in changelog/evidence/<stem>/)
    created     "2026-11-29T16:47:37.123456Z" (UTC)
    knob        the knob under test, e.g. "SGLANG_SM120_MMA_TARGET_CTAS"
    role        the role it applies to, e.g. "decode"
    metric      the primary metric judged, a key of every run: "output_tokens_per_s"
    arms        {"A": {"label": "baseline", "knobs": {KNOB: value | null}},
                 "B": {"label": "candidate", "knobs": {KNOB: value}}}
                A is always the baseline, B the candidate; null = the knob unset.
    setup       {"inventory": str|null, "git_sha": str|null, "engine": str, "engine_version": str|null,
                 "model": str|null, "served_model_name": str (optional), "device": str|null,
                 "bench_tool": str, "bench_version": str (optional: the load generator that measured),
                 "workload": {"api": "chat"|"completions"|"generate"|"kernel"|null,
                              "input_len": int|null, "output_len": int|null, "dataset": str (optional),
                              "requests_per_run": int|null, "duration_s": number|null},
                 "schedule": {...} (optional: `ab run`'s ABBA blocks)}
    runs        [{"arm": "A"|"B", "repeat": int, "concurrency": int,
                  "output_tokens_per_s": number, "requests_per_s": number|null,
                  "ttft_ms": {"mean","p50","p90","p99"} | null, "itl_ms": {...} | null,
                  "e2e_ms": {...} | null, "tpot_ms": {...} | null, "completed": int|null (finished),
                  "errors": int (failed) | null, "requested": int|null, "output_tokens": int|null,
                  "not_recorded": {"errors": "sglang.bench_serving 0.5.23"} (optional: a count the
                                  tool's file cannot tell is null, and this names the tool),
                  "knob_seen": {"status": "carried"|"not carried"|"unverified", "running", "detail"}|null,
                  "prefill_prompt_tokens": number|null  (the prefill counter's rise; disaggregated),
                  ... tool-specific extra numbers are allowed ...}]
                `concurrency` is the configured level (max_concurrency), never a measured one;
                for kernel evidence it is the decode batch size (one token per sequence per call).
    judgement   {"method": str, "alpha": 0.05,
                 "levels": [{"concurrency", "n_a", "n_b", "mean_a", "mean_b", "effect",
                             "ci_low", "ci_high", "p_value" (raw), "p_adjusted" (family-wise),
                             "verdict" (on p_adjusted), "repeats_needed", "outliers_dropped"}],
                 "guards": [{"concurrency", "metric" ("ttft_p99_ms", ...), "effect", "ci_low",
                             "ci_high", "p_value", "p_adjusted", "verdict", "regression": bool}],
                 "family": {"method": "holm", "alpha": 0.05, "size": m, "weights": {...}}}
                effect/ci are relative (0.128 = +12.8% of B over A; for a guard +0.4 = 40% slower);
                verdict: "better" | "worse" | "no detectable change" | "inconclusive" | "invalid"
                (knobkeeper/evidence/judge.py says how; schema 1 has no p_adjusted/guards/family)
    validity    {"levels": [{"concurrency", "valid": bool, "reasons": [str], "not_applied": [str]
                 (optional: gates the runs could not be judged by, e.g. errors not recorded)}],
                 "reasons": [str]}
                (knobkeeper/evidence/validity.py: the gates; file-level notes such as duplicates)
    sequential  optional: {"rule": str, "max_repeats", "planned_looks", "spending",
                           "looks": [{"repeat", "open": [levels], "settled": {level: verdict}}]}
    judge_options  optional: the judgement's parameters other than its defaults, e.g. a canary's
                {"unit_noise": 0.02} (judge.compare: a restart offset its windows cannot average
                out; the judgement then also carries "unit_noise") or {"alpha": 0.01}
    canary      optional (source tool "knobkeeper canary", knobkeeper/evidence/canary.py):
                {"hosts": {"canary": [keys], "baseline": [keys]}, "source": {"kind": "scrape"|"prometheus",
                 "url": str|null}, "queries", the design and calibration, "windows": [{"index", "phase",
                 "start", "end", "valid", "reasons", "hosts": {key: {"start", "end", "output_tokens_per_s",
                 "running", "errors", "ttft_ms", "tpot_ms", "decoding", "itl_ms", "requests", "restarts"
                 and "unanswered" (left out when 0)}}, "throughput", "in_flight"}], "errors": {"canary" and
                 "baseline": {"errors", "requests": int|null, "hosts"}, "share", "p_value", "alpha",
                 "failed"}, "verdict", "failed_guards", "rolled_back", ...}
    rejudges    optional: the id of the evidence whose runs this file judges again by today's
                method (`knobkeeper ab rejudge ID`); everything measured is that file's, unchanged.
                Evidence files are never rewritten: a new judgement is a new file.
    anomalies   [{"arm", "from_concurrency", "to_concurrency", "change", "p_value", "confidence"}]
                throughput falling as concurrency rises, per arm
    source      {"tool": str, "raw_files": [relative paths], "format": str|null}
    sweep       optional (source tool "knobkeeper sweep", knobkeeper/evidence/sweep.py):
                {"plan": the plan as committed (changelog/plans/), "plan_path", "plan_commit",
                 "status": "complete"|"interrupted", "blocks": [{"repeat", "order": [arms]}],
                 "runs": [runs of every arm, "arm" its letter, A the control], "warmups",
                 "sequential", "looks": [{"repeat", "survivors", "leader", "eliminated", "settled",
                 "stop"}], "failed": {arm: {"repeat", "cause", "detail"}}, "judgement": {arm:
                 a judgement as above, one family over every arm}, "scores", "pick": {"outcome":
                 "adopt"|"keep the control"|"no pick", "arm", "knobs", "reason", "rule", "tied",
                 "confirmed"}, "confirm": {"arm", ...}|null, "fingerprint", "stopped", "wall_s"};
                the file's own arms/runs/judgement are then the confirming A/B of the pick (or,
                without one, the search's runs of the control and the leading candidate)
    interrupted optional: {"by": "Ctrl-C"|"SIGTERM"|..., "at", "blocks"}: stopped before its end,
                the runs measured until then (`ab run`, `sweep`)

Fields marked optional were added to schema 2 after its first files: a file without them reads as
before (a count null with `not_recorded`, the setup's bench tool, served name and dataset).

`validate(doc)` returns a list of problems (empty when valid); `check` and `ab import` use it.
`store.verify` is the strict check that recomputes the judgement from the runs.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from knobkeeper.evidence.model import PICK_OUTCOMES, SCHEMA, SCHEMA_1, SCHEMAS, VERDICTS, plain

_NUM = (int, float)


def _text(v: Any, _: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _object(v: Any, _: Any) -> bool:
    return isinstance(v, dict)


def _list(v: Any, _: Any) -> bool:
    return isinstance(v, list)


def _integer(v: Any, _: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _one_of(*values: Any) -> Callable[[Any, Any], bool]:
    return lambda v, _: v in values


def _count(v: Any, run: Any) -> bool:
    """An integer, or null when the run's `not_recorded` names the tool that could not tell."""
    if v is None:
        return isinstance(run.get("not_recorded"), dict) and isinstance(run["not_recorded"].get("errors"), str)
    return _integer(v, run)


def _throughput(v: Any, _: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, _NUM) and math.isfinite(v) and v >= 0


def _judge_options(v: Any, _: Any) -> bool:
    bounds = {"unit_noise": (0.0, True), "alpha": (0.0, False)}  # (lower bound, inclusive)
    return isinstance(v, dict) and not set(v) - set(bounds) and all(
        isinstance(x, _NUM) and not isinstance(x, bool) and x < 1
        and (x >= bounds[k][0] if bounds[k][1] else x > bounds[k][0]) for k, x in v.items())


def _strings(v: Any, _: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


REQUIRED, OPTIONAL = True, False
# (path, required, test(value, holder), what is expected, show the value found)
# `runs[*]` is every run, `arms.*` every arm, `{metric}` the file's own metric name. A rule whose
# holder is missing or malformed is not applied: the holder's own rule has said so.
RULES: tuple[tuple[str, bool, Callable[[Any, Any], bool], str, bool], ...] = (
    ("schema", REQUIRED, _one_of(*SCHEMAS), f"{SCHEMA!r} (or {SCHEMA_1!r})", True),
    ("id", REQUIRED, _text, "a non-empty string", False),
    ("created", REQUIRED, _text, "a non-empty string", False),
    ("knob", REQUIRED, _text, "a non-empty string", False),
    ("role", REQUIRED, _text, "a non-empty string", False),
    ("metric", REQUIRED, _text, "a non-empty string", False),
    ("arms", REQUIRED, lambda v, _: isinstance(v, dict) and set(v) == {"A", "B"},
     "an object with exactly the arms A (baseline) and B (candidate)", False),
    ("arms.*", REQUIRED, _object, "an object with the arm's knobs", False),
    ("arms.*.knobs", REQUIRED, _object, "an object of knob values", False),
    ("setup", REQUIRED, _object, "an object", False),
    ("runs", REQUIRED, lambda v, _: isinstance(v, list) and bool(v), "a non-empty list", False),
    ("runs[*]", REQUIRED, _object, "an object", False),
    ("runs[*].arm", REQUIRED, _one_of("A", "B"), "'A' or 'B'", False),
    ("runs[*].repeat", REQUIRED, _integer, "an integer", False),
    ("runs[*].concurrency", REQUIRED, _integer, "an integer", False),
    ("runs[*].errors", REQUIRED, _count, "an integer", False),
    ("runs[*].{metric}", REQUIRED, _throughput, "a finite number >= 0", True),
    ("runs[*].not_recorded", OPTIONAL, _strings, "an object naming, per count, the tool that did not record it",
     False),
    ("judgement", REQUIRED, _object, "an object", False),
    ("judgement.levels", REQUIRED, _list, "a list", False),
    ("judgement.levels[*]", REQUIRED, _object, "an object", False),
    ("judgement.levels[*].verdict", REQUIRED, _one_of(*VERDICTS), f"one of {', '.join(VERDICTS)}", False),
    ("judgement.levels[*].concurrency", REQUIRED, _integer, "an integer", False),
    ("judgement.guards", OPTIONAL, lambda v, _: isinstance(v, list) and all(
        isinstance(g, dict) and g.get("verdict") in VERDICTS for g in v), "a list of judged guard metrics", False),
    ("judgement.family", OPTIONAL, _object, "an object", False),
    ("validity", OPTIONAL, _object, "an object", False),
    ("validity.levels", OPTIONAL, _list, "a list", False),
    ("sequential", OPTIONAL, _object, "an object", False),
    ("sequential.looks", REQUIRED, _list, "a list", False),
    ("judge_options", OPTIONAL, _judge_options,
     '{"unit_noise": a log-sd from 0 to 1, "alpha": a probability between 0 and 1}', False),
    ("rejudges", OPTIONAL, lambda v, _: isinstance(v, str) and bool(re.fullmatch(r"[0-9a-f]+", v)),
     "the hex id of the evidence it re-judges", True),
    ("sweep", OPTIONAL, _object, "an object", False),
    ("sweep.plan", REQUIRED, _object, "the sweep's plan (an object)", False),
    ("sweep.plan.arms", REQUIRED, lambda v, _: isinstance(v, dict) and "A" in v and len(v) >= 2,
     "an object with the control A and at least one candidate", False),
    ("sweep.runs", REQUIRED, _list, "a list", False),
    ("sweep.runs[*].arm", REQUIRED, lambda v, holder: isinstance(v, str) and bool(v), "an arm's letter", False),
    ("sweep.runs[*].repeat", REQUIRED, _integer, "an integer", False),
    ("sweep.runs[*].concurrency", REQUIRED, _integer, "an integer", False),
    ("sweep.pick", REQUIRED, lambda v, _: isinstance(v, dict) and v.get("outcome") in PICK_OUTCOMES,
     f"an object whose outcome is one of {', '.join(PICK_OUTCOMES)}", False),
    ("sweep.status", REQUIRED, _one_of("complete", "interrupted"), "'complete' or 'interrupted'", True),
    ("interrupted", OPTIONAL, _object, "an object", False),
    ("anomalies", REQUIRED, _list, "a list", False),
    ("source", REQUIRED, _object, "an object", False),
    ("source.tool", REQUIRED, lambda v, _: isinstance(v, str), "a string", False),
)


def _holders(doc: Any, parts: list[str], where: str) -> list[tuple[str, Any]]:
    """(path so far, value) of every holder the path's parts lead to (wildcards expanded)."""
    found = [(where, doc)]
    for part in parts:
        step = []
        for at, value in found:
            name, each = (part[:-3], True) if part.endswith("[*]") else (part, False)
            if name == "*":
                if isinstance(value, dict):
                    step += [(f"{at}.{k}" if at else k, v) for k, v in value.items()]
                continue
            if not isinstance(value, dict) or name not in value:
                continue
            at = f"{at}.{name}" if at else name
            if each:
                if isinstance(value[name], list):
                    step += [(f"{at}[{i}]", v) for i, v in enumerate(value[name])]
            else:
                step.append((at, value[name]))
        found = step
    return found


def validate(doc: Any) -> list[str]:
    """Every way `doc` (JSON data, or the typed records) departs from its schema (1 or 2), each as
    'field: what is wrong', in the order of RULES."""
    doc = plain(doc)
    if not isinstance(doc, dict):
        return ["(top level): expected a JSON object"]
    metric = doc.get("metric") if isinstance(doc.get("metric"), str) and doc.get("metric") else None
    problems: list[str] = []
    for path, required, test, expected, show in RULES:
        if "{metric}" in path:
            if metric is None:
                continue
            path = path.replace("{metric}", metric)
        *head, last = path.split(".")
        for at, holder in _holders(doc, head, ""):
            if not isinstance(holder, dict):
                continue
            name, each = (last[:-3], True) if last.endswith("[*]") else (last, False)
            where = f"{at}.{name}" if at else name
            if name == "*":
                items = list(holder.items())
                targets = [(f"{at}.{k}" if at else k, v, holder) for k, v in items]
            elif name not in holder:
                if required:
                    targets = [(where, None, holder)]
                else:
                    continue
            elif each:
                if not isinstance(holder[name], list):
                    continue
                targets = [(f"{where}[{i}]", v, holder) for i, v in enumerate(holder[name])]
            else:
                targets = [(where, holder[name], holder)]
            for target, value, parent in targets:
                if not test(value, parent):
                    problems.append(f"{target}: expected {expected}" + (f", got {value!r}" if show else ""))
    return problems
