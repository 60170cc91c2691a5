"""Validity gates: is this benchmark's output evidence at all, before any judgement?

Each gate is a named reason stored in the evidence (`validity`), applied on import and on
`ab run`. A level that fails one is shown as invalid and left out of the family (a broken
benchmark must not count, for or against); a file with no valid level is refused unless the
caller asks to keep it.

Per run (the level is invalid when any of its runs fails):
    zero generated tokens       throughput <= 0 or missing, or the tool counted 0 output tokens
                                (sa-bench "success" with "Total generated tokens: 0")
    completed < requested       requests were lost (the tool says how many it sent)
    error rate above 5%         errors / (completed + errors); a few errors are dropped runs
                                (the outlier rule), a failing server is not a measurement. Where
                                the tool's file cannot tell its errors (`not_recorded`), the gate
                                is not applied, and the level says so (`not_applied`) instead of
                                passing as if there had been none
    knob not carried            the arm's running engine did not have the arm's value
                                (`knob_seen`: read from the engine as `status` does, or from the
                                file's server info; "unverified" is noted, not invalid)
    prefill not touched         a disaggregated run whose prefill's prompt-token counter (the
                                family's: sglang:prompt_tokens_total, vllm:prompt_tokens_total)
                                did not move (decode served without its prefill peer)
    restarted                   a worker was replaced during the run (`restarts`, from
                                metrics.restarts_in: its process start time changed or its counters
                                went down): the run's numbers are not one process's
    same record as arm A        (import) a candidate record identical to a baseline one: the same
                                results given for both arms
Per level:
    one arm only                no runs of the other arm at that level
Per evidence:
    the candidate failed        RESTARTS_FAIL or more worker restarts during arm B's runs: every
                                level is invalid (a candidate that crashes the engine has its worst
                                runs made invalid one by one; together they are the finding, and
                                such evidence backs no change)
Duplicates (`dedupe`, on import): the same record twice in one arm and level, or the same file
passed for several repeats, are counted once and listed in `validity.reasons`.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from knobkeeper import fmt
from knobkeeper.evidence.model import METRIC, KnobSeen, LevelValidity, Run, Validity

ERROR_RATE_MAX = 0.05
# This many worker restarts while the candidate is measured fail it (ab run's arm B): one crash can
# be a neighbour's, three are the candidate's. A canary watches its candidate workers as it runs
# and stops at the first one's death, which is its verdict (knobkeeper.evidence.canary, issue 38).
RESTARTS_FAIL = 3
CARRIED, NOT_CARRIED, UNVERIFIED = "carried", "not carried", "unverified"


def _where(run: Run) -> str:
    return f"arm {run.arm} repeat {run.repeat}"


def run_reasons(run: Run | Mapping[str, Any], metric: str = METRIC) -> list[str]:
    """Every gate this one run fails, as words a person reads."""
    run = Run.of(run)
    out = []
    if run.value(metric) is None or run.output_tokens == 0:
        out.append(f"{_where(run)}: zero or missing generated tokens")
    completed, requested, errors = run.completed, run.requested, run.failed
    if isinstance(completed, int) and isinstance(requested, int) and completed + errors < requested:
        out.append(f"{_where(run)}: completed {completed} of {requested} requests")
    if isinstance(completed, int) and errors and errors / (completed + errors) > ERROR_RATE_MAX:
        out.append(f"{_where(run)}: error rate {errors / (completed + errors):.0%} "
                   f"(above {ERROR_RATE_MAX:.0%})")
    seen = run.knob_seen
    if seen is not None and seen.status == NOT_CARRIED:
        out.append(f"{_where(run)}: the running engine did not carry the knob "
                   f"({seen.detail or 'running ' + json.dumps(seen.running)})")
    if run.extra.get("same_record_as_arm_A"):
        out.append(f"{_where(run)}: the same result record as a run of arm A (one file given for both arms?)")
    if run.prefill_prompt_tokens == 0:
        out.append(f"{_where(run)}: prefill not touched (its prompt-token counter did not move)")
    for key, times in restarts(run).items():
        out.append(f"{_where(run)}: restarted: {key} ({times}x)")
    return out


def restarts(run: Run) -> dict[str, int]:
    """{worker: times it was replaced during the run} (ab run's ProcessWatch), {} when none."""
    seen = run.extra.get("restarts")
    return {str(k): int(v) for k, v in seen.items() if v} if isinstance(seen, dict) else {}


def candidate_failed(runs: Iterable[Run]) -> str | None:
    """The reason every level is invalid when arm B's workers restarted RESTARTS_FAIL times, else None."""
    times = sum(sum(restarts(r).values()) for r in runs if r.arm == "B")
    if times < RESTARTS_FAIL:
        return None
    return (f"the candidate failed: its workers restarted {times} times during arm B's runs "
            f"({RESTARTS_FAIL} fail the candidate)")


def not_applied(run: Run) -> list[str]:
    """The gates this run could not be judged by: its file does not record what they read."""
    why = run.unrecorded("errors")
    return [f"errors gate not applied: errors {why}"] if why else []


def knob_seen(want: Any, knob: str, running: dict | None, source: str) -> KnobSeen:
    """A run's `knob_seen`: does the engine's environment (`running`: {name: value}, None when
    nothing could be read: unverified) carry the value `want` (None = unset) of `knob`?"""
    if running is None:
        return KnobSeen(UNVERIFIED, None, f"{source}: nothing reports the environment")
    have = running.get(knob)
    same = (have is None and want is None) or (have is not None and want is not None and
                                               (str(have) == fmt.value(want) or _same_number(have, want)))
    return KnobSeen(CARRIED if same else NOT_CARRIED, have, f"{source}: {knob}={fmt.value(have)}, arm wants {fmt.value(want)}")


def _same_number(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def record_key(run: Run | Mapping[str, Any]) -> str:
    """A run's measurement, without where it was filed (arm, repeat): equal keys = one record."""
    data = run.to_json() if isinstance(run, Run) else run
    return json.dumps({k: v for k, v in data.items() if k not in ("arm", "repeat")}, sort_keys=True, default=str)


def assess(runs: Iterable[Run | Mapping[str, Any]], metric: str = METRIC) -> tuple[Validity, dict[int, list[str]]]:
    """(`validity` for the evidence, {invalid level: reasons}) from the runs (+ stored notes)."""
    levels: dict[int, dict[str, list[Run]]] = {}
    runs = [Run.of(r) for r in runs]
    for run in runs:
        levels.setdefault(int(run.concurrency), {"A": [], "B": []})[run.arm].append(run)
    failed = candidate_failed(runs)
    rows, invalid = [], {}
    for conc in sorted(levels):
        arms = levels[conc]
        reasons: list[str] = [failed] if failed else []
        for arm, other in (("A", "B"), ("B", "A")):
            if arms[arm] and not arms[other]:
                reasons.append(f"runs of arm {arm} only")
        skipped: list[str] = []
        for run in arms["A"] + arms["B"]:
            reasons += run_reasons(run, metric)
            skipped += [n for n in not_applied(run) if n not in skipped]
        rows.append(LevelValidity(conc, not reasons, reasons, skipped))
        if reasons:
            invalid[conc] = reasons
    return Validity(rows, []), invalid


def knob_note(runs: Iterable[Run]) -> list[str]:
    """File-level note when no run says what the engine was running."""
    statuses = {r.knob_seen.status if r.knob_seen is not None else UNVERIFIED for r in runs}
    if statuses <= {UNVERIFIED}:
        return ["knob value unverified: nothing reports the running engine's environment"]
    if UNVERIFIED in statuses:
        return ["knob value unverified for some runs"]
    return []


def dedupe(runs: list[Run]) -> tuple[list[Run], list[str]]:
    """The runs with exact repeats of a record (same arm and level) counted once, renumbered,
    and one note per duplicate."""
    seen: set[tuple] = set()
    kept, notes = [], []
    for run in runs:
        key = (run.arm, int(run.concurrency), record_key(run))
        if key in seen:
            notes.append(f"arm {run.arm} @{run.concurrency}: a duplicate run record counted once")
            continue
        seen.add(key)
        kept.append(run)
    counts: dict[tuple, int] = {}
    for run in kept:
        slot = (run.arm, int(run.concurrency))
        counts[slot] = counts.get(slot, 0) + 1
        run.repeat = counts[slot]
    return kept, notes
