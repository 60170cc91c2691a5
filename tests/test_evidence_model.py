"""The typed evidence model (knobkeeper/evidence/model.py): read and written in one place, older files
load, a file can say a count was not recorded, and the evidence can say whether it backs a change
and whether it agrees with itself. No process is started."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest

from knobkeeper.evidence import store
from knobkeeper.evidence import validity
from knobkeeper.evidence.model import SCHEMA_1, Evidence, Adjustment, Judgement, KnobSeen, Setup, Workload
from knobkeeper.evidence.schema import validate
from tests.infra import git

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
ARMS = {"A": {"label": "baseline", "knobs": {KNOB: None}}, "B": {"label": "candidate", "knobs": {KNOB: 512}}}


def _runs(gain: float = 0.128, levels=(64, 96), n: int = 4, seed: int = 5, **extra) -> list[dict]:
    rng = random.Random(seed)
    return [{"arm": arm, "repeat": rep, "concurrency": conc, "errors": 0, **extra,
             "output_tokens_per_s": 1000.0 * (1 + (gain if arm == "B" else 0)) * math.exp(rng.gauss(0, 0.01))}
            for conc in levels for arm in "AB" for rep in range(1, n + 1)]


def _doc(**kw) -> Evidence:
    return store.build_doc(knob=KNOB, role="decode", arms=ARMS, runs=kw.pop("runs", None) or _runs(), **kw)


def test_the_json_written_reads_back_as_the_same_evidence_and_keeps_what_it_does_not_declare():
    runs = _runs(bandwidth_gbps=812.5)                       # a tool's own number in every run
    doc = _doc(runs=runs, setup={"engine": "sglang", "engine_version": "0.5.23", "schedule": None},
               extra={"correctness": {"passed": True}})
    data = doc.to_json()
    assert validate(data) == [] and json.loads(json.dumps(data)) == data
    again = Evidence.from_json(data)
    assert again.to_json() == data and again == doc
    assert again.runs[0].extra["bandwidth_gbps"] == 812.5 and again.extra["correctness"] == {"passed": True}
    # the file's keys are the parts' attributes, read as attributes only (no back door by key)
    assert data["judgement"]["levels"][0]["verdict"] == doc.judgement.levels[0].verdict == "better"
    with pytest.raises(TypeError):
        doc["judgement"]
    # a part's JSON read back is its typed part
    doc.judgement = Judgement.from_json({**doc.judgement.to_json(), "family": {"method": "holm", "alpha": 0.05, "size": 3}})
    assert isinstance(doc.judgement.family, Adjustment) and doc.judgement.family.size == 3
    level = doc.judgement.levels[0].to_json()
    assert "p_sequential" not in level and "p_adjusted" in level
    assert to_json_is_a_copy(doc)


def to_json_is_a_copy(doc: Evidence) -> bool:
    data = doc.to_json()
    data["runs"][0]["output_tokens_per_s"] = -1.0
    return doc.runs[0].output_tokens_per_s > 0


def test_schema_1_evidence_reads_as_per_level_verdicts_without_a_family(project):
    doc = _doc()
    old = {k: v for k, v in doc.to_json().items() if k != "validity"}
    old["schema"] = SCHEMA_1
    for level in old["judgement"]["levels"]:
        level.pop("p_adjusted")
    old["judgement"] = {k: v for k, v in old["judgement"].items() if k not in ("guards", "family")}
    path = project.evidence_dir / "20261101T000000.000000Z-0ld0ld00.json".replace("0ld0ld00", doc.id)
    path.write_text(json.dumps(old))
    loaded = store.load(project, doc.id)
    assert not loaded.is_adjusted and loaded.judgement.family is None and loaded.validity.levels == []
    level = loaded.judgement.levels[0]
    assert loaded.p_cell(level) == "unadjusted" and "unadjusted" in loaded.level_text(level)
    assert [g.p for g in loaded.gains()] == [lv.p_value for lv in loaded.judgement.levels]
    assert _doc().p_cell(_doc().judgement.levels[0]) != "unadjusted"


def test_backs_names_the_knob_role_or_value_that_differs():
    doc = _doc()
    assert doc.backs(KNOB, "decode", 512) is None
    assert doc.backs(KNOB, "decode", "512") is None                 # the same value, as a catalog parses it
    assert doc.backs(KNOB, "prefill", 512) == f"evidence {doc.id} tests {KNOB} on decode, not {KNOB} on prefill"
    assert doc.backs("NCCL_MIN_NCHANNELS", "decode", 8) == (f"evidence {doc.id} tests {KNOB} on decode, "
                                                            f"not NCCL_MIN_NCHANNELS on decode")
    assert doc.backs(KNOB, "decode", 256) == f"stale evidence {doc.id}: it tested 512, the change sets 256"
    assert doc.backs(KNOB, "decode", None, show=lambda v: f"<{v}>") == (
        f"stale evidence {doc.id}: it tested <512>, the change sets <None>")


def test_backs_holds_evidence_to_its_own_stack_s_role():
    """Issue 38 finding 2: a stack unnamed on one side is no wildcard. The unnamed stack's decode and
    stack vllm's decode are two tables; each backs only its own (setup.stack or a scoped role)."""
    plain, vllm, scoped = _doc(), _doc(setup={"stack": "vllm"}), _doc()
    scoped.role = "vllm.decode"
    assert plain.backs(KNOB, "vllm.decode", 512) == f"evidence {plain.id} tests {KNOB} on decode, not {KNOB} on vllm.decode"
    assert vllm.backs(KNOB, "decode", 512) == f"evidence {vllm.id} tests {KNOB} on vllm.decode, not {KNOB} on decode"
    assert vllm.backs(KNOB, "sglang.decode", 512) == (f"evidence {vllm.id} tests {KNOB} on vllm.decode, "
                                                      f"not {KNOB} on sglang.decode")
    assert plain.backs(KNOB, "decode", 512) is None                 # one-stack repos, as always
    assert vllm.backs(KNOB, "vllm.decode", 512) is None and scoped.backs(KNOB, "vllm.decode", 512) is None
    assert (plain.scope, vllm.scope, scoped.scope) == ("decode", "vllm.decode", "vllm.decode")


def test_disagreements_find_a_description_its_runs_contradict():
    seen = KnobSeen("carried", "512", "started.sh: arm wants 512")
    runs = [{**r, "knob_seen": seen.to_json() if r["arm"] == "B" else {"status": "carried", "running": None}}
            for r in _runs()]
    doc = _doc(runs=runs)
    assert doc.disagreements() == []
    edited = copy.deepcopy(doc)
    edited.arms["B"].knobs[KNOB] = 256                     # a hand edit of the candidate arm
    assert any("the engine ran SGLANG_SM120_MMA_TARGET_CTAS=512, but arm B says 256" in p
               for p in edited.disagreements())
    edited.arms["B"].knobs = {KNOB: None}
    assert any("A and B both have" in p for p in edited.disagreements())
    del edited.arms["A"].knobs[KNOB]
    assert any(p.startswith("arms.A.knobs: does not name the knob") for p in edited.disagreements())
    scheduled = _doc(setup={"schedule": {"levels": [64], "design": "fixed"}})
    assert scheduled.disagreements() == ["runs at 96 are not in setup.schedule.levels [64]"]


def test_a_count_a_tool_cannot_tell_is_not_recorded_and_its_gate_not_applied():
    by = "sglang.bench_serving 0.5.23"
    runs = [{**r, "errors": None, "not_recorded": {"errors": by}} for r in _runs()]
    doc = _doc(runs=runs)
    assert validate(doc) == [] and doc.runs[0].errors is None and doc.runs[0].failed == 0
    assert doc.runs[0].unrecorded("errors") == f"not recorded by {by}"
    row = doc.validity.levels[0]
    assert row.valid and row.not_applied == [f"errors gate not applied: errors not recorded by {by}"]
    assert doc.judgement.levels[0].n_a == 4          # not dropped as errored: nothing says it errored
    # null without saying who could not tell it is still a broken file
    bad = doc.to_json()
    del bad["runs"][0]["not_recorded"]
    assert validate(bad)[0] == "runs[0].errors: expected an integer"
    # a file without the field reads as before: the gate applied, nothing noted
    assert all(row.not_applied == [] for row in _doc().validity.levels)


def test_the_setup_builder_fills_what_every_producer_shares(project):
    setup = Setup.build(project, inventory="inventory/local.py", engine="vllm", engine_version="0.11.0",
                        workload=Workload(api="chat", input_len=8), bench_tool="vllm bench serve", bench_version="0.11.0")
    assert setup.git_sha == git(project.root, "rev-parse", "HEAD")
    assert (setup.engine, setup.engine_version, setup.workload.input_len) == ("vllm", "0.11.0", 8)
    assert "served_model_name" not in setup.to_json() and setup.to_json()["bench_tool"] == "vllm bench serve"
    assert Setup.build().engine == "unknown" and Setup.build().git_sha is None


@pytest.mark.parametrize("edit,problem", [
    (lambda d: d.pop("knob"), "knob: expected a non-empty string"),
    (lambda d: d["arms"].pop("B"), "arms: expected an object with exactly the arms A (baseline) and B (candidate)"),
    (lambda d: d["arms"]["A"].update(knobs=[]), "arms.A.knobs: expected an object of knob values"),
    (lambda d: d["runs"][1].update(arm="C"), "runs[1].arm: expected 'A' or 'B'"),
    (lambda d: d["runs"][2].update(output_tokens_per_s=-1), "runs[2].output_tokens_per_s: expected a finite number >= 0, got -1"),
    (lambda d: d["judgement"]["levels"][0].update(verdict="great"), "judgement.levels[0].verdict: expected one of better,"),
    (lambda d: d.update(sequential={"looks": 3}), "sequential.looks: expected a list"),
    (lambda d: d.update(schema="knobkeeper.evidence/9"), "schema: expected 'knobkeeper.evidence/2' (or 'knobkeeper.evidence/1'), got"),
])
def test_the_schema_rules_name_the_field_and_what_is_accepted(edit, problem):
    data = _doc().to_json()
    edit(data)
    assert validate(data)[0].startswith(problem), validate(data)


def test_assess_marks_a_level_with_an_unrecorded_count_and_still_judges_it():
    runs = [{**r, "errors": None, "not_recorded": {"errors": "t 1"}} if r["concurrency"] == 96 else r for r in _runs()]
    assessed, invalid = validity.assess(runs)
    assert invalid == {} and [row.not_applied for row in assessed.levels] == [[], ["errors gate not applied: errors not recorded by t 1"]]


def _host(tokens: float, **more) -> dict:
    """A worker's numbers in one window, with the keys in the order the canary writes them."""
    return {"start": 0, "end": 2.0, "output_tokens_per_s": tokens, "running": 16.0, "errors": 0,
            "ttft_ms": {"p50": 21.5, "p99": 60.25}, "tpot_ms": {"p50": 4.0, "p99": 9}, "decoding": 15.5,
            "itl_ms": 16.25, "requests": 50, **more}


# A canary's block as `knobkeeper canary` writes it (knobkeeper/evidence/canary.py: _record), keys
# in its order: a calibration window, then a canary window in which the candidate restarted.
CANARY_BLOCK = {
    "hosts": {"canary": ["h1/decode"], "baseline": ["h2/decode"]},
    "source": {"kind": "prometheus", "url": "http://127.0.0.1:9090"},
    "queries": {"output_tokens_per_s": "sum by (kk_target) (rate(sglang:generation_tokens_total[2000ms]))"},
    "design": "calibrated: per-window canary/baseline ratios, canary windows (B) against calibration windows (A)",
    "interval_s": 2.0, "duration_s": 2.0, "calibration_s": 2.0, "calibration_windows": 1, "imbalance_threshold": 2.0,
    "restart_noise": 0.02, "normalisation": "tokens/s per request in flight x the window's mean requests in flight",
    "windows": [
        {"index": 0, "phase": "calibration", "start": 0, "end": 2.0, "valid": True, "reasons": [],
         "hosts": {"h1/decode": _host(1001.5), "h2/decode": _host(998)},
         "throughput": {"h1/decode": 1001.5, "h2/decode": 998.0}, "in_flight": 15.5},
        {"index": 1, "phase": "canary", "start": 2.0, "end": 4.0, "valid": False,
         "reasons": ["restarted: h1/decode (1x)", "the candidate died: h1/decode"],
         "hosts": {"h1/decode": _host(310.0, errors=8, requests=None, restarts=1),
                   "h2/decode": _host(1002.0, requests=None, unanswered=2)}}],
    "errors": {"canary": {"errors": 8, "requests": None, "hosts": 1}, "baseline": {"errors": 0, "requests": None, "hosts": 1},
               "share": 0.5, "p_value": 0.00390625, "alpha": 0.009999999999999998, "failed": True},
    "verdict": "worse", "failed_guards": ["the candidate died: h1/decode: its process was replaced in window 1"],
    "rolled_back": True, "deployed_at": 1780000000.5, "seconds_to_verdict": 4.25}


def test_a_canary_block_reads_as_typed_parts_and_writes_back_byte_for_byte():
    """The canary's window numbers, its errors test's sides and its metrics source are parts read by
    attribute; the file written from them is the one read, byte for byte (a count of 0 restarts or
    unanswered scrapes is left out, as the canary has always written it)."""
    from knobkeeper.evidence import canary_design, metrics
    from knobkeeper.evidence.model import CanarySource, ErrorCounts, WindowStats

    text = json.dumps(_doc(canary=CANARY_BLOCK).to_json(), indent=2, allow_nan=False) + "\n"
    doc = Evidence.from_json(json.loads(text))
    assert json.dumps(doc.to_json(), indent=2, allow_nan=False) + "\n" == text
    assert json.dumps(doc.canary.to_json()) == json.dumps(CANARY_BLOCK)
    c = doc.canary
    assert isinstance(c.source, CanarySource) and (c.source.kind, c.source.url) == ("prometheus", "http://127.0.0.1:9090")
    calm, died = c.windows
    assert all(isinstance(s, WindowStats) for w in c.windows for s in w.hosts.values())
    assert calm.hosts["h1/decode"].restarts == 0 and calm.hosts["h2/decode"].requests == 50
    assert "restarts" not in calm.hosts["h1/decode"].to_json() and "unanswered" not in calm.hosts["h1/decode"].to_json()
    assert died.hosts["h1/decode"].restarts == 1 and died.hosts["h1/decode"].requests is None
    assert died.hosts["h2/decode"].unanswered == 2 and died.hosts["h1/decode"].ttft_ms == {"p50": 21.5, "p99": 60.25}
    assert isinstance(c.errors.canary, ErrorCounts) and (c.errors.canary.errors, c.errors.baseline.hosts) == (8, 1)
    assert c.errors.text() == "errors 8 on the canary vs 0 on the baseline (p 0.0039)"
    assert validate(doc) == [] and doc.disagreements() == []
    # the canary's own readers take the windows as read from the file
    t = [metrics.Target(f"h{i}/decode", f"h{i}", "decode", f"http://127.0.0.1:{i}/metrics") for i in (1, 2)]
    plan = canary_design.Plan(KNOB, 512, None, "decode", canary=[t[0]], baseline=[t[1]])
    assert canary_design.errors_test(plan, c.windows) == c.errors
    assert canary_design.restarts_of(plan, c.windows) == 1
    assert canary_design.candidate_death(plan, c.windows).what == "its process was replaced in window 1"
    # a measurement is the same part: written as the window holds it
    stats = metrics.WindowStats(2.0, 4.0, 310.0, 16.0, 8, requests=None, restarts=1)
    assert stats.to_json()["restarts"] == 1 and "unanswered" not in stats.to_json()
