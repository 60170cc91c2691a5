"""`knobkeeper review`: the PR body of a branch, on temporary infra repos with pinned ids, times and
git dates. The golden file is tests/data/review/set_with_evidence.md; regenerate it with
UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_review.py
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from knobkeeper import fmt
from knobkeeper import review
from tests.infra import git, kk, make_infra_repo
from tests.review_fixtures import KNOB, commit_all, pin_git_dates, write_entry, write_evidence, write_incident

GOLDEN = Path(__file__).parent / "data" / "review" / "set_with_evidence.md"


def normalise(text: str, project) -> str:
    """The machine-dependent strings in a body: the repo's path, this Python's path, and the render
    digests (local.py's files name the repo's path, so their digests do too).
    The commit ids are replaced too: they hash the whole tree copied from this repo (inventory/,
    templates/, deploy.py), so they would change with any edit there, not only one that shows."""
    text = text.replace(str(project.root), "<repo>").replace(sys.executable, "<python>")
    for name in ("main", "HEAD"):
        sha = git(project.root, "rev-parse", name)
        text = text.replace(sha, f"<{name}>").replace(sha[:10], f"<{name}>")
    return re.sub(r"sha256:[0-9a-f]{16}", "sha256:<digest>", text)


@pytest.fixture
def project(short_tmp, monkeypatch):
    """conftest's `project` with every commit at the pinned date, its first one too
    (review_fixtures.pin_git_dates): the bodies are compared byte for byte."""
    pin_git_dates(monkeypatch)
    return make_infra_repo(short_tmp)


@pytest.fixture
def branch_with_evidence(project):
    """main: the infra repo; branch ctas: evidence + a set of the CTAs knob on decode, two commits."""
    git(project.root, "switch", "-q", "-c", "ctas")
    write_evidence(project)
    commit_all(project, "evidence: CTAs=512 on decode")
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="A/B +12.8% @64, +5.7% @96 | removes the 80->96 scaling dip", new=512, evidence=["e1e2e3e4"])
    commit_all(project, "decode: set CTAs=512")
    return project


def test_review_of_a_set_with_evidence_matches_the_golden_file(branch_with_evidence):
    project = branch_with_evidence
    body = normalise(review.review_body(project, base="main"), project)
    for section in ("**Summary:**", "### Knob changes", "### Evidence", "### Reverts", "### Rendered files",
                    "### Restart plan", "### Warnings"):
        assert section in body
    assert "| decode | `SGLANG_SM120_MMA_TARGET_CTAS` | (unset) -> 512 | set |" in body
    assert "+12.8%" in body and "better" in body and "Anomalies:" in body and "arm A" in body
    assert "+export SGLANG_SM120_MMA_TARGET_CTAS=512" in body          # the rendered diff, both inventories
    assert "inventory/example_prod.py: decode" in body and "inventory/local.py: decode" in body
    assert "decode only: prefill and router keep running" in body
    assert "the router is still gated on the restarted decode workers" in body
    assert "A decode-only restart suffices." in body
    assert "evidence e1e2e3e4 is not significant" not in body
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(body)
    assert body == GOLDEN.read_text(), "review body changed; if intended: UPDATE_GOLDEN=1 pytest tests/test_review.py"


def test_a_range_that_changes_no_rendered_body_shows_no_rendered_file(project):
    """Every rendered file's header names the commit, so it changes with every commit; a file whose
    only change is a header is not shown. A Slurm job script embeds each launch script WITH its
    header: its diff was ~140 lines of `|# source:` (example_slurm.py) in every review."""
    git(project.root, "switch", "-q", "-c", "evidence")
    write_evidence(project)
    commit_all(project, "evidence only")
    collected = review.collect(project, base="main")
    assert collected.diffs == []
    assert "No rendered file changes" in review.to_markdown(collected)


def test_the_body_names_no_absolute_path_of_this_machine(short_tmp, monkeypatch):
    """The body is read on other machines (and CI's must be the one written here): local.py places
    its files in the repo, its interpreter is this machine's. Paths in the repo are relative to it,
    others in the home folder start with ~."""
    pin_git_dates(monkeypatch)
    monkeypatch.setenv("HOME", str(short_tmp))
    project = make_infra_repo(short_tmp)
    inv = project.inventory_dir / "local.py"
    inv.write_text(inv.read_text().replace('"python": _sys.executable,', f'"python": "{short_tmp}/venvs/kk/bin/python",'))
    commit_all(project, "local.py: the interpreter of a venv in the home folder")
    git(project.root, "switch", "-q", "-c", "ctas")
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="faster", new=512)
    inv.write_text(inv.read_text().replace("/venvs/kk/bin/python", "/venvs/kk2/bin/python"))
    commit_all(project, "decode: CTAs=512, another venv")
    body = review.review_body(project, base="main")
    assert str(short_tmp) not in body
    launch = ".knobkeeper-state/local/services/knobkeeper-decode/launch.sh"
    assert f"`{launch}` on @local:" in body and f"--- a/{launch}\n+++ b/{launch}\n" in body
    assert "\n cd .knobkeeper-state/local/services/knobkeeper-decode\n" in body
    assert "\n-exec ~/venvs/kk/bin/python -m knobkeeper.sim" in body
    assert fmt.cell("interpreter: ~/venvs/kk/bin/python -> ~/venvs/kk2/bin/python") in body  # the restart plan


def test_review_is_byte_identical_across_runs_and_cli_writes_the_same(branch_with_evidence, tmp_path):
    project = branch_with_evidence
    first = review.review_body(project, base="main")
    out = tmp_path / "pr.md"
    result = kk(project, "review", "--base", "main", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text() == first
    assert kk(project, "review", "--base", "main").output == first
    # default base: the merge-base with main
    assert kk(project, "review").output == first


def test_review_gh_prints_the_pr_command(branch_with_evidence, tmp_path):
    project = branch_with_evidence
    out = tmp_path / "body.md"
    result = kk(project, "review", "--output", str(out), "--gh")
    assert result.exit_code == 0, result.output
    assert f"gh pr create --base main --title 'knobs: set {KNOB} on decode: (unset) -> 512' --body-file {out}" in result.output
    assert out.read_text().startswith("## Knob change review")


def test_review_bad_ref_is_exit_2(branch_with_evidence):
    result = kk(branch_with_evidence, "review", "--base", "no-such-branch")
    assert result.exit_code == 2
    assert "--base no-such-branch: not a commit" in result.output


def test_review_of_a_revert_shows_its_incident_and_status(project):
    write_evidence(project)
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="A/B +12.8% @64", new=512, evidence=["e1e2e3e4"])
    write_incident(project)
    commit_all(project, "set + incident")
    git(project.root, "switch", "-q", "-c", "revert")
    write_entry(project, id="b2c3d4e5", time="2026-11-29T18:10:00.000000Z", action="revert", knob=KNOB, role="decode",
                reason="last deploy delta before the hang", old=512, new=None, reverts="a1b2c3d4", incident="9f8e7d6c")
    commit_all(project, "revert CTAs")
    body = review.review_body(project)
    assert "### Reverts" in body
    row = next(line for line in body.splitlines() if line.startswith("| revert `b2c3d4e5`"))
    assert "`9f8e7d6c` multi-round harness hangs (open)" in row and "**suspected**" in row
    assert "restart" in body and "512 -> (unset)" in body

    # A note refutes it: the review of the same range now says refuted.
    write_incident(project, notes='\n[[notes]]\ntime = "2026-11-29T19:00:00.000000Z"\n'
                   'author = "Test Operator <test.operator@example.com>"\ntext = "hang persisted after the revert"\n'
                   'refutes = "b2c3d4e5"\n')
    commit_all(project, "incident note")
    body = review.review_body(project)
    row = next(line for line in body.splitlines() if line.startswith("| revert `b2c3d4e5`"))
    assert "**refuted**" in row and "hang persisted after the revert" in row


def test_review_warns_about_a_revert_without_incident_and_a_set_without_evidence(project):
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="try it", new=256)
    commit_all(project, "set")
    git(project.root, "switch", "-q", "-c", "revert")
    write_entry(project, id="b2c3d4e5", time="2026-11-29T18:10:00.000000Z", action="revert", knob=KNOB, role="decode",
                reason="panic", old=256, new=None, reverts="a1b2c3d4")
    write_evidence(project, ident="c3c3c3c3", value=512)  # unrelated, unlinked
    commit_all(project, "revert")
    body = review.review_body(project)
    assert "revert without an incident" in body
    row = next(line for line in body.splitlines() if line.startswith("| revert `b2c3d4e5`"))
    assert "| none |" in row and "**unexplained**" in row


def test_review_warns_on_stale_and_insignificant_evidence(project):
    git(project.root, "switch", "-q", "-c", "weak")
    flat = [{"arm": arm, "repeat": r, "concurrency": 64, "output_tokens_per_s": 1000.0 + 40 * ((r * 7 + (arm == "B")) % 3),
             "errors": 0} for arm in "AB" for r in (1, 2, 3)]
    write_evidence(project, ident="d4d4d4d4", created="2026-09-01T10:00:00.000000Z", value=256, runs=flat)
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="looks faster", new=512, evidence=["d4d4d4d4"])
    commit_all(project, "set")
    body = review.review_body(project)
    assert "stale evidence d4d4d4d4: it tested 256, the change sets 512" in body
    assert "stale evidence d4d4d4d4: 89 days older than the change" in body
    assert "evidence d4d4d4d4 is not significant at any level" in body


def test_review_against_a_base_that_moved_on_uses_the_merge_base_and_says_so(project):
    """`--base main` after main gained its own entry: a two-dot comparison showed main's entry as deleted."""
    fork = git(project.root, "rev-parse", "HEAD")
    git(project.root, "switch", "-q", "-c", "ctas")
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="faster", new=512)
    commit_all(project, "decode: set CTAs=512")
    git(project.root, "switch", "-q", "main")
    write_entry(project, id="c9c9c9c9", time="2026-11-29T17:00:00.000000Z", action="set", knob="NCCL_DEBUG",
                role="prefill", reason="debug", new="INFO")
    commit_all(project, "prefill: NCCL_DEBUG=INFO")
    git(project.root, "switch", "-q", "ctas")

    body = review.review_body(project, base="main")
    assert f"**Range:** --base main ({git(project.root, 'rev-parse', 'main')[:10]}) is not an ancestor of HEAD: " \
           f"compared from their merge-base {fork[:10]}" in body
    assert "a committed entry was deleted" not in body and "c9c9c9c9" not in body and "`NCCL_DEBUG`" not in body
    assert f"| decode | `{KNOB}` | (unset) -> 512 | set |" in body
    assert kk(project, "review", "--base", "main").output == body

    # The same two branches the other way round: main's entry is the change, the branch's is not deleted.
    other = review.review_body(project, base="ctas", head="main")
    assert "is not an ancestor of main" in other and "| prefill | `NCCL_DEBUG` | (unset) -> INFO | set |" in other
    assert "a committed entry was deleted" not in other and "a1b2c3d4" not in other

    # A reversed range (the head is an ancestor of the base): nothing is a change, nothing is deleted.
    reversed_ = review.review_body(project, base="ctas", head=fork)
    assert "a reversed range" in reversed_ and "No changelog entries were added in this range." in reversed_
    assert "a committed entry was deleted" not in reversed_
    assert "--base ctas" not in review.review_body(project, base=fork)  # an ancestor: no note


def test_the_restart_plan_says_what_changed_in_words_never_only_digests(project):
    git(project.root, "switch", "-q", "-c", "engine")
    inv = project.inventory_dir / "example_prod.py"
    text = inv.read_text()
    for old, new in (('"--cuda-graph-max-bs-decode", "128"', '"--cuda-graph-max-bs-decode", "256", "--enable-dp-attention"'),
                     ('"python": "{prefix}/venv/bin/python"', '"python": "{prefix}/venv-0.5.7/bin/python"'),
                     ('"HF_HOME": "/models/hf-cache"', '"HF_HOME": "/models/cache"')):
        assert old in text
        text = text.replace(old, new)
    inv.write_text(text)
    unit = project.templates_dir / "systemd.service.j2"
    unit.write_text(unit.read_text().replace("Restart=always", "Restart=on-failure"))
    write_entry(project, id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", action="set", knob=KNOB, role="decode",
                reason="faster", new=512)
    commit_all(project, "engine 0.5.7, bigger graphs, always restart, CTAs=512")
    body = review.review_body(project)
    plan = body.split("### Restart plan")[1].split("### Warnings")[0]
    prod = plan.split("#### inventory/local.py")[0]
    decode = next(line for line in prod.splitlines() if line.startswith("   - knobkeeper-decode on decode-1, decode-2: "))
    # the phrases are knobkeeper.deploy.plan.change_reasons', the same the deploy record and `plan` show
    for words in (f"knob {KNOB}: set to 512 (was unset)", "environment HF_HOME: /models/hf-cache -> /models/cache",
                  "interpreter: /opt/knobkeeper/venv/bin/python -> /opt/knobkeeper/venv-0.5.7/bin/python",
                  "flag --cuda-graph-max-bs-decode: 128 -> 256", "flag --enable-dp-attention: added",
                  "systemd unit: Restart: always -> on-failure"):
        assert fmt.cell(words) in decode, (words, decode)
    prefill = next(line for line in prod.splitlines() if line.startswith("   - knobkeeper-prefill on prefill-1, prefill-2: "))
    assert KNOB not in prefill and "--cuda-graph-max-bs" not in prefill and "interpreter" in prefill
    assert "sha256:" not in plan
    assert fmt.cell("full co-restart in dependency order: prefill -> decode -> router") in prod


def test_the_body_says_where_the_report_is():
    from knobkeeper.review.markdown import report_pointer

    assert "`knobkeeper report --open`" in report_pointer({})
    ci = report_pointer({"GITHUB_RUN_ID": "42", "GITHUB_REPOSITORY": "acme/infra"})
    assert "`knobkeeper-report` artifact of https://github.com/acme/infra/actions/runs/42" in ci


def test_review_warns_about_an_evidence_file_changed_or_removed_in_the_range(project):
    """Issue 38: a branch that rewrites one committed evidence file (its numbers, judged again) and
    deletes another adds no entry, yet the review must not read "0 knob changes, no warnings"."""
    import json

    write_evidence(project)
    write_evidence(project, ident="c3c3c3c3", value=256)
    commit_all(project, "evidence")
    git(project.root, "switch", "-q", "-c", "tidy")
    [kept, gone] = sorted(project.evidence_dir.glob("*.json"), key=lambda p: "c3c3c3c3" in p.name)
    data = json.loads(kept.read_text())
    data["judgement"]["levels"][0]["mean_b"] /= 20
    kept.write_text(json.dumps(data, indent=2) + "\n")
    gone.unlink()
    commit_all(project, "tidy evidence")
    base = git(project.root, "rev-parse", "main")[:10]
    collected = review.collect(project, base="main")
    rel = lambda p: p.relative_to(project.root).as_posix()  # noqa: E731
    assert collected.warnings == [
        f"{rel(gone)}: a committed evidence file was deleted; evidence files are append-only (entries cite what it "
        f"held): restore it (`git checkout {base} -- {rel(gone)}`)",
        f"{rel(kept)}: a committed evidence file was modified; evidence files are append-only (entries cite what it "
        f"held): restore it (`git checkout {base} -- {rel(kept)}`); to judge its runs again, "
        f"`knobkeeper ab rejudge e1e2e3e4` writes a new file"], collected.warnings
    body = review.review_body(project, base="main")
    assert "; 2 warnings" in body and f"a committed evidence file was modified" in body


def test_review_holds_evidence_to_the_stack_of_the_change():
    """The review judges the binding on the entry's scope, as `set` and `check` do: default-stack
    evidence behind a set on stack vllm's decode is a warning (it used to compare the bare role)."""
    from knobkeeper.changelog.entries import Entry
    from knobkeeper.evidence import store
    from knobkeeper.review.body import ChangeView, EvidenceView, _evidence_warnings
    from tests.review_fixtures import AUTHOR, ctas_runs

    doc = store.build_doc(knob=KNOB, role="decode", runs=ctas_runs(),
                          arms={"A": {"label": "baseline", "knobs": {KNOB: None}},
                                "B": {"label": "candidate", "knobs": {KNOB: 512}}})
    for stack, warned in ((None, False), ("vllm", True)):
        entry = Entry(id="a1b2c3d4", time="2026-11-29T16:47:37.000000Z", author=AUTHOR, action="set", knob=KNOB,
                      role="decode", reason="x", new=512, evidence=[doc.id], stack=stack)
        found = _evidence_warnings(ChangeView(entry, "perf", "(unset)", "512"), EvidenceView(doc.id, doc), None)
        line = f"decode {KNOB} (entry a1b2c3d4): evidence {doc.id} tests {KNOB} on decode, not {KNOB} on vllm.decode"
        assert (line in found) is warned, found
