"""Issue 24: the files today's benchmark tools write, read as evidence. Every fixture under
tests/data/bench_formats/<tool>-<version>/ was written by the real tool against the local sim stack
(bench/bench_format_fixtures.py; each folder's COMMAND.md has the commands, version and date), for a
baseline arm and a candidate that LOSES requests (the sim's fault injection by knob value), at two
levels. The tool's printed summary sits beside each file (`*.stdout.txt`): throughput and request
counts are checked against what the tool printed, not against numbers copied into this test."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper.cli.ab import ab
from knobkeeper.errors import UserError
from knobkeeper.evidence import importers

DATA = Path(__file__).resolve().parent / "data" / "bench_formats"
LEVELS = [2, 8]
PROMPTS = 16            # per level and run (bench_format_fixtures.py PROMPTS)
ARMS = ("baseline", "candidate")
KNOB = "KNOBKEEPER_SPLITKV_TARGET_CTAS"
VLLM = ("vllm-0.32.0", "vllm-0.33.0")


def _printed(text: str, label: str) -> str:
    """The value the tool printed after `label` in its result summary (sglang's and vllm's
    "Label:   value" lines after "Serving Benchmark Result")."""
    text = text[text.index("Serving Benchmark Result"):]
    found = re.findall(rf"^{re.escape(label)}\s+(\S+)", text, re.M)
    assert len(found) == 1, f"{label!r}: {found}"
    return found[0]


def _table(text: str, title: str) -> dict[int, list[str]]:
    """{level: cells} of one of guidellm's console tables (rows `| concurrent@N | ... |`)."""
    part = text[text.index(title):]
    part = part[:part.index("\n\n")]
    rows = {}
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"concurrent@(\d+)", cells[0])
        if m:
            rows[int(m[1])] = cells[1:]
    return rows


def _aiperf_printed(text: str, metric: str) -> str:
    """The avg aiperf printed for `metric` in its console table (profile_export_console.txt)."""
    rows = [line for line in text.splitlines() if re.match(rf"^[│┃]\s*{re.escape(metric)}\s*[│┃]", line)]
    assert len(rows) == 1, (metric, rows)
    return rows[0].split("│")[2].strip().replace(",", "")


def _decimals(printed: str) -> int:
    return len(printed.split(".")[1]) if "." in printed else 0


def _assert_counts(run: dict, *, lost: bool) -> None:
    """Finished + failed = requested = the prompts sent; the baseline lost none. (The candidate fails
    each request with probability 0.2: a level of 16 may by chance lose none, aiperf's level 2 did;
    `_assert_lost` checks the arm.)"""
    assert run["errors_recorded"] is True
    assert run["requested"] == PROMPTS and run["completed"] + run["errors"] == PROMPTS
    assert run["errors"] >= 0 if lost else run["errors"] == 0, run


def _assert_lost(runs: list[dict]) -> None:
    """The candidate arm lost requests (the sim failed ~20% of them)."""
    assert sum(r["errors"] for r in runs) > 0, [(r["concurrency"], r["errors"]) for r in runs]


# ---------------------------------------------------------------- sglang bench_serving 0.5.23

@pytest.mark.parametrize("arm", ARMS)
def test_sglang_0_5_23_levels_in_one_file_keep_their_own_counts(arm):
    here = DATA / "sglang-0.5.23"
    fmt, imp = importers.read(here / f"{arm}.jsonl")
    assert fmt == "sglang" and imp.tool == "sglang bench_serving 0.5.23" and imp.tool_version == "0.5.23"
    assert [r["concurrency"] for r in imp.runs] == LEVELS
    for run in imp.runs:
        out = (here / f"{arm}-c{run['concurrency']}.stdout.txt").read_text()
        shown = _printed(out, "Output token throughput (tok/s):")
        assert round(run["output_tokens_per_s"], _decimals(shown)) == float(shown)
        assert run["completed"] == int(_printed(out, "Successful requests:"))
        # the plain line has no failed and no num_prompts: nothing to count lost requests from
        assert run["errors"] is None and run["requested"] is None and run["errors_recorded"] is False
    assert not imp.errors_recorded
    assert imp.notes[0].startswith("errors: not recorded by sglang bench_serving 0.5.23")
    if arm == "candidate":   # it lost requests, and each level counted its own (not the last line's)
        assert all(r["completed"] < PROMPTS for r in imp.runs)
    assert imp.setup["dataset"] == "random-ids" and imp.setup["api"] == "generate"
    assert (imp.setup["input_len"], imp.setup["output_len"]) == (64, 32)


@pytest.mark.parametrize("arm", ARMS)
def test_sglang_output_details_count_lost_requests(arm):
    here = DATA / "sglang-0.5.23"
    _, imp = importers.read(here / f"{arm}-details.jsonl")
    assert [r["concurrency"] for r in imp.runs] == LEVELS
    for run in imp.runs:
        out = (here / f"{arm}-details-c{run['concurrency']}.stdout.txt").read_text()
        assert run["completed"] == int(_printed(out, "Successful requests:"))
        _assert_counts(run, lost=arm == "candidate")
    if arm == "candidate":
        _assert_lost(imp.runs)
    assert imp.errors_recorded and imp.notes == ["errors: counted from --output-details"]


def test_sglang_default_file_name_holds_num_prompts(tmp_path):
    """Without --output-file sglang names the file <backend>_<MMDD>_<num_prompts>_<in>_<out>.jsonl:
    the prompts asked for, so the lost ones can be counted (the content here is the real file's)."""
    named = tmp_path / f"sglang_1201_{PROMPTS}_64_32.jsonl"
    shutil.copy(DATA / "sglang-0.5.23" / "candidate.jsonl", named)
    _, imp = importers.read(named)
    for run in imp.runs:
        _assert_counts(run, lost=True)
    _assert_lost(imp.runs)
    assert imp.notes == ["errors: counted from the num_prompts in sglang's default file name"]
    other = tmp_path / f"sglang_1201_{PROMPTS}_128_32.jsonl"   # another length: not this file's name
    shutil.copy(DATA / "sglang-0.5.23" / "candidate.jsonl", other)
    assert importers.read(other)[1].errors_recorded is False


# ---------------------------------------------------------------- vllm bench serve 0.32 / 0.33

@pytest.mark.parametrize("tool", VLLM)
@pytest.mark.parametrize("arm", ARMS)
def test_vllm_bench_serve(tool, arm):
    here = DATA / tool
    runs = []
    for level in LEVELS:
        fmt, imp = importers.read(here / f"{arm}-c{level}.json")
        out = (here / f"{arm}-c{level}.stdout.txt").read_text()
        [run] = imp.runs
        assert fmt == "vllm" and run["concurrency"] == level == int(_printed(out, "Maximum request concurrency:"))
        shown = _printed(out, "Output token throughput (tok/s):")
        assert round(run["output_tokens_per_s"], _decimals(shown)) == float(shown)
        assert run["completed"] == int(_printed(out, "Successful requests:"))
        assert run["errors"] == int(_printed(out, "Failed requests:"))
        _assert_counts(run, lost=arm == "candidate")
        runs.append(run)
        assert imp.setup["model"] == "knobkeeper-sim" and imp.setup["api"] == "completions"
        assert imp.tool_version is None and imp.notes == []   # the file names no version (--metadata can)
    if arm == "candidate":
        _assert_lost(runs)


# ---------------------------------------------------------------- guidellm 0.8.1

@pytest.mark.parametrize("arm", ARMS)
def test_guidellm_0_8_1_request_totals(arm):
    here = DATA / "guidellm-0.8.1"
    fmt, imp = importers.read(here / f"{arm}.json")
    out = (here / f"{arm}.stdout.txt").read_text()
    assert fmt == "guidellm" and imp.tool == "guidellm 0.8.1" and imp.tool_version == "0.8.1"
    assert [r["concurrency"] for r in imp.runs] == LEVELS
    throughput = _table(out, "Server Throughput Statistics")
    summary = _table(out, "Run Summary Info")
    for run in imp.runs:
        shown = throughput[run["concurrency"]][4]          # Output Tokens Per Sec, mean over all requests
        assert round(run["output_tokens_per_s"], _decimals(shown)) == float(shown)
        comp, inc, err = (int(x) for x in summary[run["concurrency"]][5:8])
        assert (run["completed"], run["incomplete"], run["errors"]) == (comp, inc, err)
        _assert_counts(run, lost=arm == "candidate")
    if arm == "candidate":
        _assert_lost(imp.runs)
    assert imp.setup["model"] == "knobkeeper-sim" and imp.setup["api"] == "chat"
    assert (imp.setup["input_len"], imp.setup["output_len"], imp.setup["dataset"]) == (64, 32, "synthetic_text")


# ---------------------------------------------------------------- aiperf 0.13.0

AIPERF = DATA / "aiperf-0.13.0"


@pytest.mark.parametrize("arm", ARMS)
def test_aiperf_0_13_0_per_level_files_and_the_directory(arm):
    files = sorted((AIPERF / arm).glob("concurrency_*/profile_export_aiperf.json"))
    assert [f.parent.name for f in files] == [f"concurrency_{c}" for c in LEVELS]
    runs = []
    for path, level in zip(files, LEVELS):
        fmt, imp = importers.read(path)
        [run] = imp.runs
        assert fmt == "aiperf" and imp.tool == "aiperf 0.13.0" and run["concurrency"] == level
        out = (path.parent / "profile_export_console.txt").read_text()   # what aiperf printed for this level
        shown = _aiperf_printed(out, "Output Token Throughput (tokens/sec)")
        assert round(run["output_tokens_per_s"], _decimals(shown)) == float(shown)
        assert run["completed"] == float(_aiperf_printed(out, "Request Count (requests)"))
        assert run["requested"] == float(_aiperf_printed(out, "Completed Requests (Success + Error)"))
        _assert_counts(run, lost=arm == "candidate")
        # aiperf's own summaries of the same run say the same
        agg = AIPERF / arm / "aggregate" / f"concurrency_{level}" / "profile_export_aiperf_aggregate.json"
        [same] = importers.read(agg)[1].runs
        assert {k: same[k] for k in ("concurrency", "output_tokens_per_s", "completed", "errors", "requested")} == \
               {k: run[k] for k in ("concurrency", "output_tokens_per_s", "completed", "errors", "requested")}
        runs.append(run)
    if arm == "candidate":
        _assert_lost(runs)
    fmt, whole = importers.read(AIPERF / arm)     # the --artifact-dir as one argument
    assert fmt == "aiperf" and [r["concurrency"] for r in whole.runs] == LEVELS
    assert whole.files == files and whole.tool_version == "0.13.0"
    assert whole.setup["model"] == "knobkeeper-sim"
    assert (whole.setup["input_len"], whole.setup["output_len"]) == (64, 32)
    assert importers.expand([str(AIPERF / arm)]) == [str(f) for f in files]
    _, sweep = importers.read(AIPERF / arm / "sweep_aggregate" / "profile_export_aiperf_sweep.json")
    assert [(r["concurrency"], r["output_tokens_per_s"], r["errors"]) for r in sweep.runs] == \
           [(r["concurrency"], r["output_tokens_per_s"], r["errors"]) for r in whole.runs]


def test_aiperf_directory_whose_summaries_disagree_is_refused(tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(AIPERF / "baseline", copy)
    other = AIPERF / "candidate" / "sweep_aggregate" / "profile_export_aiperf_sweep.json"
    shutil.copy(other, copy / "sweep_aggregate" / other.name)   # the other arm's sweep file
    with pytest.raises(UserError, match=r"profile_export_aiperf_sweep.json: .* at 2, but the directory's results"):
        importers.read(copy)


# ---------------------------------------------------------------- through `ab import`

def _import(project, base: list[str], cand: list[str], *extra: str):
    return CliRunner().invoke(ab, ["import", "--repo", str(project.root), "--baseline", *base, "--candidate", *cand,
                                   "--role", "decode", "--knob", f"{KNOB}=7", "--keep-invalid", "--json", *extra])


def _head(project) -> str:
    return subprocess.run(["git", "-C", str(project.root), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.parametrize("tool,base,cand", [
    ("vllm-0.32.0", ["baseline-c2.json", "baseline-c8.json"], ["candidate-c2.json", "candidate-c8.json"]),
    ("vllm-0.33.0", ["baseline-c2.json", "baseline-c8.json"], ["candidate-c2.json", "candidate-c8.json"]),
    ("guidellm-0.8.1", ["baseline.json"], ["candidate.json"]),
    ("aiperf-0.13.0", ["baseline"], ["candidate"]),
    ("sglang-0.5.23", ["baseline-details.jsonl"], ["candidate-details.jsonl"]),
])
def test_import_carries_the_candidates_lost_requests(project, tool, base, cand):
    """Today's import path stores the failed requests a file records: the candidate's errors reach
    the evidence runs (and its error-rate gate), the baseline's zero is a recorded zero."""
    out = _import(project, [str(DATA / tool / f) for f in base], [str(DATA / tool / f) for f in cand])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    runs = {(r["arm"], r["concurrency"]): r for r in doc["runs"]}
    assert sorted({c for _, c in runs}) == LEVELS
    for level in LEVELS:
        # a recorded count: an int, and no `not_recorded` naming a tool that could not tell
        assert runs["A", level]["errors"] == 0 and "not_recorded" not in runs["A", level]
        assert "not_recorded" not in runs["B", level] and "errors_recorded" not in runs["B", level]
        assert runs["B", level]["completed"] + runs["B", level]["errors"] == PROMPTS
    assert sum(runs["B", level]["errors"] for level in LEVELS) > 0
    # the candidate failed ~20% of its requests: the validity gate (error rate above 5%) names it
    reasons = " ".join(r for lv in doc["validity"]["levels"] for r in lv["reasons"])
    assert "error rate" in reasons
    assert doc["source"]["tool"].startswith(tool.split("-")[0])
    assert len(doc["source"]["raw_files"]) == sum(len(importers.expand([str(DATA / tool / f)])) for f in base + cand)


def test_import_of_a_file_that_does_not_record_errors_says_so(project):
    here = DATA / "sglang-0.5.23"
    out = CliRunner().invoke(ab, ["import", "--repo", str(project.root), "--baseline", str(here / "baseline.jsonl"),
                                  "--candidate", str(here / "candidate.jsonl"), "--role", "decode",
                                  "--knob", f"{KNOB}=7"])
    assert out.exit_code == 0, out.output
    assert "note: errors: not recorded by sglang bench_serving 0.5.23" in out.output
    ident = out.output.split()[1]
    [path] = (project.root / "changelog" / "evidence").glob(f"*-{ident}.json")
    doc = json.loads(path.read_text())
    # errors unknown, never a silent 0: null, with the tool that did not record them named
    by = "sglang bench_serving 0.5.23"
    assert all(r["errors"] is None and r["not_recorded"] == {"errors": by} for r in doc["runs"])
    assert doc["source"]["tool"] == by
    # the errors gate was NOT applied (said per level), not passed with 0
    for row in doc["validity"]["levels"]:
        assert row["not_applied"] == [f"errors gate not applied: errors not recorded by {by}"]
    # the setup the file carries: model, lengths, dataset, the tool and its version
    setup = doc["setup"]
    assert setup["bench_tool"] == "sglang bench_serving" and setup["bench_version"] == "0.5.23"
    assert setup.get("model") is None and setup["workload"]["dataset"] == "random-ids"   # the line has no model
    assert (setup["workload"]["input_len"], setup["workload"]["output_len"]) == (64, 32)
    shown = CliRunner().invoke(ab, ["show", ident, "--repo", str(project.root)])
    assert shown.exit_code == 0, shown.output
    assert f"errors: not recorded by {by}" in shown.output
    assert "random-ids 64 in / 32 out tokens" in shown.output
    assert f"measured by {by}" in shown.output
    # review and the report say the same
    from knobkeeper.evidence.model import Evidence
    from knobkeeper.review import markdown

    lines: list[str] = []
    markdown._evidence_doc(ident, Evidence.from_json(doc), lines.append)
    text = "\n".join(lines)
    assert f"errors: not recorded by {by}" in text and f"measured by {by}" in text
    from knobkeeper.report import page

    html = page._evidence_block(Evidence.from_json(doc))
    assert f"errors: not recorded by {by}" in html and "random-ids 64 in / 32 out tokens" in html


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing written

def _copy(tmp_path: Path, src: Path, name: str | None = None, edit=None) -> str:
    target = tmp_path / (name or src.name)
    if edit is None:
        shutil.copy(src, target)
    else:
        doc = json.loads(src.read_text())
        edit(doc)
        target.write_text(json.dumps(doc))
    return str(target)


def _set(path: list, value):
    def edit(doc):
        obj = doc
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return edit


def _bad_cases(tmp_path: Path) -> list[tuple[list[str], list[str], str, str]]:
    """(baseline files, extra options, what the line must name, the file it must name)."""
    vllm = DATA / "vllm-0.32.0" / "baseline-c2.json"
    guide = DATA / "guidellm-0.8.1" / "baseline.json"
    aiperf = AIPERF / "baseline" / "concurrency_2" / "profile_export_aiperf.json"
    truncated = tmp_path / "truncated.json"
    truncated.write_text(guide.read_text()[:5000])
    (tmp_path / "empty-dir").mkdir()
    unlimited = _copy(tmp_path, vllm, "unlimited.json", _set(["max_concurrency"], None))
    old_guidellm = _copy(tmp_path, guide, "old.json", _set(["metadata", "guidellm_version"], "0.7.9"))
    no_requests = _copy(tmp_path, guide, "none.json", lambda d: d["benchmarks"][0]["metrics"]["request_totals"].update(
        successful=0, errored=0, incomplete=0, total=0))
    no_phases = _copy(tmp_path, aiperf, "nophases.json", lambda d: d["input_config"].pop("phases"))
    return [
        ([str(guide)], ["--format", "vllm"], "--format vllm, but this is a guidellm benchmarks.json", str(guide)),
        ([str(truncated)], [], "truncated?", str(truncated)),
        ([unlimited], [], "max_concurrency: expected a positive integer concurrency, got None (unlimited", unlimited),
        ([str(tmp_path / "empty-dir")], [], "no aiperf result in it", str(tmp_path / "empty-dir")),
        ([str(guide), old_guidellm], [], "guidellm 0.7.9 in --baseline, but", old_guidellm),
        ([no_requests], [], "metrics.request_totals.total: 0 requests", no_requests),
        ([no_phases], [], "aiperf 0.13.0: input_config.phases: missing", no_phases),
    ]


def test_bad_input_is_one_line_exit_2_and_nothing_written(project, tmp_path):
    head = _head(project)
    cand = [str(DATA / "guidellm-0.8.1" / "candidate.json")]
    for base, extra, needle, named in _bad_cases(tmp_path):
        out = _import(project, base, cand, *extra)
        line = out.output.strip()
        assert out.exit_code == 2 and "\n" not in line and needle in line and named in line, (needle, out.output)
    assert _head(project) == head
    assert [p.name for p in (project.root / "changelog" / "evidence").iterdir()] == [".gitkeep"]


def test_a_shape_the_reader_does_not_know_names_tool_version_and_field(tmp_path):
    aiperf = AIPERF / "baseline" / "concurrency_2" / "profile_export_aiperf.json"
    newer = _copy(tmp_path, aiperf, "newer.json", lambda d: (d.update(aiperf_version="0.14.0"),
                                                              d["input_config"].pop("phases")))
    with pytest.raises(UserError, match=r"newer.json: aiperf 0.14.0: input_config.phases: missing .*"
                                        r"a shape this reader does not know"):
        importers.read(newer)
