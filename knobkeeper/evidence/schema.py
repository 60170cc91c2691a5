"""The evidence file (changelog/evidence/<stem>.json): one A/B result, schema version 2, what each
field means, and `validate`. The schema itself is declared once, in model.py (`Evidence` and its
parts): validation and the JSON Schema (`knobkeeper schema evidence`, docs/schemas/evidence.json)
are both made from that declaration by knobkeeper/declared.py. What follows says what the fields
MEAN; their types, which are required and which values are accepted are the declaration's.

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

from typing import Any

from knobkeeper.declared import json_schema
from knobkeeper.evidence.model import SCHEMA, SCHEMA_1, SCHEMAS, Evidence

__all__ = ["SCHEMA", "SCHEMA_1", "SCHEMAS", "validate", "read", "evidence_schema"]


def read(doc: Any) -> tuple[Evidence, list[str]]:
    """(the Evidence in `doc`, every way `doc` departs from the declaration), in one pass."""
    return Evidence.read(doc)   # typed parts inside `doc` are read as their JSON (declared.py)


def validate(doc: Any) -> list[str]:
    """Every way `doc` (JSON data, or the typed records) departs from its schema (1 or 2), each as
    'field: what is wrong', one per field, in the order of the declaration."""
    return read(doc)[1]


def evidence_schema() -> dict[str, Any]:
    """The evidence file's JSON Schema, made from the same declaration as `validate`."""
    return json_schema(Evidence, "knobkeeper evidence file (schema 1 and 2)")
