"""One schema per record, declared once (knobkeeper/declared.py): the checks the tool makes and the
JSON Schema it documents (docs/schemas/) come from the same declaration, so they accept and refuse
the same files; the committed schema files are what the declarations give today; deploy records and
the canary's marker read through their declarations, older shapes included. No process is started
beyond the CLI in-process."""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from knobkeeper.cli import main
from knobkeeper.declared import Declared, declared, extra_field, fact, json_schema
from knobkeeper.deploy import canary_state
from knobkeeper.deploy.canary_state import CanaryMarker
from knobkeeper.deploy.record import DeployRecord, Gate, ServiceRow, read_record
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.evidence.model import Arm, SweepPlan
from knobkeeper.evidence.schema import validate
from knobkeeper.review import schemas

ROOT = Path(__file__).resolve().parents[1]
KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def _evidence() -> dict:
    rng = random.Random(3)
    runs = [{"arm": arm, "repeat": rep, "concurrency": conc, "errors": 0, "bandwidth_gbps": 800.0,
             "output_tokens_per_s": 1000.0 * (1.1 if arm == "B" else 1) * math.exp(rng.gauss(0, 0.01))}
            for conc in (64, 96) for arm in "AB" for rep in range(1, 5)]
    return store.build_doc(knob=KNOB, role="decode", runs=runs,
                           arms={"A": {"label": "baseline", "knobs": {KNOB: None}},
                                 "B": {"label": "candidate", "knobs": {KNOB: 512}}}).to_json()


def _documented(name: str):
    return jsonschema.Draft202012Validator(json.loads((ROOT / "docs" / "schemas" / f"{name}.json").read_text()))


def test_the_committed_schema_files_are_what_the_declarations_give():
    assert schemas.stale_files(ROOT / "docs" / "schemas") == [], "run `knobkeeper schema --write docs/schemas`"
    for name in schemas.RECORDS:
        jsonschema.Draft202012Validator.check_schema(schemas.schema_of(name))


def test_a_declaration_changed_makes_its_committed_schema_stale(tmp_path):
    schemas.write_files(tmp_path)
    assert schemas.stale_files(tmp_path) == []
    path = tmp_path / "sweep-plan.json"
    data = json.loads(path.read_text())
    del data["$defs"]["SweepPlan"]["properties"]["delta"]     # what an edit of the declaration alone would leave
    path.write_text(json.dumps(data, indent=2) + "\n")
    assert schemas.stale_files(tmp_path) == ["sweep-plan"]


# (an edit of a valid evidence file, the problem validate names first)
BAD_EVIDENCE = [
    (lambda d: d.pop("knob"), "knob: expected a non-empty string"),
    (lambda d: d["arms"].pop("B"), "arms: expected an object with exactly the arms A (baseline) and B (candidate)"),
    (lambda d: d["arms"]["A"].update(knobs=[]), "arms.A.knobs: expected an object of knob values"),
    (lambda d: d["runs"][1].update(arm="C"), "runs[1].arm: expected 'A' or 'B'"),
    (lambda d: d["runs"][2].update(output_tokens_per_s=-1), "runs[2].output_tokens_per_s: expected a finite number >= 0, got -1"),
    (lambda d: d["runs"][0].update(errors=None), "runs[0].errors: expected an integer"),
    (lambda d: d["runs"][0].update(repeat="1"), "runs[0].repeat: expected an integer"),
    (lambda d: d["judgement"]["levels"][0].update(verdict="great"), "judgement.levels[0].verdict: expected one of better,"),
    (lambda d: d["judgement"]["levels"][0].update(n_a="4"), "judgement.levels[0].n_a: expected an integer"),
    (lambda d: d.update(sequential={"looks": 3}), "sequential.looks: expected a list"),
    (lambda d: d.update(judge_options={"alpha": 0}), "judge_options: expected"),
    (lambda d: d.update(rejudges="not-hex"), "rejudges: expected the hex id of the evidence it re-judges, got 'not-hex'"),
    (lambda d: d["setup"].update(workload=[]), "setup.workload: expected an object"),
    (lambda d: d.update(schema="knobkeeper.evidence/9"), "schema: expected 'knobkeeper.evidence/2' (or 'knobkeeper.evidence/1'), got"),
]


def test_validate_and_the_documented_schema_accept_a_file_the_tool_writes():
    data = _evidence()
    assert validate(data) == []
    assert list(_documented("evidence").iter_errors(data)) == []
    # a count a tool could not tell: null, with the tool named; the same file without the name is refused by both
    data["runs"][0].update(errors=None, not_recorded={"errors": "sglang.bench_serving 0.5.23"})
    assert validate(data) == [] and list(_documented("evidence").iter_errors(data)) == []


@pytest.mark.parametrize("edit,problem", BAD_EVIDENCE)
def test_validate_and_the_documented_schema_refuse_the_same_edits(edit, problem):
    data = _evidence()
    edit(data)
    found = validate(data)
    assert found and found[0].startswith(problem), found
    assert list(_documented("evidence").iter_errors(data)), f"the documented schema accepts what validate refuses: {problem}"


def test_one_problem_per_field_in_the_order_of_the_declaration():
    data = _evidence()
    data["runs"][3]["output_tokens_per_s"] = "fast"           # the type check and the metric rule: named once
    del data["id"]
    assert validate(data) == ["id: expected a non-empty string",
                              "runs[3].output_tokens_per_s: expected a finite number >= 0, got 'fast'"]


def test_read_is_one_pass_that_gives_the_typed_evidence_and_its_problems():
    from knobkeeper.evidence.schema import read

    data = _evidence()
    doc, problems = read(data)
    assert problems == [] and doc.to_json() == data and doc.runs[0].extra == {"bandwidth_gbps": 800.0}
    bad = copy.deepcopy(data)
    bad["runs"][0]["concurrency"] = None
    assert read(bad)[1] == ["runs[0].concurrency: expected an integer"]


@declared
class Inner(Declared):
    n: int = fact(0, required=True)
    extra: dict = extra_field()


@declared
class Outer(Declared):
    parts: dict[str, Inner] = fact(factory=dict)
    extra: dict = extra_field()


def test_a_declared_part_refuses_a_test_without_words_and_reads_nested_parts():
    with pytest.raises(TypeError, match="expected="):
        fact(0, test=lambda v, _: True)
    part, problems = Outer.read({"parts": {"x": {"n": 1}, "y": {}}, "other": [1]})
    assert problems == ["parts.y.n: expected an integer"]
    assert isinstance(part.parts["x"], Inner) and part.extra == {"other": [1]}
    schema = json_schema(Outer)
    assert schema["$defs"]["Inner"]["required"] == ["n"]
    assert schema["$defs"]["Outer"]["properties"]["parts"] == {"type": "object", "additionalProperties": {"$ref": "#/$defs/Inner"}}


def _record() -> dict:
    return DeployRecord(id="0a0a0a0a", inventory="local", inventory_path="inventory/local.py", commit="c" * 40,
                        dirty=False, allow_dirty=False, options={"restart": "changed"}, order=["prefill"],
                        started_at="2026-12-01T10:00:00.000000Z", finished_at="2026-12-01T10:00:03.000000Z",
                        result="ok", services=[ServiceRow(host="@local", service="p", role="prefill",
                                                          action="restarted", gate=Gate(result="passed"))]).to_json()


def test_a_deploy_record_reads_and_writes_back_the_same_and_the_documented_schema_agrees(tmp_path):
    data = _record()
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    record = read_record(path)
    assert record.text() == path.read_text()
    assert list(_documented("deploy-record").iter_errors(data)) == []
    for edit, problem in [(lambda d: d.update(result="maybe"), "result: expected one of running, ok, failed, interrupted"),
                          (lambda d: d["services"][0].pop("host"), "services[0].host: expected a string"),
                          (lambda d: d["services"][0]["gate"].update(result="green"), "services[0].gate.result: expected one of")]:
        bad = copy.deepcopy(data)
        edit(bad)
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
            read_record(path)
        assert list(_documented("deploy-record").iter_errors(bad))


def test_a_deploy_record_of_an_earlier_version_still_reads(tmp_path):
    data = _record()
    data["services"][0].update(gate="passed", changes=None, knobs=None, rollback="none")
    data["services"][0].pop("stopped_at")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    row = read_record(path).services[0]
    assert row.gate.result == "passed" and row.changes == [] and row.knobs == {} and row.rollback is None


def test_the_canary_marker_is_one_declaration_read_and_written_here(project):
    marker = CanaryMarker(knob=KNOB, value=512, role="decode", inventory="inventory/local.py",
                          services=["@local/knobkeeper-decode"], hosts=["@local"], phase="calibrating",
                          started_at="2026-12-01T10:00:00Z", seen_at="2026-12-01T10:00:00Z", pid=1)
    canary_state.write_marker(project, marker)
    assert canary_state.read_marker(project) == marker
    written = json.loads(canary_state.marker_path(project).read_text())
    assert "applied_at" not in written                       # no candidate deploy started: nothing to put back
    assert list(_documented("canary-marker").iter_errors(written)) == []
    canary_state.update_marker(project, phase="candidate", applied_at="2026-12-01T10:01:00Z")
    assert canary_state.read_marker(project).applied_at == "2026-12-01T10:01:00Z"
    canary_state.marker_path(project).write_text(json.dumps({**written, "phase": "sleeping"}))
    with pytest.raises(UserError, match=r"canary\.json: not a canary marker \(phase: expected one of calibrating"):
        canary_state.read_marker(project)
    canary_state.clear_marker(project)


def test_a_sweep_plan_is_checked_by_its_declaration():
    plan = SweepPlan(id="p1", created="2026-12-01T10:00:00Z", knob=KNOB, role="decode",
                     arms={"A": Arm(knobs={KNOB: 128}), "B": Arm(knobs={KNOB: 512})}, levels=[64])
    data = plan.to_json()
    assert SweepPlan.problems(data) == [] and list(_documented("sweep-plan").iter_errors(data)) == []
    data["arms"].pop("B")
    assert SweepPlan.problems(data) == ["arms: expected an object with the control A and at least one candidate"]


def test_a_committed_plan_file_is_read_through_its_declaration(tmp_path):
    plan = SweepPlan(id="p1", created="2026-12-01T10:00:00Z", knob=KNOB, role="decode",
                     arms={"A": Arm(knobs={KNOB: 128}), "B": Arm(knobs={KNOB: 512})}, levels=[64])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    assert store.read_plan(path, "changelog/plans/x.json") == plan
    path.write_text(json.dumps({**plan.to_json(), "schema": "knobkeeper.sweep-plan/0"}))
    with pytest.raises(UserError, match=r"^changelog/plans/x\.json: schema: expected 'knobkeeper\.sweep-plan/1', got"):
        store.read_plan(path, "changelog/plans/x.json")
    path.write_text(json.dumps({**plan.to_json(), "levels": ["64"]}))
    with pytest.raises(UserError, match=r"levels\[0\]: expected an integer"):
        store.read_plan(path, "changelog/plans/x.json")


def test_the_schema_command_prints_a_record_schema_and_refuses_an_unknown_name(tmp_path):
    def cli(*args):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    done = cli("schema", "canary-marker")
    assert done.exit_code == 0 and json.loads(done.output)["$ref"] == "#/$defs/CanaryMarker"
    listed = cli("schema")
    assert listed.exit_code == 0 and listed.output.split()[::2] == list(schemas.RECORDS)
    bad = cli("schema", "bogus")
    assert bad.exit_code == 2 and "one of evidence, deploy-record, canary-marker, experiment-marker, sweep-plan" in bad.output
    written = cli("schema", "--write", str(tmp_path))
    assert written.exit_code == 0 and schemas.stale_files(tmp_path) == []
