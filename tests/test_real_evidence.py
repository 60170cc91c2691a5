"""Evidence from a real engine (issue 23, items 5-7; issue 39): one `sweep` on the real vLLM PD stack
(the session's `real_stack`: inventory/local_vllm.py deployed once) that finds a real knob's value,
confirms it and sets it, and the field story replayed on it with that evidence: incident, revert
as the suspect, the engines idle in the incident snapshot, the revert refuted, `reclaimable`, the
restore, and the co-restart prefill -> decode -> router, each gated, each restart time in the deploy
record. The sweep covers the path the real `ab run` test covered (an A/B is a sweep with one
candidate: the same search, arms switched by deploying, knob carried, evidence committed).

The knob: decode's VLLM_CPU_OMP_THREADS_BIND. Declared "0-1" first (decode spread over both cores,
onto the core where prefill's worker runs: a bad earlier change, committed, not deployed): the
control. The candidates: "1" (decode on its own core, the stack's shipped value) and "nobind"
(vLLM binds no thread: the OS spreads them). Measured first under the real-engine lock on
2026-12-03 (two restarts each, 8-s runs at c=4, 32 in / 16 out, a loaded machine): 0-1 20 and 15
output tok/s, nobind 182 and 225, 1 430 and 290, 0 309 and 118. So both candidates are an order of
magnitude better than the control (decided in 3 blocks), "1" the better on a quiet machine, but
nobind cannot be told from it in 3 blocks at this noise (a tie kept at the best by score, no engine
default to break it), and `make test` runs the sim tests beside this module: the pick is either,
confirmed; which one is not asserted.
The design: `--max-repeats 3` (looks after 2 and 3 blocks), `--confirm-repeats 3` (the confirming
A/B, ABBA, 3 per arm: with 2 a +912% once came out inconclusive, its slow arm's runs alike so
Welch's df fell to 1), 8-s runs after the real engine's 5-s block warm-up (recorded, not judged),
c=4 with 32 in / 16 out (the slow arm's requests stay inside the load generator's timeout), and
`--apply`: the pick is set (one commit, the evidence attached) before the stack is put back, so the
put-back deploys it. Engine restarts in this module: decode 16 in the sweep (9 blocks of the
search, 6 of the confirm, the put-back) plus the revert and the co-restart's; prefill 1.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from knobkeeper import audit, fmt
from knobkeeper.changelog.entries import load_entries
from knobkeeper.changelog.incidents import load_incidents
from knobkeeper.deploy.status import stack_status
from knobkeeper.evidence import store
from knobkeeper.knobs.state import read_declared
from knobkeeper.timeutil import iso, parse_time, utcnow
from tests.infra import git

# The session fixture's first deploy (~1.5-3 min here) and the sweep count against the first test's time.
pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(2400)]

KNOB = "VLLM_CPU_OMP_THREADS_BIND"
BAD, GOOD, OTHER = "0-1", "1", "nobind"
SCOPE = "vllm.decode"


def _ok(result):
    assert result.exit_code == 0, result.output[-3000:]
    return result.output


def _deploy(stack, **kw):
    result = stack.deploy(**kw)
    assert result.ok, (result.error, result.output[-3000:])
    return result.record


def _declared(stack) -> str:
    return read_declared(stack.project.knobs_path)[SCOPE][KNOB]


@pytest.fixture(scope="module")
def judged(real_stack):
    """The one sweep: (stack, its evidence doc as JSON, the confirming A/B's judged level)."""
    stack, inv = real_stack, real_stack.inventory
    assert _declared(stack) == GOOD
    t0 = time.monotonic()

    # 0. A bad earlier change, declared (not yet deployed): decode on both cores.
    _ok(stack.kk("set", f"{KNOB}={BAD}", "--stack", "vllm", "--role", "decode", "--reason",
                 "give decode both cores"))

    # 1. sweep: the control = the declared "0-1", candidates "1" and "nobind"; arms switched by deploying decode.
    before = git(stack.root, "rev-parse", "HEAD")
    out = _ok(stack.kk("sweep", f"{KNOB}={GOOD},{OTHER}", "--stack", "vllm", "--role", "decode", "--inventory", inv,
                       "--concurrency", "4", "--max-repeats", "3", "--confirm-repeats", "3", "--duration", "8",
                       "--api", "completions", "--input-len", "32", "--output-len", "16", "--order-seed", "39",
                       "--apply", "--reason", "sweep: decode on its own core", "--json"))
    result = json.loads(out[out.index("\n{") + 1:] if not out.startswith("{") else out)  # deploy lines first
    doc = result["evidence"]
    block = doc["sweep"]
    [level] = doc["judgement"]["levels"]
    arms = {name: arm["knobs"][KNOB] for name, arm in block["plan"]["arms"].items()}
    print("sweep:", {k: level[k] for k in ("verdict", "effect", "ci_low", "ci_high", "p_value", "p_adjusted")},
          f"pick {block['pick']}", f"search {block['wall_s']} s, {len(block['blocks'])} blocks: {block['stopped']}",
          f"confirm {block['confirm']}", f"looks {block['looks']}")
    assert arms == {"A": BAD, "B": GOOD, "C": OTHER}                  # the control is what the stack declares
    # the search: the pick far better than the control at the family level (> 2x). Which of the two
    # candidates leads is the noise's: "1" beat "nobind" by ~1.7x on a quiet machine, too little to be
    # told apart in 3 blocks, and the sim half of the suite runs beside this one (one core more or less
    # for decode's own): the pick is the best by score of the two, whichever it is, and confirmed. The
    # other one is never worse than the control; better or inconclusive is the noise's (unbound
    # threads beside the sim half came out inconclusive once: 3 runs an arm, Holm over the family).
    picked = block["pick"]["knobs"][KNOB]
    assert block["pick"]["outcome"] == "adopt" and picked in (GOOD, OTHER), block["pick"]
    for arm in ("B", "C"):
        [cell] = block["judgement"][arm]["levels"]
        if arms[arm] == picked:
            assert cell["verdict"] == "better" and cell["effect"] > 1.0, (arm, cell)
        else:
            assert cell["verdict"] in ("better", "inconclusive"), (arm, cell)
    assert {look["leader"] for look in block["looks"]} <= {"B", "C"}, block["looks"]
    assert block["pick"]["confirmed"] is True and arms[block["confirm"]["arm"]] == picked
    assert not block["failed"] and all(row["order"][0:1] and "A" in row["order"] for row in block["blocks"])
    # the confirming A/B on fresh restarts is the evidence's own: the control against the pick, ABBA
    assert doc["arms"]["A"]["knobs"] == {KNOB: BAD} and doc["arms"]["B"]["knobs"] == {KNOB: picked}
    assert doc["setup"]["engine"] == "vllm" and doc["setup"]["engine_version"] == "0.32.0"
    runs = doc["runs"] + block["runs"]
    # Every run served, without an error. Not "completed > 0": that counts requests that started and
    # ended inside the 8-s window, and unbound threads beside the sim half can take longer than the
    # window for each request (a fresh clone's make test: one nobind run at 8 tokens/s, 0 completed,
    # its neighbours 73 and 121); its tokens in the window are what the judgement reads.
    assert all(r["errors"] == 0 and r["output_tokens_per_s"] > 0 for r in runs), \
        [(r["arm"], r["errors"], r["output_tokens_per_s"]) for r in runs]
    assert {r["knob_seen"]["status"] for r in runs} == {"carried"}, runs[0]["knob_seen"]
    assert all(r["prefill_prompt_tokens"] > 0 for r in runs)     # every run went through prefill (PD)
    assert len(doc["setup"]["schedule"]["warmups"]) == doc["setup"]["schedule"]["blocks"]   # one per restart
    assert all(w["output_tokens_per_s"] > 0 for w in block["warmups"])
    assert store.verify(doc) == []
    # Three commits: the plan (before any data), the evidence, the set of the pick with it.
    subjects = git(stack.root, "log", "--format=%s", f"{before}..HEAD").splitlines()[::-1]
    assert [s.split(":")[0] for s in subjects] == ["sweep plan", "evidence", "vllm.decode"], subjects
    assert f"Evidence: {doc['id']}" in git(stack.root, "log", "-2", "--format=%(trailers)")
    assert _declared(stack) == picked                            # --apply: the pick declared ...
    assert {s.state for s in stack_status(stack.project, inv)} == {"in sync"}   # ... and deployed by the put-back
    print(f"real sweep: {time.monotonic() - t0:.0f} s")
    return stack, doc, level


def test_sweep_on_the_real_stack_picks_the_core_binding_and_confirms_it(judged):
    """The verdict CI sees: the confirming A/B decided (better, more than 2x), from runs that carried
    the knob and went through prefill over the connector."""
    _, doc, level = judged
    assert level["verdict"] == "better" and level["effect"] > 1.0, level   # > 2x: decided, not inconclusive
    assert level["p_adjusted"] < 0.05 and level["ci_low"] > 0.5, level


def test_field_story_on_real_vllm(judged):
    stack, doc, level = judged
    inv, ev = stack.inventory, doc["id"]
    t0 = time.monotonic()

    # 2. The gain was set with that evidence by `sweep --apply` and deployed by its put-back.
    set_entry = load_entries(stack.project)[-1]
    picked = doc["sweep"]["pick"]["knobs"][KNOB]
    assert set_entry.action == "set" and set_entry.new == picked and set_entry.evidence == [ev]
    shown = _ok(stack.kk("log", KNOB))                           # the change shows its evidence
    assert f"{ev}: " in shown and "@4 (95% CI" in shown and "p_adj" in shown, shown

    # 3. An incident; the last delta reverted as the suspect and deployed.
    opened = json.loads(_ok(stack.kk("incident", "open", "client harness hangs", "--started",
                                     iso(utcnow() - timedelta(minutes=5)), "--json")))
    inc = opened["id"]
    _ok(stack.kk("revert", KNOB, "--stack", "vllm", "--role", "decode", "--reason",
                 "last deploy delta; suspect for the hang", "--incident", inc, "--hypothesis",
                 "the harness stops hanging"))
    revert = load_entries(stack.project)[-1]
    assert revert.action == "revert" and revert.reverts == set_entry.id and _declared(stack) == BAD
    record = _deploy(stack)
    assert [r.service for r in record.services if r.acted] == ["knobkeeper-decode"]

    # 4. The snapshot: the real engines idle (nothing running, nothing queued, no tokens), the router
    #    sees both workers healthy: the hang is not the stack's.
    _ok(stack.kk("incident", "snapshot", inc, "--inventory", inv, "--window", "1"))
    [snap] = sorted(stack.project.incidents_dir.rglob("snapshot-*.json"))
    rows = {r["role"]: r for r in json.loads(snap.read_text())["services"]}
    for role in ("prefill", "decode"):
        assert rows[role]["error"] is None, rows[role]
        assert rows[role]["running"] == 0 and rows[role]["queued"] == 0 and rows[role]["tokens_per_s"] == 0, rows[role]
    assert rows["router"]["error"] is None and rows["router"]["workers"], rows["router"]
    shown = _ok(stack.kk("incident", "show", inc))
    assert "running 0, queued 0, 0.0 tok/s" in shown, shown

    # 5. The revert refuted; the incident resolved elsewhere.
    _ok(stack.kk("incident", "note", inc, "hang persisted after the revert", "--refutes", revert.id))
    _ok(stack.kk("incident", "resolve", inc, "--root-cause", "faulty client proxy"))
    assert audit.revert_statuses(stack.project)[revert.id].status == "refuted"

    # 6. reclaimable names the real gain and the command that restores it.
    text = _ok(stack.kk("reclaimable"))
    print(text)
    command = f"knobkeeper restore {KNOB} --role decode --stack vllm"
    assert "Reclaimable: 1 knob" in text and "REFUTED" in text and "faulty client proxy" in text, text
    assert f"{KNOB}=" in text and f"gives back {fmt.pct(level['effect'])} at concurrency 4" in text, text
    assert f"restore     {command}" in text, text
    [item] = json.loads(_ok(stack.kk("reclaimable", "--json")))["reclaimable"]
    assert item["status"] == "refuted" and item["evidence"][0]["id"] == ev
    [gain] = item["evidence"][0]["gains"]
    assert gain["concurrency"] == 4 and gain["effect"] == level["effect"] and gain["verdict"] == "better"
    assert item["command"] == command, item["command"]

    # 7. The restore, then the co-restart: prefill, decode, router in dependency order, each gated.
    _ok(stack.kk(*item["command"].split()[1:]))
    restore = load_entries(stack.project)[-1]
    assert restore.action == "restore" and restore.restores == revert.id and restore.evidence == [ev]
    assert _declared(stack) == picked
    record = _deploy(stack, restart="co")
    acted = [r for r in record.services if r.acted]
    assert [r.role for r in acted] == ["prefill", "decode", "router"], [(r.role, r.action) for r in acted]
    for row in acted:
        assert row.gate.result == "passed" and row.restart_issued_at and row.healthy_at, row
        assert parse_time(row.healthy_at) >= parse_time(row.restart_issued_at)
        print(f"co-restart {row.role}: gate {row.gate.seconds} s, restart issued {row.restart_issued_at}, "
              f"healthy {row.healthy_at}")
    issued = [parse_time(r.restart_issued_at) for r in acted]
    healthy = [parse_time(r.healthy_at) for r in acted]
    assert issued == sorted(issued) and all(h <= i for h, i in zip(healthy, issued[1:])), (issued, healthy)
    assert record.pd_proof is not None, record
    # The stack is left in its declared state (decode on the sweep's pick, as its put-back deployed it).
    states = stack_status(stack.project, inv)
    assert {s.state for s in states} == {"in sync"}, states
    assert "nothing to reclaim" in _ok(stack.kk("reclaimable"))
    assert [i.id for i in load_incidents(stack.project)][-1] == inc
    print(f"real field story after the sweep: {time.monotonic() - t0:.0f} s")
