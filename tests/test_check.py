"""`knobkeeper check`: the CI / pre-commit gate, on temporary infra repos. Each problem is one line,
`path: what is wrong; how to fix`; exit 1 on problems, 0 when clean, 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper import lint
from knobkeeper.changelog import ops
from knobkeeper.cli import main
from knobkeeper.deploy.record import load_records
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.knobs.catalog import fingerprint
from knobkeeper.report import write_report
from knobkeeper.review.check import check
from knobkeeper.timeutil import file_stem, parse_time
from tests.infra import cli, git, one_line_exit_2, snapshot
from tests.review_fixtures import KNOB, commit_all, ctas_runs, write_entry, write_evidence, write_incident


def kk(project, *args):
    return CliRunner().invoke(main, ["check", *args, "--repo", str(project.root)], catch_exceptions=False)


def lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.strip()]


def test_clean_repo_passes_and_says_which_linters_ran(project):
    result = kk(project)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("check: OK:") and "8 inventories" in out  # local, local_vllm, example_prod, example_prod_vllm, local_slurm, example_slurm, local_k8s, example_k8s
    for tool in ("bash -n", "shellcheck", "systemd-analyze verify"):
        assert (tool in out) if lint.available(tool.split()[0]) else (f"{tool} (not installed)" in out)
    assert "configparser" in out


def test_hand_edit_fails_and_record_makes_it_pass(project):
    project.knobs_path.write_text(project.knobs_path.read_text().replace("[decode]\n", "[decode]\nNCCL_DEBUG = \"INFO\"\n"))
    result = kk(project)
    assert result.exit_code == 1
    assert lines(result) == ['inventory/knobs.toml: [decode] NCCL_DEBUG = "INFO" is not explained by the changelog '
                             '(entries say (unset)); run `knobkeeper record --reason ...` to record the hand edit, '
                             'or undo it with `git checkout inventory/knobs.toml`']
    record = CliRunner().invoke(main, ["record", "--reason", "debug a hang", "--repo", str(project.root)])
    assert record.exit_code == 0, record.output
    assert kk(project).exit_code == 0


def test_catalog_violation_and_missing_links_and_bad_evidence(project):
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="x", new=512, evidence=["e1e2e3e4", "0badbeef"])
    write_evidence(project)
    write_entry(project, id="b2c3d4e5", time="2026-11-29T18:00:00.000000Z", action="revert", knob=KNOB, role="decode",
                reason="y", old=512, new=None, reverts="a1b2c3d4", incident="9f8e7d6c")
    bad = project.evidence_dir / "20261129T000000.000000Z-c0c0c0c0.json"
    bad.write_text(json.dumps({"schema": "knobkeeper.evidence/1", "id": "c0c0c0c0"}))
    project.knobs_path.write_text(project.knobs_path.read_text().replace("[prefill]\n", "[prefill]\nNCCL_MIN_NCHANNELS = 0\n"))
    result = kk(project)
    assert result.exit_code == 1
    out = result.stdout
    assert "inventory/knobs.toml: [prefill] NCCL_MIN_NCHANNELS = 0 violates the catalog" in out
    entry = "changelog/entries/20261129T164737.000000Z-a1b2c3d4.toml"
    assert f"{entry}: evidence 0badbeef is missing from changelog/evidence/; commit the evidence file" in out
    assert "e1e2e3e4 is missing" not in out
    assert "changelog/entries/20261129T180000.000000Z-b2c3d4e5.toml: incident 9f8e7d6c is missing" in out
    assert f"{bad.relative_to(project.root)}: fails schema knobkeeper.evidence/1: created: expected a non-empty string" in out
    write_incident(project)
    assert "incident 9f8e7d6c is missing" not in kk(project).stdout


def test_broken_template_names_the_template_and_the_host(project):
    unit = project.templates_dir / "systemd.service.j2"
    unit.write_text(unit.read_text().replace("[Service]\n", "[Service]\nNice={{ nice_level }}\n"))
    result = kk(project)
    assert result.exit_code == 1
    out = lines(result)
    # example_prod.py and example_prod_vllm.py use systemd (5 hosts each); local.py uses supervisord
    # and still renders.
    assert len(out) == 10, out
    assert out[0].startswith("templates/systemd.service.j2: fails to render for host prefill-1 of inventory/example_prod.py:")
    assert "'nice_level' is undefined" in out[0] and out[0].endswith("fix the template or the host/group data it reads")
    assert any("host decode-2" in line for line in out) and not any("@local" in line for line in out)


@pytest.mark.skipif(not lint.available("shellcheck"), reason="shellcheck not installed")
def test_launch_script_lint_bash_and_shellcheck(project):
    launch = project.templates_dir / "launch.sh.j2"
    launch.write_text(launch.read_text().replace("set -euo pipefail\n", "set -euo pipefail\necho $HOME\n"))
    result = kk(project)
    assert result.exit_code == 1
    assert "fails shellcheck" in result.stdout and "SC2086" in result.stdout
    assert "templates/launch.sh.j2: rendered /opt/knobkeeper/services/knobkeeper-decode/launch.sh " \
           "(inventory/example_prod.py hosts decode-1, decode-2 service knobkeeper-decode) fails shellcheck" in result.stdout
    assert lint.bash_syntax("#!/bin/bash\nif then\n")[0].startswith("launch.sh: line 2: syntax error")
    assert lint.bash_syntax("#!/bin/bash\necho ok\n") == []


@pytest.mark.skipif(not lint.available("systemd-analyze"), reason="systemd-analyze not installed")
def test_unit_that_systemd_rejects(project):
    unit = project.templates_dir / "systemd.service.j2"
    unit.write_text(unit.read_text().replace("Restart=always", "Restart=sometimes"))
    result = kk(project)
    assert result.exit_code == 1
    hits = [line for line in lines(result) if "fails systemd-analyze verify" in line]
    # One per distinct file: hosts whose files differ only in their header are linted once. The vLLM
    # workers' launch scripts each name their own NIXL side-channel address: 3 (sglang) + 5 (vllm).
    assert len(hits) == 8, hits
    assert hits[0].startswith("templates/systemd.service.j2: rendered unit knobkeeper-prefill.service "
                              "(inventory/example_prod.py hosts prefill-1, prefill-2) fails systemd-analyze verify:")
    assert "restart" in hits[0].lower()


def test_supervisor_section_must_parse(project):
    tpl = project.templates_dir / "supervisor.conf.j2"
    tpl.write_text(tpl.read_text().replace("[program:{{ service }}]", "program {{ service }}"))
    result = kk(project)
    assert result.exit_code == 1
    assert "templates/supervisor.conf.j2: rendered" in result.stdout and "does not parse" in result.stdout


def test_base_catches_a_modified_entry_and_rejects_an_unknown_ref(project):
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="x", new=512)
    commit_all(project, "set")
    path = project.entries_dir / "20261129T164737.000000Z-a1b2c3d4.toml"
    path.write_text(path.read_text().replace('reason = "x"', 'reason = "rewritten"'))
    assert kk(project).exit_code == 0
    result = kk(project, "--base", "main")
    assert result.exit_code == 1
    assert "changelog/entries/20261129T164737.000000Z-a1b2c3d4.toml: a committed entry was modified since main" in result.stdout
    bad = kk(project, "--base", "nope")
    assert bad.exit_code == 2 and "--base nope: not a commit" in bad.stderr


def test_check_json(project):
    project.knobs_path.write_text(project.knobs_path.read_text().replace("[router]\n", "[router]\nNO_SUCH_KNOB = 1\n"))
    result = kk(project, "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["counts"]["inventories"] == 8
    assert [p["path"] for p in data["problems"]][0] == "inventory/knobs.toml"
    assert "unknown knob 'NO_SUCH_KNOB'" in data["problems"][0]["what"]


# --------------------------------------------------------------------------- hostile input: misplaced secrets, unsafe names, evidence that contradicts itself

def test_a_tracked_file_under_the_secret_store_fails(project):
    """The store was protected only by .gitignore: a forced add (or a lost ignore line) commits a secret."""
    secret = project.secrets_dir / "decode" / "HF_TOKEN"
    secret.parent.mkdir(parents=True)
    secret.write_text("hf_value_that_must_not_print")
    git(project.root, "add", "-f", ".knobkeeper-secrets/decode/HF_TOKEN")
    result = kk(project)
    assert result.exit_code == 1
    assert lines(result) == [".knobkeeper-secrets/decode/HF_TOKEN: a secret's value is tracked by git; "
                             "`git rm --cached .knobkeeper-secrets/decode/HF_TOKEN`, keep .knobkeeper-secrets/ ignored, "
                             "and rotate the secret (it is in git history)"]
    assert "hf_value_that_must_not_print" not in result.output
    git(project.root, "rm", "-q", "--cached", ".knobkeeper-secrets/decode/HF_TOKEN")
    assert kk(project).exit_code == 0


@pytest.mark.parametrize("as_json", [False, True])
def test_plaintext_value_for_a_secret_knob_is_named_not_shown(project, as_json):
    plain = "hf_pasted_plaintext_token"
    project.knobs_path.write_text(project.knobs_path.read_text().replace("[decode]\n", f'[decode]\nHF_TOKEN = "{plain}"\n'))
    result = kk(project, *(["--json"] if as_json else []))
    assert result.exit_code == 1
    assert plain not in result.output and fingerprint(plain) not in result.output
    if as_json:
        [problem] = json.loads(result.stdout)["problems"]
        assert problem["path"] == "inventory/knobs.toml"
        assert problem["what"] == "[decode] plaintext value for secret knob HF_TOKEN (not shown)"
    else:
        [line] = lines(result)
        assert line.startswith("inventory/knobs.toml: [decode] plaintext value for secret knob HF_TOKEN (not shown); ")


def test_a_secret_pasted_under_a_role_it_does_not_apply_to_is_not_shown_either(project):
    plain = "hf_pasted_under_router"
    project.knobs_path.write_text(project.knobs_path.read_text().replace("[router]\n", f'[router]\nHF_TOKEN = "{plain}"\n'))
    result = kk(project)
    assert result.exit_code == 1 and plain not in result.output
    assert "[router] HF_TOKEN = (a plaintext value, not shown) violates the catalog: HF_TOKEN does not apply" in result.output


def test_a_fingerprint_is_what_a_secret_knob_holds(project):
    from knobkeeper.changelog import ops

    ops.set_knob(project, "HF_TOKEN", "hf_real_value", "decode", "gated weights")
    assert "sha256:" in project.knobs_path.read_text() and "hf_real_value" not in project.knobs_path.read_text()
    result = kk(project)
    assert result.exit_code == 0, result.output


def test_a_catalog_name_a_shell_would_run_is_one_problem(project):
    """`X;touch /tmp/p;Y` reached every launch script's `unset` line unquoted and check said OK."""
    bad = 'X;touch /tmp/p;Y'
    project.catalog_path.write_text(project.catalog_path.read_text() + (
        f'\n[knobs."{bad}"]\ntype = "int"\nroles = ["decode"]\nrisk = "perf"\nsource = "x"\nunset = "x"\ndoc = "x"\n'))
    result = kk(project)
    assert result.exit_code == 1
    [line] = lines(result)
    assert line.startswith("inventory/catalog.toml: ") and repr(bad) in line, line


def _write_doc(project, doc) -> Path:
    data = doc if isinstance(doc, dict) else doc.to_json()
    path = project.evidence_dir / f"{file_stem(parse_time(data['created']), data['id'])}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def test_evidence_whose_judgement_contradicts_its_runs_fails(project):
    doc = write_evidence(project)
    level = doc.judgement.levels[0]
    assert level.verdict == "better" and check_result_ok(project)
    forged = doc.to_json()
    forged["judgement"]["levels"][1].update(effect=0.5, verdict="better")  # @80: really +2.0%
    for run in forged["runs"]:  # and @96 the runs now say no gain, while the stored verdict says better
        if run["concurrency"] == 96 and run["arm"] == "B":
            run["output_tokens_per_s"] = {1: 1040.0, 2: 1045.0, 3: 1035.0}[run["repeat"]]
    path = _write_doc(project, forged)
    result = kk(project)
    assert result.exit_code == 1
    out = lines(result)
    rel = path.relative_to(project.root).as_posix()
    assert out and all(line.startswith(f"{rel}: judgement does not follow from its runs: ") for line in out)
    assert any("stored effect +50.0% at 80 but the runs give +2.0%" in line for line in out)
    [at96] = [line for line in out if "at 96" in line]
    assert "stored verdict better at 96" in at96 and "better" not in at96.split("the runs give")[1]


def test_evidence_with_nan_fails(project):
    doc = write_evidence(project)
    doc.judgement.levels[2].ci_low = float("nan")
    path = _write_doc(project, doc)
    result = kk(project)
    assert result.exit_code == 1
    [line] = lines(result)
    assert line.startswith(f"{path.relative_to(project.root).as_posix()}: judgement does not follow from its runs: ")
    assert "judgement.levels[2].ci_low: nan (not a finite number)" in line


def check_result_ok(project) -> bool:
    return kk(project).exit_code == 0


def test_check_reports_a_knob_the_pinned_engine_ignores_and_a_flag_its_parser_rejects(project):
    with project.catalog_path.open("a") as fh:
        fh.write('\n[knobs.SGLANG_GRAMMAR_TIMEOUT]\ntype = "float"\nroles = ["decode"]\nrisk = "behaviour"\n'
                 'source = "sglang"\nunset = "300 s"\ndoc = "Grammar compile timeout (removed after 0.5.6)."\n')
    project.knobs_path.write_text(project.knobs_path.read_text().replace("[decode]\n", "[decode]\nSGLANG_GRAMMAR_TIMEOUT = 30.0\n", 1))
    from knobkeeper.changelog.ops import record_edits

    record_edits(project, "hand edit under test")
    prod = project.root / "inventory" / "example_prod.py"
    prod.write_text(prod.read_text().replace("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", 1))
    result = kk(project)
    assert result.exit_code == 1
    out = lines(result)
    assert any(line.startswith("inventory/knobs.toml: [decode] SGLANG_GRAMMAR_TIMEOUT: sglang 0.5.23") and "would ignore it" in line
               for line in out), out
    # sglang 0.5.23's own parser (its side environment is built from PyPI once, then cached)
    assert any("inventory/example_prod.py" in line and "--cuda-graph-max-bs" in line and "ambiguous" in line
               for line in out), out


# --- evidence is append-only (issue 38, finding 1) and backs only its own stack's role (finding 2) -----

def _stored(project, knob=KNOB, value=512, setup=None, raw_files=()):
    """An A/B written and committed by the store, as `ab import` does; (doc, its file's path, the commit)."""
    from knobkeeper.evidence import store

    doc = store.build_doc(knob=knob, role="decode", runs=ctas_runs(), setup=setup or {"engine": "sglang"},
                          arms={"A": {"label": "baseline", "knobs": {knob: None}},
                                "B": {"label": "candidate", "knobs": {knob: value}}})
    path = store.write(project, doc, raw_files)
    return doc, path.relative_to(project.root).as_posix(), git(project.root, "rev-parse", "HEAD")


def _append_only_line(rel: str, added: str, ident: str | None) -> str:
    fix = f"restore it (`git checkout {added[:10]} -- {rel}`)"
    if ident:
        fix += f"; to judge its runs again, `knobkeeper ab rejudge {ident}` writes a new evidence file that names it"
    return (f"{rel}: changed since {added[:10]}, the commit that added it (evidence files are append-only: entries "
            f"cite what it held); {fix}")


def test_evidence_rewritten_and_rejudged_in_place_fails_check_naming_the_commit_that_added_it(project):
    """The hostile steps of the issue: arm B's throughput divided by 20 in the committed file, judged
    again with the store's own function (so its judgement follows from its runs and the knob, role and
    value the adding commit names are untouched) and committed as "tidy evidence"."""
    from knobkeeper.changelog import ops
    from knobkeeper.evidence import store

    doc, rel, added = _stored(project)
    ops.set_knob(project, KNOB, "512", "decode", "A/B +12.8% @64", evidence=[doc.id], allow_undeclared=True)
    data = json.loads((project.root / rel).read_text())
    for run in data["runs"]:
        if run["arm"] == "B":
            run["output_tokens_per_s"] /= 20
    forged = {**store.rejudge(store.Evidence.from_json(data)).to_json(), "id": doc.id}
    forged.pop("rejudges", None)
    assert store.verify(forged) == [] and forged["judgement"]["levels"][0]["verdict"] == "worse"
    (project.root / rel).write_text(json.dumps(forged, indent=2) + "\n")
    commit_all(project, "tidy evidence")

    want = [_append_only_line(rel, added, doc.id)]
    for args in ((), ("--base", "HEAD~1")):
        result = kk(project, *args)
        assert result.exit_code == 1 and lines(result) == want, (args, result.output)

    # Any stored number, not only what the judgement recomputes: a level's mean B (shown by `ab show`,
    # never recomputed by verify), edited in the working tree and not committed: the pre-commit gate.
    git(project.root, "checkout", "-q", added, "--", rel)
    data = json.loads((project.root / rel).read_text())
    data["judgement"]["levels"][0]["mean_b"] *= 20
    (project.root / rel).write_text(json.dumps(data, indent=2) + "\n")
    result = kk(project)
    assert result.exit_code == 1 and lines(result) == want, result.output


def test_raw_files_are_append_only_and_untouched_old_files_pass(project):
    """A raw file beside the evidence is held like the JSON; a schema-1 and a schema-2 file committed
    by hand (plain git, no store commit) pass while untouched; with --base a deletion is named."""
    from knobkeeper.evidence import judge
    from knobkeeper.evidence.model import SCHEMA_1

    doc, rel, added = _stored(project, raw_files=[("A-1-bench.jsonl", b'{"output_throughput": 1000.0}\n')])
    two = write_evidence(project, ident="c0c0c0c0")
    one = {k: v for k, v in two.to_json().items() if k != "validity"}   # as schema 1 wrote it: per level, unadjusted
    one.update(schema=SCHEMA_1, id="b1b1b1b1", judgement=judge.judge(two.runs, two.metric, adjust=False).to_json())
    one = _write_doc(project, one)
    commit_all(project, "old evidence, added by hand")
    base = git(project.root, "rev-parse", "HEAD")
    assert kk(project, "--base", base).exit_code == 0

    [raw] = doc.source.raw_files
    (project.root / raw).write_text('{"output_throughput": 20000.0}\n')
    one.unlink()
    commit_all(project, "a better raw number, one file fewer")
    result = kk(project, "--base", base)
    assert result.exit_code == 1
    deleted = one.relative_to(project.root).as_posix()
    assert lines(result) == [
        _append_only_line(raw, added, None),
        f"{deleted}: a committed evidence file was deleted since {base[:20]}; restore it "
        f"(`git checkout {base[:10]} -- {deleted}`)"], result.output


def test_a_rejudgement_must_hold_the_runs_it_rejudges(project):
    from knobkeeper.evidence import store

    doc, _, _ = _stored(project)
    data = store.rejudge(doc).to_json()
    data["runs"][0]["output_tokens_per_s"] *= 2                 # a "re-judgement" with a number of its own,
    again = store.rejudge(store.Evidence.from_json(data))       # its judgement following from its runs
    again.rejudges = doc.id
    path = _write_doc(project, again)
    orphan = _write_doc(project, {**store.rejudge(doc).to_json(), "rejudges": "0badbeef"})
    result = kk(project)
    assert result.exit_code == 1
    assert sorted(lines(result)) == sorted([
        f"{path.relative_to(project.root).as_posix()}: rejudges {doc.id}, but its runs differ from that file's; "
        f"a re-judgement holds the runs it judges unchanged: write it with `knobkeeper ab rejudge {doc.id}`, or "
        f"import new measurements as new evidence (`knobkeeper ab import`)",
        f"{orphan.relative_to(project.root).as_posix()}: rejudges 0badbeef, which is missing from changelog/evidence/; "
        f"restore the evidence it re-judges from git"]), result.output


def test_evidence_of_one_stack_backs_no_set_on_another(project, monkeypatch):
    """Evidence of the stack that names none (setup.stack empty) does not back a set on stack vllm's
    decode, nor evidence of stack vllm a set on the unnamed stack's decode; `check` fails on an entry
    that landed so; each backs its own stack's role, and a one-stack repo's plain role still works."""
    from knobkeeper.changelog import ops
    from tests.infra import cli, one_line_exit_2, snapshot

    nccl = "NCCL_MIN_NCHANNELS"
    plain, _, _ = _stored(project, knob=nccl, value=4)
    vllm, _, _ = _stored(project, knob=nccl, value=4, setup={"engine": "vllm", "stack": "vllm"})
    before = snapshot(project)
    done = cli(project, "set", f"{nccl}=4", "--stack", "vllm", "--role", "decode", "--reason", "x", "--evidence", plain.id)
    one_line_exit_2(done, f"--evidence {plain.id}: evidence {plain.id} tests {nccl} on decode, not {nccl} on vllm.decode")
    done = cli(project, "set", f"{nccl}=4", "--role", "decode", "--reason", "x", "--evidence", vllm.id)
    one_line_exit_2(done, f"--evidence {vllm.id}: evidence {vllm.id} tests {nccl} on vllm.decode, not {nccl} on decode")
    assert snapshot(project) == before

    assert ops.set_knob(project, nccl, "4", "vllm.decode", "A/B", evidence=[vllm.id]).entry.evidence == [vllm.id]
    assert ops.set_knob(project, nccl, "4", "decode", "A/B", evidence=[plain.id]).entry.evidence == [plain.id]
    assert kk(project).exit_code == 0

    # Entries written by the landed code, which let either stand for the other.
    monkeypatch.setattr(ops, "_check_evidence", lambda project, ids, *rest: list(ids))
    crossed = [ops.set_knob(project, nccl, "8", "vllm.decode", "x", evidence=[plain.id]).entry,
               ops.set_knob(project, nccl, "8", "decode", "x", evidence=[vllm.id]).entry]
    out = lines(kk(project))
    for entry, ev, own, other in ((crossed[0], plain, "decode", "vllm.decode"), (crossed[1], vllm, "vllm.decode", "decode")):
        assert any(entry.id in line and f"its evidence does not back it: evidence {ev.id} tests {nccl} on {own}, "
                                        f"not {nccl} on {other}" in line for line in out), out


# --------------------------------------------------------------------------- evidence is bound to the change it backs (issue 25, finding 1)
# `set` and `restore` refuse evidence of another knob, role or value (exit 2, one line naming both);
# the canary's promote goes through the same `set`; `check` fails on an entry whose evidence does not
# back it and on an evidence file whose knob, role or candidate was edited by hand after the commit
# that added it. No process is started but git and the CLI.

NCCL = "NCCL_MIN_NCHANNELS"


def _evidence(project, value=512, knob=KNOB, role="decode") -> store.Evidence:
    """An A/B of `knob`=`value` on `role`, written and committed by the store (as `ab import` does)."""
    doc = store.build_doc(knob=knob, role=role, runs=ctas_runs(),
                          arms={"A": {"label": "baseline", "knobs": {knob: None}},
                                "B": {"label": "candidate", "knobs": {knob: value}}})
    store.write(project, doc)
    return doc


def _hand_edit(project, doc, edit) -> str:
    """Edit the committed evidence file of `doc` by hand and commit the edit with plain git."""
    path = store.find(project, doc.id)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))
    git(project.root, "commit", "-qam", "tweak evidence")
    return project.rel(path)


def test_set_restore_and_check_hold_evidence_to_its_change(project):
    e512, e256 = _evidence(project), _evidence(project, 256)

    # The hostile steps: another knob's A/B, and the 512 A/B behind a 256 change. Refused, nothing written.
    before = snapshot(project)
    done = cli(project, "set", f"{NCCL}=8", "--role", "decode", "--reason", "faster", "--evidence", e512.id)
    one_line_exit_2(done, f"tests {KNOB} on decode, not {NCCL} on decode")
    done = cli(project, "set", f"{KNOB}=256", "--role", "decode", "--reason", "faster", "--evidence", e512.id[:6],
               "--allow-undeclared")
    one_line_exit_2(done, f"evidence {e512.id}: it tested 512, the change sets 256")
    done = cli(project, "set", f"{KNOB}=512", "--role", "prefill", "--reason", "x", "--evidence", e512.id,
               "--allow-undeclared")
    assert done.returncode == 2 and b"Traceback" not in done.stderr   # the catalog refuses the role first
    assert snapshot(project) == before

    # The evidence of this very change is accepted.
    entry = ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[e512.id], allow_undeclared=True).entry
    assert entry.evidence == [e512.id]

    # restore: extra evidence must back the value restored (512), not the 256 A/B.
    ops.revert_knob(project, KNOB, "decode", "suspect")
    before = snapshot(project)
    done = cli(project, "restore", KNOB, "--role", "decode", "--reason", "back", "--evidence", e256.id)
    one_line_exit_2(done, f"evidence {e256.id}: it tested 256, the change sets 512")
    assert snapshot(project) == before
    restored = ops.restore_knob(project, KNOB, "decode", "back", evidence=[e512.id]).entry
    assert restored.evidence == [e512.id]

    assert check(project).ok, [p.line() for p in check(project).problems]


def test_restore_does_not_carry_a_landed_entry_s_wrong_evidence(project):
    # An entry the landed code accepted: NCCL_MIN_NCHANNELS=8 "backed" by the TARGET_CTAS A/B.
    e512 = _evidence(project)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "_check_evidence", lambda project, ids, *rest: list(ids))
        ops.set_knob(project, NCCL, "8", "decode", "landed code", evidence=[e512.id])
    ops.revert_knob(project, NCCL, "decode", "suspect")
    change = ops.restore_knob(project, NCCL, "decode", "back")
    assert change.entry.evidence == []
    assert any(f"not carried over" in w and f"not {NCCL} on decode" in w for w in change.warnings), change.warnings
    with pytest.raises(UserError, match=f"--evidence {e512.id}: evidence {e512.id} tests {KNOB}"):
        ops.set_knob(project, NCCL, "4", "decode", "again", evidence=[e512.id])


def test_check_fails_on_unbacked_entries_and_hand_edited_evidence(project):
    e512 = _evidence(project)
    with pytest.MonkeyPatch.context() as mp:   # entries written by the landed code, which checked nothing
        mp.setattr(ops, "_check_evidence", lambda project, ids, *rest: list(ids))
        wrong_knob = ops.set_knob(project, NCCL, "8", "decode", "x", evidence=[e512.id]).entry
        stale = ops.set_knob(project, KNOB, "256", "decode", "x", evidence=[e512.id], allow_undeclared=True).entry

    def rename_knob(d):
        d["knob"] = NCCL
        for arm in d["arms"].values():
            arm["knobs"] = {NCCL: arm["knobs"][KNOB]}

    edited_knob = _hand_edit(project, _evidence(project, 128), rename_knob)
    edited_role = _hand_edit(project, _evidence(project, 64), lambda d: d.__setitem__("role", "prefill"))
    edited_b = _hand_edit(project, _evidence(project, 32), lambda d: d["arms"]["B"]["knobs"].__setitem__(KNOB, 1024))

    lines = [p.line() for p in check(project).problems]
    def one(*needles):
        hits = [line for line in lines if all(n in line for n in needles)]
        assert len(hits) == 1, (needles, lines)

    one(wrong_knob.id, "its evidence does not back it", f"tests {KNOB} on decode, not {NCCL} on decode")
    one(stale.id, "its evidence does not back it", "it tested 512, the change sets 256")
    one(edited_knob, "disagrees with itself: knob: the file says", f"says {KNOB}")
    one(edited_role, "disagrees with itself: role: the file says prefill", "says decode")
    one(edited_b, "disagrees with itself: arms.B.knobs", f"{KNOB}=1024", f"{KNOB}=32")
    assert not any(e512.id in line and "disagrees" in line for line in lines), lines


def test_the_canary_promotes_only_through_a_bound_set(project, monkeypatch):
    """The promote's `set` carries the canary's own evidence; evidence for anything else is refused
    there and the canary hosts are put back."""
    from knobkeeper.evidence import canary, canary_design
    from knobkeeper.evidence.model import CanaryBlock

    other = store.build_doc(knob=KNOB, role="decode", runs=ctas_runs(),
                            arms={"A": {"label": "baseline", "knobs": {KNOB: None}},
                                  "B": {"label": "candidate", "knobs": {KNOB: 256}}})
    other.canary = CanaryBlock(verdict="better")
    monkeypatch.setattr(canary, "measure", lambda *a, **k: other)
    put_back = []
    switch = canary.Switch(apply=lambda *a: None, restore=lambda: put_back.append("rollback"),
                      promote_rest=lambda: put_back.append("promote"))
    plan = canary_design.Plan(KNOB, 512, None, "decode", [], [])
    before = git(project.root, "rev-parse", "HEAD")
    with pytest.raises(UserError, match=f"it tested 256, the change sets 512"):
        canary.run(project, plan, None, switch, canary.Options(promote=True, reason="canary"))
    assert put_back == ["rollback"]
    assert "set " not in git(project.root, "log", "--format=%s", f"{before}..HEAD")


# --------------------------------------------------------------------------- a change that failed; an inventory that does not load

def test_a_change_that_failed_on_a_full_disk_is_said_rolled_back_not_a_hand_edit(project, monkeypatch):
    """The disk fills after `set` wrote knobs.toml: the entry's write fails, and so does putting
    knobs.toml back. `check` advised `knobkeeper record` for that half-written change; it rolls it
    back first now, says that a change failed and was rolled back, and the tree is as before."""
    import errno

    from knobkeeper.changelog import ops, store
    from knobkeeper.errors import UserError
    from tests.infra import snapshot

    before = snapshot(project)
    write, journal = store.atomic_write, project.private_dir / "journal.json"
    written: list[Path] = []

    def disk_fills_after_one_file(path, content, mode=None):
        if path != journal and written:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        if path != journal:
            written.append(path)
        return write(path, content, mode)

    monkeypatch.setattr(store, "atomic_write", disk_fills_after_one_file)
    with pytest.raises(UserError, match="nor put the files back"):
        ops.set_knob(project, "NCCL_DEBUG", "INFO", "decode", "debug a hang")
    assert written == [project.knobs_path] and "NCCL_DEBUG" in project.knobs_path.read_text()  # half written
    still_full = kk(project)
    assert still_full.exit_code == 1
    assert lines(still_full) == [".git/knobkeeper/journal.json: a change that did not finish cannot be rolled back "
                                 "yet (No space left on device); free disk space, then run `knobkeeper check` again: "
                                 "it rolls the change back first"]
    monkeypatch.setattr(store, "atomic_write", write)  # space freed
    result = kk(project)
    assert result.exit_code == 0, result.output
    assert "knobkeeper record" not in result.output
    assert ("warning: the change `decode: set NCCL_DEBUG=INFO` failed before its commit (a write failed, e.g. on a "
            "full disk, or its process died) and was rolled back: ") in result.stderr
    assert "nothing of it was committed; run the command again (free disk space first" in result.stderr
    assert snapshot(project) == before
    assert not journal.exists()  # said once: the next check has nothing to roll back


def test_an_inventory_that_does_not_load_is_named_with_its_line_and_the_others_are_checked(project):
    """A syntax error in a new inventory was blamed on inventory/knobs.toml (every knob only an
    engine registry declares is looked up through the inventories) and rendering was skipped for
    every inventory. It is named once now, file and line, and the others render and are checked."""
    from knobkeeper.changelog import ops
    from knobkeeper.errors import UserError

    ops.set_knob(project, "VLLM_CPU_OMP_THREADS_BIND", "0-1", "vllm.decode", "both cores")  # from vLLM's registry
    text = 'decode = [("@local", {"engines": {"decode": "sim"}})\nrouter = []\n'
    (project.inventory_dir / "new.py").write_text(text)
    with pytest.raises(SyntaxError) as python:
        compile(text, "new.py", "exec")
    local = project.inventory_dir / "local.py"  # a problem in another inventory, to see that it is still checked
    local.write_text(local.read_text().replace('"stop_timeout": 20,', '"stop_timeout": 20, "knob_defaults": {"decode": {"NO_SUCH_KNOB": 1}},'))
    result = kk(project, "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    local_line, new_line = [p["line"] for p in data["problems"]]  # inventories in name order
    assert new_line == (f"inventory/new.py: line {python.value.lineno}: SyntaxError: {python.value.msg}; "
                        f"fix the inventory so that it loads")
    assert local_line.startswith("inventory/local.py: fails to render for host @local of inventory/local.py: host "
                                 "@local: data knob_defaults: unknown knob 'NO_SUCH_KNOB'"), local_line
    assert not any(s.startswith("rendering") for s in data["skipped"]) and data["counts"]["inventories"] == 9
    assert data["counts"]["files"] > 0
    with pytest.raises(UserError, match=f"^inventory/new.py: line {python.value.lineno}: SyntaxError: .*; fix the "
                                        f"inventory first"):  # set cannot judge a knob against it: refused
        ops.set_knob(project, "VLLM_CPU_OMP_THREADS_BIND", "0", "vllm.decode", "x")


# --------------------------------------------------------------------------- changelog files behind symbolic links (issue 25, finding 7)
# Changelog files that are symbolic links, or resolve outside the repository, are refused by every
# reader and named once each by `check` and by `report` (under its problems, instead of aborting). No
# process is started but git and the CLI.

def test_links_are_refused_by_readers_and_named_once_by_check_and_report(project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    ops.set_knob(project, KNOB, "512", "decode", "a plain entry", allow_undeclared=True)

    # An outside entry that parses (its reason must never be read), and one to /etc/passwd.
    stolen = outside / "entry.toml"
    stolen.write_text('id = "0badc0de"\ntime = "2026-11-30T10:00:00.000000Z"\nauthor = "x <x@x>"\n'
                      'action = "set"\nknob = "NCCL_DEBUG"\nrole = "decode"\nreason = "OUTSIDE-MARKER"\nnew = "INFO"\n')
    entry_link = project.entries_dir / "20261130T100000.000000Z-0badc0de.toml"
    passwd_link = project.entries_dir / "20261130T100001.000000Z-0badf00d.toml"
    entry_link.symlink_to(stolen)
    passwd_link.symlink_to("/etc/passwd")
    # Evidence that would load, kept outside; an incident; a deploy record; and a dangling link.
    doc = store.build_doc(knob=KNOB, role="decode", runs=ctas_runs(),
                          arms={"A": {"label": "a", "knobs": {KNOB: None}}, "B": {"label": "b", "knobs": {KNOB: 512}}})
    (outside / "ev.json").write_text(json.dumps(doc.to_json()))
    evidence_link = project.evidence_dir / f"20261130T100000.000000Z-{doc.id}.json"
    evidence_link.symlink_to(outside / "ev.json")
    incident_link = project.incidents_dir / "20261130T100000.000000Z-1dead1de.toml"
    incident_link.symlink_to(outside / "missing.toml")            # dangling, as in a fresh clone
    record_link = project.deploys_dir / "20261130T100000.000000Z-2dead2de.json"
    record_link.symlink_to(outside / "ev.json")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-qm", "links")
    links = [entry_link, passwd_link, evidence_link, incident_link, record_link]

    lines = [p.line() for p in check(project).problems]
    for link in links:
        rel = project.rel(link)
        hits = [line for line in lines if rel in line]
        assert len(hits) == 1 and "a symbolic link (to " in hits[0] and "plain files in the repository" in hits[0], \
            (rel, lines)
    assert len(lines) == len(links), lines                         # nothing else: no "fails to render"
    assert not any("render" in line for line in lines), lines

    # The readers: the log leaves the outside entry out, `show` of it is refused in one line, the
    # store and the deploy records do not read the links.
    log = cli(project, "log")
    assert log.returncode == 0 and b"OUTSIDE-MARKER" not in log.stdout and b"0badc0de" not in log.stdout
    one_line_exit_2(cli(project, "show", "0badc0de"), "a symbolic link")
    assert store.paths(project) == [] and load_records(project) == []
    shown = cli(project, "ab", "show", doc.id)
    assert shown.returncode == 2 and b"Traceback" not in shown.stderr

    # The report is written, with one problem line per link.
    html = write_report(project, tmp_path / "report.html").path.read_text()
    problems = html.split('id="problems"', 1)[1].split("</section>", 1)[0]
    for link in links:
        assert problems.count(project.rel(link)) == 1, (link, problems)
    assert "OUTSIDE-MARKER" not in html


def test_a_folder_linked_out_of_the_repo_is_one_problem(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "20261130T100000.000000Z-3dead3de.toml").write_text("id = 1\n")
    for child in project.incidents_dir.iterdir():
        child.unlink()
    project.incidents_dir.rmdir()
    project.incidents_dir.symlink_to(elsewhere)
    lines = [p.line() for p in check(project).problems]
    assert lines == [f"{project.rel(project.incidents_dir)}: a symbolic link (to {elsewhere}); "
                     f"changelog files are plain files in the repository (a clone gets nothing behind a link): "
                     f"replace it with the file itself or delete it"], lines
