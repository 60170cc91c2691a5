"""Validity gates, duplicates, catalog checks and bad numbers on import; `verify`; old files.

Each gate is tried on a file in the shape of the tool that would produce it (the fixtures in
tests/data/bench_formats, edited the way the broken benchmark would have written them): a level
that fails is shown as invalid and left out of the family, a file set with no valid level is
refused (exit 2, nothing written) unless --keep-invalid.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper.cli.ab import ab as ab_group
from knobkeeper.errors import UserError
from knobkeeper.evidence import ab
from knobkeeper.evidence import judge
from knobkeeper.evidence import store
from knobkeeper.evidence.schema import SCHEMA_1, validate

DATA = Path(__file__).resolve().parent / "data" / "bench_formats"
KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
KERNEL_FILE = DATA / "20261129T102000.000000Z-5eed0001.json"


def _lines(name: str) -> list[dict]:
    return [json.loads(ln) for ln in (DATA / name).read_text().splitlines() if ln.strip()]


def _write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _write_json(path: Path, obj) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def _head(project) -> str:
    return subprocess.run(["git", "-C", str(project.root), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def _nothing_written(project, head) -> bool:
    return (_head(project) == head
            and [p.name for p in (project.root / "changelog" / "evidence").iterdir()] == [".gitkeep"])


def _import(project, base, cand, *extra):
    return CliRunner().invoke(ab_group, ["import", "--repo", str(project.root), "--baseline", *base, "--candidate", *cand,
                                   "--role", "decode", "--knob", f"{KNOB}=512", *extra])


def _levels(doc):
    return {lv.concurrency: lv for lv in doc.judgement.levels}


# ---------------------------------------------------------------- the gates, per tool

def test_sglang_zero_generated_tokens_invalidates_the_level(project, tmp_path):
    """srt-slurm issue 429: sa-bench "success" with Total generated tokens: 0."""
    cand = _lines("sglang_ctas512.jsonl")
    for rec in cand:
        if rec["max_concurrency"] == 96:
            rec.update(output_throughput=0.0, total_output_tokens=0, total_output_tokens_retokenized=0)
    doc = store.import_files(project, baseline=[str(DATA / "sglang_unset.jsonl")],
                             candidate=[_write_jsonl(tmp_path / "cand.jsonl", cand)], role="decode", knob=f"{KNOB}=512")
    levels = _levels(doc)
    assert levels[96].verdict == "invalid" and "zero or missing generated tokens" in levels[96].invalid[0]
    assert levels[64].verdict == "better" and doc.judgement.family.size == 2 * 5
    row = next(r for r in doc.validity.levels if r.concurrency == 96)
    assert not row.valid and row.reasons
    assert [g.concurrency for g in store.gains(doc)] == [64, 80]      # invalid counts for nothing
    assert "@96 invalid (arm B repeat 1: zero or missing generated tokens)" in store.summary_line(doc)
    assert store.verify(doc) == []


def test_a_file_with_no_valid_level_is_refused_unless_keep_invalid(project, tmp_path):
    cand = [dict(rec, output_throughput=0.0, total_output_tokens=0) for rec in _lines("sglang_ctas512.jsonl")]
    path = _write_jsonl(tmp_path / "cand.jsonl", cand)
    head = _head(project)
    out = _import(project, [str(DATA / "sglang_unset.jsonl")], [path])
    assert out.exit_code == 2 and "\n" not in out.output.strip()
    assert "no valid level" in out.output and "zero or missing generated tokens" in out.output
    assert _nothing_written(project, head)
    out = _import(project, [str(DATA / "sglang_unset.jsonl")], [path], "--keep-invalid")
    assert out.exit_code == 0, out.output
    assert "invalid @64" in out.output and _head(project) != head


def test_vllm_completed_below_num_prompts_invalidates(project, tmp_path):
    rec = json.loads((DATA / "vllm_ctas512_c64_r1.json").read_text())
    rec["completed"] = rec["num_prompts"] - 100          # requests lost without being counted as failed
    cand = [_write_json(tmp_path / "c64.json", rec), str(DATA / "vllm_ctas512_c64_r2.json"),
            str(DATA / "vllm_ctas512_c96_r1.json"), str(DATA / "vllm_ctas512_c96_r2.json")]
    doc = store.import_files(project, baseline=[str(p) for p in sorted(DATA.glob("vllm_unset_*.json"))],
                             candidate=cand, role="decode", knob=f"{KNOB}=512", no_commit=True)
    assert _levels(doc)[64].verdict == "invalid"
    assert "completed 412 of 512 requests" in " ".join(_levels(doc)[64].invalid)
    assert _levels(doc)[96].verdict != "invalid"


def test_aiperf_error_rate_above_threshold_invalidates(project, tmp_path):
    base = [str(p) for p in sorted(DATA.glob("aiperf_unset_*/profile_export_aiperf.json"))]
    cand = [str(p) for p in sorted(DATA.glob("aiperf_ctas512_*/profile_export_aiperf.json"))]
    broken = json.loads(Path(cand[0]).read_text())
    broken["error_summary"] = [{"error_details": {"code": 503, "message": "Service Unavailable"}, "count": 200}]
    cand[0] = _write_json(tmp_path / "r1" / "profile_export_aiperf.json", broken)
    head = _head(project)
    with pytest.raises(UserError, match="error rate 24%"):
        store.import_files(project, baseline=base, candidate=cand, role="decode", knob=f"{KNOB}=512")
    assert _nothing_written(project, head)


def test_vllm_metadata_says_the_engine_did_not_carry_the_knob(project, tmp_path):
    """`vllm bench serve --metadata SGLANG_SM120_MMA_TARGET_CTAS=...`: the harness's record of the server."""
    base = [str(p) for p in sorted(DATA.glob("vllm_unset_*.json"))]
    cand = []
    for i, p in enumerate(sorted(DATA.glob("vllm_ctas512_*.json"))):
        rec = json.loads(p.read_text())
        rec[KNOB] = "256" if "c96" in p.name else "512"     # the c96 runs hit a server without the value
        cand.append(_write_json(tmp_path / f"c{i}.json", rec))
    doc = store.import_files(project, baseline=base, candidate=cand, role="decode", knob=f"{KNOB}=512",
                             no_commit=True)
    levels = _levels(doc)
    assert levels[96].verdict == "invalid"
    assert "did not carry the knob" in levels[96].invalid[0] and "256" in levels[96].invalid[0]
    assert levels[64].verdict == "better"
    seen = {r.knob_seen.status for r in doc.runs if r.arm == "B" and r.concurrency == 64}
    assert seen == {"carried"}
    assert "knob value unverified for some runs" in doc.validity.reasons   # the baseline files say nothing


def test_files_without_server_info_say_unverified(project):
    doc = store.import_files(project, baseline=[str(DATA / "sglang_unset.jsonl")],
                             candidate=[str(DATA / "sglang_ctas512.jsonl")], role="decode", knob=f"{KNOB}=512",
                             no_commit=True)
    assert {r.knob_seen.status for r in doc.runs} == {"unverified"}
    assert any("unverified" in note for note in doc.validity.reasons)


def test_level_in_one_arm_only_is_invalid(project):
    doc = store.import_files(project, baseline=[str(p) for p in sorted(DATA.glob("vllm_unset_*.json"))],
                             candidate=[str(DATA / "vllm_ctas512_c64_r1.json"), str(DATA / "vllm_ctas512_c64_r2.json")],
                             role="decode", knob=f"{KNOB}=512", no_commit=True)
    assert _levels(doc)[96].verdict == "invalid" and _levels(doc)[96].invalid == ["runs of arm A only"]


def test_duplicated_records_and_files_count_once(project, tmp_path):
    """2 vs 2 runs judged inconclusive must not become 'better' by repeating each line 6 times."""
    base = [r for r in _lines("sglang_unset.jsonl") if r["max_concurrency"] == 64][:2]
    cand = [r for r in _lines("sglang_ctas512.jsonl") if r["max_concurrency"] == 64][:2]
    cand[1] = dict(cand[1], output_throughput=base[1]["output_throughput"] * 1.01)
    cand[0] = dict(cand[0], output_throughput=base[0]["output_throughput"] * 1.10)
    once = store.import_files(project, baseline=[_write_jsonl(tmp_path / "a.jsonl", base)],
                              candidate=[_write_jsonl(tmp_path / "b.jsonl", cand)], role="decode",
                              knob=f"{KNOB}=512", no_commit=True)
    six = store.import_files(project, baseline=[_write_jsonl(tmp_path / "a6.jsonl", base * 6)],
                             candidate=[_write_jsonl(tmp_path / "b6.jsonl", cand * 6)], role="decode",
                             knob=f"{KNOB}=512", no_commit=True)
    assert _levels(once)[64].verdict == _levels(six)[64].verdict != "better"
    assert _levels(six)[64].n_a == 2 and _levels(six)[64].p_value == pytest.approx(_levels(once)[64].p_value)
    assert sum("duplicate run record" in n for n in six.validity.reasons) == 2 * 10
    # the same file passed for several repeats
    files = [str(DATA / "vllm_unset_c64_r1.json")] * 3 + [str(DATA / "vllm_unset_c64_r2.json")]
    doc = store.import_files(project, baseline=files, candidate=[str(p) for p in sorted(DATA.glob("vllm_ctas512_c64*.json"))],
                             role="decode", knob=f"{KNOB}=512", no_commit=True)
    assert _levels(doc)[64].n_a == 2
    assert sum("is the same file as vllm_unset_c64_r1.json" in n for n in doc.validity.reasons) == 2


def test_the_same_results_given_for_both_arms_are_refused(project):
    head = _head(project)
    out = _import(project, [str(DATA / "sglang_unset.jsonl")], [str(DATA / "sglang_unset.jsonl")])
    assert out.exit_code == 2 and "the same result record as a run of arm A" in out.output, out.output
    assert _nothing_written(project, head)


def _fake_load(calls):
    def load(endpoint, conc, **kw):
        calls.append(conc)
        n = len(calls)
        return {"output_tokens_per_s": 1000.0 + conc + (n % 7), "requests_per_s": 10.0, "errors": 0,
                "completed": kw.get("requests") or 10, "requests_target": kw.get("requests"),
                "ttft_ms": {"p50": 80.0 + n % 5, "p99": 140.0 + n % 3}}
    return load


def _arms():
    return {"A": {"label": "baseline", "knobs": {KNOB: None}}, "B": {"label": "candidate", "knobs": {KNOB: 512}}}


def test_ab_run_refuses_a_disaggregated_run_that_never_touched_prefill():
    counter = [1000.0]
    probes = ab.Probes(knob=lambda arm: ab.knob_seen(arm, KNOB, {KNOB: arm["knobs"][KNOB]}, "test"),
                       prefill_tokens=lambda: counter[0])          # never moves
    with pytest.raises(UserError, match="prefill not touched"):
        ab.measure(ab.Harness(lambda arm: None, lambda: None, "http://x", probes, _fake_load([])),
                   ab.Design([64], 2, requests=10), arms=_arms(), knob=KNOB, role="decode")
    doc = ab.measure(ab.Harness(lambda arm: None, lambda: None, "http://x", probes, _fake_load([])),
                     ab.Design([64], 2, requests=10, keep_invalid=True), arms=_arms(), knob=KNOB, role="decode")
    assert doc.judgement.levels[0].verdict == "invalid"
    assert all(r.prefill_prompt_tokens == 0 and r.knob_seen.status == "carried" for r in doc.runs)


def test_ab_run_candidate_process_without_the_knob_is_invalid():
    running = {"A": None, "B": None}                # the candidate's engine came up without the value
    probes = ab.Probes(knob=lambda arm: ab.knob_seen(arm, KNOB, {KNOB: running["B"]}, "started.sh"))
    doc = ab.measure(ab.Harness(lambda arm: None, lambda: None, "http://x", probes, _fake_load([])),
                     ab.Design([64, 96], 2, requests=10, keep_invalid=True), arms=_arms(), knob=KNOB, role="decode")
    assert {lv.verdict for lv in doc.judgement.levels} == {"invalid"}
    assert "did not carry the knob (started.sh: SGLANG_SM120_MMA_TARGET_CTAS=(unset), arm wants 512)" in \
        doc.judgement.levels[0].invalid[0]


# ---------------------------------------------------------------- the catalog, secrets, bad numbers

def _kernel_doc():
    return json.loads(KERNEL_FILE.read_text())


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(knob="NO_SUCH_KNOB") or [a["knobs"].update({"NO_SUCH_KNOB": a["knobs"].pop(
        "KNOBKEEPER_SPLITKV_TARGET_CTAS")}) for a in d["arms"].values()], "unknown knob 'NO_SUCH_KNOB'"),
    (lambda d: d["arms"]["B"]["knobs"].update(KNOBKEEPER_SPLITKV_TARGET_CTAS=10 ** 9), "arms.B.knobs"),
    (lambda d: d.update(role="router"), "role: 'router'"),
])
def test_kernels_file_knob_role_and_values_are_checked_like_knob(project, tmp_path, edit, needle):
    doc = _kernel_doc()
    edit(doc)
    head = _head(project)
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        store.import_files(project, baseline=[_write_json(tmp_path / "k.json", doc)], candidate=[],
                           role="decode", fmt="kernels")
    assert _nothing_written(project, head)


def test_kernels_file_with_a_secret_knob_is_refused_and_never_shown(project, tmp_path):
    secret = "hf_plaintext_never_in_git_123"
    doc = _kernel_doc()
    doc["knob"] = "HF_TOKEN"
    doc["arms"] = {"A": {"label": "baseline", "knobs": {"HF_TOKEN": None}},
                   "B": {"label": "candidate", "knobs": {"HF_TOKEN": secret}}}
    head = _head(project)
    out = CliRunner().invoke(ab_group, ["import", "--repo", str(project.root), "--baseline",
                                  _write_json(tmp_path / "k.json", doc), "--role", "decode", "--format", "kernels"])
    assert out.exit_code == 2 and "secret knob" in out.output and secret not in out.output
    assert "\n" not in out.output.strip()
    assert _nothing_written(project, head)
    log = subprocess.run(["git", "-C", str(project.root), "log", "-p", "--all"], capture_output=True, text=True).stdout
    assert secret not in log


@pytest.mark.parametrize("value", [0.0, -5.0, float("nan")])
def test_kernels_file_with_bad_throughput_is_one_line_exit_2(project, tmp_path, value):
    doc = _kernel_doc()
    doc["runs"][3]["output_tokens_per_s"] = value
    path = tmp_path / "k.json"
    path.write_text(json.dumps(doc))              # json writes NaN as NaN, as Python's json does
    head = _head(project)
    out = CliRunner().invoke(ab_group, ["import", "--repo", str(project.root), "--baseline", str(path), "--role", "decode"])
    assert out.exit_code == 2, out.output
    assert "\n" not in out.output.strip() and "runs[3]" in out.output and str(path) in out.output
    assert _nothing_written(project, head)


def test_kernels_file_with_nan_in_any_field_is_refused(project, tmp_path):
    doc = _kernel_doc()
    doc["runs"][0]["bandwidth_gbps"] = float("nan")
    out = CliRunner().invoke(ab_group, ["import", "--repo", str(project.root), "--baseline",
                                  _write_json(tmp_path / "k.json", doc), "--role", "decode"])
    assert out.exit_code == 2 and "runs[0].bandwidth_gbps" in out.output and "NaN" in out.output


def test_sglang_unlimited_max_concurrency_infinity_is_one_line(project, tmp_path):
    recs = _lines("sglang_unset.jsonl")
    recs[0]["max_concurrency"] = float("inf")       # written by Python's json as Infinity
    path = _write_jsonl(tmp_path / "inf.jsonl", recs)
    assert "Infinity" in Path(path).read_text()
    out = _import(project, [path], [str(DATA / "sglang_ctas512.jsonl")])
    assert out.exit_code == 2 and "\n" not in out.output.strip()
    assert "line 1: max_concurrency" in out.output and "unlimited concurrency" in out.output


@pytest.mark.parametrize("ident", ["**", "*", "5e*", "[0-9]", "../x"])
def test_evidence_ids_are_literal_prefixes_never_globs(project, ident):
    store.import_files(project, baseline=[str(DATA / "sglang_unset.jsonl")],
                       candidate=[str(DATA / "sglang_ctas512.jsonl")], role="decode", knob=f"{KNOB}=512")
    with pytest.raises(UserError, match="expected hex digits"):
        store.find(project, ident)
    out = CliRunner().invoke(ab_group, ["show", ident, "--repo", str(project.root)])
    assert out.exit_code == 2 and "\n" not in out.output.strip() and "Traceback" not in out.output


# ---------------------------------------------------------------- verify, old files

def _imported(project):
    return store.import_files(project, baseline=[str(DATA / "sglang_unset.jsonl")],
                              candidate=[str(DATA / "sglang_ctas512.jsonl")], role="decode", knob=f"{KNOB}=512")


def test_verify_recomputes_the_judgement_and_names_each_mismatch(project):
    doc = _imported(project)
    assert store.verify(doc) == []
    bad = copy.deepcopy(doc)
    level = bad.judgement.levels[0]
    level.effect = 0.5
    bad.judgement.levels[1].verdict = "worse"
    bad.judgement.levels[2].p_adjusted = 1e-9
    problems = store.verify(bad)
    assert any(p.startswith("stored effect +50.0% at 64 but the runs give +1") for p in problems), problems
    assert any(p.startswith("stored verdict worse at 80 but the runs give better, CI +") for p in problems)
    assert any(p.startswith("stored p_adjusted 1e-09 at 96") for p in problems)
    tampered_runs = copy.deepcopy(doc)
    for run in tampered_runs.runs:
        if run.arm == "B" and run.concurrency == 64:
            run.output_tokens_per_s = 1000.0 * (1 + 0.03 * run.repeat)
        if run.arm == "A" and run.concurrency == 64:
            run.output_tokens_per_s = 1000.0 * (1 + 0.031 * run.repeat)
    assert any("stored verdict better at 64 but the runs give" in p for p in store.verify(tampered_runs))
    nan = copy.deepcopy(doc)
    nan.runs[2].ttft_ms["p99"] = math.nan
    assert store.verify(nan) == ["runs[2].ttft_ms.p99: nan (not a finite number)"]


def test_verify_checks_the_sequential_looks_recorded():
    load = _fake_load([])
    doc = ab.measure(ab.Harness(lambda arm: None, lambda: None, "http://x", load=load),
                     ab.Design([64], max_repeats=5, requests=10), arms=_arms(), knob=KNOB, role="decode")
    assert doc.sequential.looks and store.verify(doc) == []
    bad = copy.deepcopy(doc)
    bad.sequential.max_repeats = 50          # another spending plan gives other p-values
    assert store.verify(bad)


def _schema_1(doc) -> dict:
    old = {k: v for k, v in doc.to_json().items() if k not in ("validity", "sequential")}
    old["schema"] = SCHEMA_1
    old["judgement"] = judge.judge(doc.runs, doc.metric, adjust=False).to_json()
    for run in old["runs"]:
        run.pop("knob_seen", None)
        run.pop("tpot_ms", None)
    return old


def test_schema_1_files_still_load_and_say_unadjusted(project):
    doc = _schema_1(_imported(project))
    assert validate(doc) == [] and "p_adjusted" not in doc["judgement"]["levels"][0]
    path = next((project.root / "changelog" / "evidence").glob("*.json"))
    path.write_text(json.dumps(doc, indent=2))
    loaded = store.load(project, doc["id"])
    assert loaded.schema == SCHEMA_1 and store.verify(loaded) == []
    assert "better, unadjusted" in store.summary_line(loaded)
    assert all(g.adjusted is False and g.p_adjusted is None for g in store.gains(loaded))
    out = CliRunner().invoke(ab_group, ["show", doc["id"], "--repo", str(project.root)])
    assert out.exit_code == 0 and "unadjusted" in out.output, out.output
    assert [r.id for r in store.list_all(project)] == [doc["id"]]
    # rejudged by today's method, it becomes schema 2 with a family
    again = store.rejudge(loaded)
    assert again.schema == "knobkeeper.evidence/2" and again.judgement.family.method == "holm"


def test_schema_2_show_has_raw_and_adjusted_p_and_guards(project):
    doc = _imported(project)
    out = CliRunner().invoke(ab_group, ["show", doc.id, "--repo", str(project.root)])
    assert out.exit_code == 0, out.output
    assert "p adj" in out.output and "family-wise alpha 0.05 over 15 tests" in out.output
    assert "p99 TTFT" in out.output and "median TPOT" in out.output
    level = doc.judgement.levels[0]
    assert level.p_adjusted >= level.p_value
    assert doc.judgement.family.to_json() == {"method": "holm", "alpha": 0.05, "size": 15,
                                              "weights": {"throughput": 0.8, "guards": 0.2}, "sequential": False}
