"""Issue 25 finding 1: evidence is bound to the change it backs. `set` and `restore` refuse evidence
of another knob, role or value (exit 2, one line naming both); the canary's promote goes through the
same `set`; `check` fails on an entry whose evidence does not back it and on an evidence file whose
knob, role or candidate was edited by hand after the commit that added it. No process is started
but git and the CLI."""

from __future__ import annotations

import json

import pytest

from knobkeeper.changelog import ops
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.review.check import check
from tests.infra import cli, git, one_line_exit_2, snapshot
from tests.review_fixtures import ctas_runs

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
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
    from knobkeeper.evidence import canary

    other = store.build_doc(knob=KNOB, role="decode", runs=ctas_runs(),
                            arms={"A": {"label": "baseline", "knobs": {KNOB: None}},
                                  "B": {"label": "candidate", "knobs": {KNOB: 256}}})
    other["canary"] = {"verdict": "better"}
    monkeypatch.setattr(canary, "measure", lambda *a, **k: other)
    put_back = []
    switch = canary.Switch(apply=lambda *a: None, restore=lambda: put_back.append("rollback"),
                      promote_rest=lambda: put_back.append("promote"))
    plan = canary.Plan(KNOB, 512, None, "decode", [], [])
    before = git(project.root, "rev-parse", "HEAD")
    with pytest.raises(UserError, match=f"it tested 256, the change sets 512"):
        canary.run(project, plan, None, switch, canary.Options(promote=True, reason="canary"))
    assert put_back == ["rollback"]
    assert "set " not in git(project.root, "log", "--format=%s", f"{before}..HEAD")
