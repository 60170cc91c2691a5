"""The evidence file (changelog/evidence/<stem>.json): one A/B result, schema version 2.

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
                 "model": str|null, "device": str|null,
                 "workload": {"api": "chat"|"completions"|"generate"|"kernel"|null,
                              "input_len": int|null, "output_len": int|null,
                              "requests_per_run": int|null, "duration_s": number|null}}
    runs        [{"arm": "A"|"B", "repeat": int, "concurrency": int,
                  "output_tokens_per_s": number, "requests_per_s": number|null,
                  "ttft_ms": {"mean","p50","p90","p99"} | null, "itl_ms": {...} | null,
                  "e2e_ms": {...} | null, "tpot_ms": {...} | null, "completed": int|null,
                  "errors": int, "requested": int|null, "output_tokens": int|null,
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
    validity    {"levels": [{"concurrency", "valid": bool, "reasons": [str]}], "reasons": [str]}
                (knobkeeper/evidence/validity.py: the gates; file-level notes such as duplicates)
    sequential  optional: {"rule": str, "max_repeats", "planned_looks", "spending",
                           "looks": [{"repeat", "open": [levels], "settled": {level: verdict}}]}
    judge_options  optional: the judgement's parameters other than its defaults, e.g. a canary's
                {"unit_noise": 0.02} (judge.compare: a restart offset its windows cannot average
                out; the judgement then also carries "unit_noise") or {"alpha": 0.01}
    canary      optional (source tool "knobkeeper canary"): hosts, calibration, windows, queries
                (knobkeeper/evidence/canary.py)
    anomalies   [{"arm", "from_concurrency", "to_concurrency", "change", "p_value", "confidence"}]
                throughput falling as concurrency rises, per arm
    source      {"tool": str, "raw_files": [relative paths], "format": str|null}

`validate(doc)` returns a list of problems (empty when valid); `check` and `ab import` use it.
"""

from __future__ import annotations

import math
from typing import Any

SCHEMA = "knobkeeper.evidence/2"
SCHEMA_1 = "knobkeeper.evidence/1"
SCHEMAS = (SCHEMA_1, SCHEMA)
VERDICTS = ("better", "worse", "no detectable change", "inconclusive", "invalid")
_NUM = (int, float)


def validate(doc: Any) -> list[str]:
    """Every way `doc` departs from its schema (1 or 2), each as 'field: what is wrong'.

    Schema-2 fields (p_adjusted, guards, family, validity, sequential) are checked when present;
    `store.verify` is the strict check that recomputes them from the runs."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        return ["(top level): expected a JSON object"]
    if doc.get("schema") not in SCHEMAS:
        problems.append(f"schema: expected {SCHEMA!r} (or {SCHEMA_1!r}), got {doc.get('schema')!r}")
    for key in ("id", "created", "knob", "role", "metric"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            problems.append(f"{key}: expected a non-empty string")
    arms = doc.get("arms")
    if not isinstance(arms, dict) or set(arms) != {"A", "B"}:
        problems.append("arms: expected an object with exactly the arms A (baseline) and B (candidate)")
    else:
        for name, arm in arms.items():
            if not isinstance(arm, dict) or not isinstance(arm.get("knobs"), dict):
                problems.append(f"arms.{name}.knobs: expected an object of knob values")
    if not isinstance(doc.get("setup"), dict):
        problems.append("setup: expected an object")
    metric = doc.get("metric")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        problems.append("runs: expected a non-empty list")
    else:
        for i, run in enumerate(runs):
            where = f"runs[{i}]"
            if not isinstance(run, dict):
                problems.append(f"{where}: expected an object")
                continue
            if run.get("arm") not in ("A", "B"):
                problems.append(f"{where}.arm: expected 'A' or 'B'")
            for key in ("repeat", "concurrency", "errors"):
                if isinstance(run.get(key), bool) or not isinstance(run.get(key), int):
                    problems.append(f"{where}.{key}: expected an integer")
            value = run.get(metric) if isinstance(metric, str) else None
            if isinstance(metric, str) and (isinstance(value, bool) or not isinstance(value, _NUM)
                                            or not math.isfinite(value) or value < 0):
                problems.append(f"{where}.{metric}: expected a finite number >= 0, got {value!r}")
    judgement = doc.get("judgement")
    if not isinstance(judgement, dict) or not isinstance(judgement.get("levels"), list):
        problems.append("judgement.levels: expected a list")
    else:
        for i, level in enumerate(judgement["levels"]):
            if not isinstance(level, dict) or level.get("verdict") not in VERDICTS:
                problems.append(f"judgement.levels[{i}].verdict: expected one of {', '.join(VERDICTS)}")
        guards = judgement.get("guards", [])
        if not isinstance(guards, list) or not all(isinstance(g, dict) and g.get("verdict") in VERDICTS
                                                   for g in guards):
            problems.append("judgement.guards: expected a list of judged guard metrics")
        if "family" in judgement and not isinstance(judgement["family"], dict):
            problems.append("judgement.family: expected an object")
    validity = doc.get("validity", {"levels": []})
    if not isinstance(validity, dict) or not isinstance(validity.get("levels", []), list):
        problems.append("validity.levels: expected a list")
    if "sequential" in doc and not (isinstance(doc["sequential"], dict)
                                    and isinstance(doc["sequential"].get("looks"), list)):
        problems.append("sequential.looks: expected a list")
    if "judge_options" in doc:
        options = doc["judge_options"]
        ranges = {"unit_noise": (0.0, True), "alpha": (0.0, False)}  # (lower bound, inclusive)
        if not isinstance(options, dict) or set(options) - set(ranges) or not all(
                isinstance(v, _NUM) and not isinstance(v, bool) and v < 1
                and (v >= ranges[k][0] if ranges[k][1] else v > ranges[k][0]) for k, v in options.items()):
            problems.append("judge_options: expected {\"unit_noise\": a log-sd from 0 to 1, "
                            "\"alpha\": a probability between 0 and 1}")
    if not isinstance(doc.get("anomalies"), list):
        problems.append("anomalies: expected a list")
    source = doc.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("tool"), str):
        problems.append("source.tool: expected a string")
    return problems
