"""`knobkeeper check`: the CI / pre-commit gate, on temporary infra repos. Each problem is one line,
`path: what is wrong; how to fix`; exit 1 on problems, 0 when clean, 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper import lint
from knobkeeper.cli import main
from knobkeeper.knobs.catalog import fingerprint
from knobkeeper.timeutil import file_stem, parse_time
from tests.infra import git
from tests.review_fixtures import KNOB, commit_all, write_entry, write_evidence, write_incident


def kk(project, *args):
    return CliRunner().invoke(main, ["check", *args, "--repo", str(project.root)], catch_exceptions=False)


def lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.strip()]


def test_clean_repo_passes_and_says_which_linters_ran(project):
    result = kk(project)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("check: OK:") and "6 inventories" in out  # local, local_vllm, example_prod, example_prod_vllm, local_slurm, example_slurm
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
    assert data["ok"] is False and data["counts"]["inventories"] == 6
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
    path = project.evidence_dir / f"{file_stem(parse_time(doc['created']), doc['id'])}.json"
    path.write_text(json.dumps(doc if isinstance(doc, dict) else doc.to_json(), indent=2) + "\n")
    return path


def test_evidence_whose_judgement_contradicts_its_runs_fails(project):
    doc = write_evidence(project)
    level = doc["judgement"]["levels"][0]
    assert level["verdict"] == "better" and check_result_ok(project)
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
    doc["judgement"]["levels"][2]["ci_low"] = float("nan")
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
