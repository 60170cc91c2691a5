"""`ab import`: every importer on files in the exact shape its tool writes, auto-detection, the
CLI, and errors that name the file and field and write nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper.cli.ab import ab
from knobkeeper.errors import UserError
from knobkeeper.evidence import importers
from knobkeeper.evidence import store
from knobkeeper.evidence.schema import validate

DATA = Path(__file__).resolve().parent / "data" / "bench_formats"
KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
KERNEL_FILE = DATA / "20261129T102000.000000Z-5eed0001.json"


def _files(pattern: str) -> list[str]:
    return [str(p) for p in sorted(DATA.glob(pattern))]


def _head(project) -> str:
    return subprocess.run(["git", "-C", str(project.root), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.parametrize("path,fmt,levels", [
    ("sglang_unset.jsonl", "sglang", [64, 80, 96] * 3),
    ("vllm_unset_c64_r1.json", "vllm", [64]),
    ("guidellm_unset_r1.json", "guidellm", [64, 80, 96]),
    ("aiperf_unset_c64_r1/profile_export_aiperf.json", "aiperf", [64]),
    (KERNEL_FILE.name, "kernels", [16, 16, 16, 64, 64, 64] * 2),
])
def test_each_format_is_detected_and_read(path, fmt, levels):
    detected, imp = importers.read(DATA / path)
    assert detected == fmt
    assert [r["concurrency"] for r in imp.runs] == levels
    for r in imp.runs:
        assert r["output_tokens_per_s"] > 0
        # a file that does not record failed requests says so; it never reads as 0 errors
        assert isinstance(r["errors"], int) if r.get("errors_recorded", True) else r["errors"] is None


def test_sglang_uses_configured_not_measured_concurrency_and_reads_latencies():
    _, imp = importers.read(DATA / "sglang_unset.jsonl", "sglang")
    r = imp.runs[0]
    assert r["concurrency"] == 64 and r["measured_concurrency"] < 64
    assert r["ttft_ms"]["p50"] == pytest.approx(80.1) and r["ttft_ms"]["p99"] == pytest.approx(140.2)
    assert r["itl_ms"]["mean"] > 0 and r["e2e_ms"]["p99"] > r["e2e_ms"]["p50"]
    assert imp.setup["api"] == "chat" and imp.setup["input_len"] == 1024 and imp.setup["output_len"] == 256


def test_vllm_infinity_request_rate_and_failed():
    raw = (DATA / "vllm_unset_c64_r1.json").read_text()
    assert "Infinity" in raw
    _, imp = importers.read(DATA / "vllm_unset_c64_r1.json")
    assert imp.runs[0]["errors"] == 0 and imp.setup["model"] == "Qwen/Qwen3-8B" and imp.setup["api"] == "chat"


def test_guidellm_latency_in_seconds_becomes_ms():
    _, imp = importers.read(DATA / "guidellm_unset_r1.json")
    r = imp.runs[0]
    assert r["e2e_ms"]["mean"] > 1000   # request_latency is seconds in guidellm
    assert r["ttft_ms"]["p90"] > r["ttft_ms"]["p50"] and r["completed"] == 640


def test_import_sglang_builds_judged_evidence_and_commits(project):
    doc = store.import_files(project, baseline=_files("sglang_unset.jsonl"), candidate=_files("sglang_ctas512.jsonl"),
                             role="decode", knob=f"{KNOB}=512")
    assert validate(doc) == []
    verdicts = {lv.concurrency: lv.verdict for lv in doc.judgement.levels}
    assert verdicts == {64: "better", 80: "better", 96: "better"}
    assert [lv.n_a for lv in doc.judgement.levels] == [3, 3, 3]
    assert any(a.arm == "A" and a.to_concurrency == 96 for a in doc.anomalies)
    assert doc.arms["A"].knobs == {KNOB: None} and doc.arms["B"].knobs == {KNOB: 512}
    assert doc.source.format == "sglang" and len(doc.source.raw_files) == 2
    for rel in doc.source.raw_files:
        assert (project.root / rel).exists()
    msg = subprocess.run(["git", "-C", str(project.root), "log", "-1", "--format=%B"], capture_output=True,
                         text=True).stdout
    assert msg.startswith(f"evidence: {KNOB}=512 on decode (+12.")
    assert f"Evidence: {doc.id}" in msg and f"Knob: {KNOB}" in msg and "Role: decode" in msg
    files = subprocess.run(["git", "-C", str(project.root), "show", "--name-only", "--format=", "HEAD"],
                           capture_output=True, text=True).stdout.split()
    assert len(files) == 3 and all(f.startswith("changelog/evidence/") for f in files)
    assert store.load(project, doc.id[:4]).id == doc.id


@pytest.mark.parametrize("base,cand,fmt,levels", [
    ("vllm_unset_*.json", "vllm_ctas512_*.json", "vllm", [64, 96]),
    ("guidellm_unset_*.json", "guidellm_ctas512_*.json", "guidellm", [64, 80, 96]),
    ("aiperf_unset_*/profile_export_aiperf.json", "aiperf_ctas512_*/profile_export_aiperf.json", "aiperf", [64]),
])
def test_import_other_formats(project, base, cand, fmt, levels):
    doc = store.import_files(project, baseline=_files(base), candidate=_files(cand), role="decode",
                             knob=f"{KNOB}=512", no_commit=True)
    assert [lv.concurrency for lv in doc.judgement.levels] == levels
    assert all(lv.effect > 0.04 for lv in doc.judgement.levels)
    assert doc.source.format == fmt


def test_import_kernels_rejudges_bench_output(project):
    doc = store.import_files(project, baseline=[str(KERNEL_FILE)], candidate=[], role="decode", fmt="kernels")
    assert doc.knob == "KNOBKEEPER_SPLITKV_TARGET_CTAS" and doc.id != "5eed0001"
    assert doc.arms["A"].knobs == {"KNOBKEEPER_SPLITKV_TARGET_CTAS": 256}
    assert [lv.verdict for lv in doc.judgement.levels] == ["better", "better"]
    assert doc.runs[0].extra["time_per_call_us"] > 0 and "bandwidth_gbps" in doc.runs[0].extra
    assert doc.setup.device == "NVIDIA H200"


def test_cli_import_with_several_files_per_option(project):
    out = CliRunner().invoke(ab, ["import", "--repo", str(project.root), "--baseline", *_files("vllm_unset_*.json"),
                                  "--candidate", *_files("vllm_ctas512_*.json"), "--role", "decode",
                                  "--knob", f"{KNOB}=512"])
    assert out.exit_code == 0, out.output
    ident = out.output.split()[1]
    doc = store.load(project, ident)
    assert [lv.n_a for lv in doc.judgement.levels] == [2, 2]
    assert "better" in out.output and "95% CI" in out.output


def test_cli_import_names_the_stack_measured(project):
    """`--stack vllm`: the evidence is of stack vllm's decode (setup.stack), the only role it backs;
    a stack no inventory names is refused, nothing written."""
    args = ["import", "--repo", str(project.root), "--baseline", *_files("vllm_unset_*.json"), "--candidate",
            *_files("vllm_ctas512_*.json"), "--role", "decode", "--knob", "NCCL_MIN_NCHANNELS=4"]
    head = _head(project)
    out = CliRunner().invoke(ab, [*args, "--stack", "vlm"])
    assert out.exit_code == 2 and "--stack: stack 'vlm': no inventory names it" in out.output and _head(project) == head
    out = CliRunner().invoke(ab, [*args, "--stack", "vllm"])
    assert out.exit_code == 0, out.output
    doc = store.load(project, out.output.split()[1])
    assert doc.setup.stack == "vllm" and doc.scope == "vllm.decode" and doc.backs("NCCL_MIN_NCHANNELS", "vllm.decode", 4) is None


@pytest.mark.parametrize("files,fmt,needle", [
    (["bad_sglang_unlimited.jsonl"], "auto", "line 1: max_concurrency"),
    (["bad_vllm_no_throughput.json"], "auto", "output_throughput: missing"),
    (["bad_unknown.json"], "auto", "unknown result format"),
    (["bad_guidellm_poisson.json"], "auto", "benchmarks[1].config.strategy.type_"),
    (["sglang_unset.jsonl"], "vllm", "this is a sglang bench_serving JSONL"),
    (["nonexistent.json"], "auto", "no such file"),
])
def test_bad_files_name_file_and_field_and_write_nothing(project, files, fmt, needle):
    head = _head(project)
    out = CliRunner().invoke(ab, ["import", "--repo", str(project.root), "--baseline", *[str(DATA / f) for f in files],
                                  "--candidate", *_files("sglang_ctas512.jsonl"), "--role", "decode",
                                  "--knob", f"{KNOB}=512", "--format", fmt])
    assert out.exit_code == 2, out.output
    line = out.output.strip()
    assert "\n" not in line and needle in line and files[0] in line
    assert _head(project) == head
    assert [p.name for p in (project.root / "changelog" / "evidence").iterdir()] == [".gitkeep"]


def test_bad_knob_is_rejected_before_writing(project):
    with pytest.raises(UserError, match="8192"):
        store.import_files(project, baseline=_files("sglang_unset.jsonl"), candidate=_files("sglang_ctas512.jsonl"),
                           role="decode", knob=f"{KNOB}=0")
    with pytest.raises(UserError, match="role 'prefill'"):
        store.import_files(project, baseline=_files("sglang_unset.jsonl"), candidate=_files("sglang_ctas512.jsonl"),
                           role="prefill", knob=f"{KNOB}=512")
    with pytest.raises(UserError, match="different formats"):
        store.import_files(project, baseline=_files("sglang_unset.jsonl"), candidate=_files("vllm_ctas512_c64_r1.json"),
                           role="decode", knob=f"{KNOB}=512")
    assert [p.name for p in (project.root / "changelog" / "evidence").iterdir()] == [".gitkeep"]
