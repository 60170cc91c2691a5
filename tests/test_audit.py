"""Reverts as hypotheses: the field story end to end, each status transition, `reclaimable`
(sorting, stale evidence, confirmed reverts kept apart), the restore guard, the revert warning,
and `timeline` with deploy records and an open incident's candidates."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from click.testing import CliRunner

from knobkeeper import audit
from knobkeeper.changelog import incidents
from knobkeeper.changelog import ops
from knobkeeper.changelog.entries import load_entries
from knobkeeper.cli import main
from knobkeeper.evidence.schema import SCHEMA, validate
from knobkeeper.timeutil import file_stem, iso, new_id, parse_time, utcnow
from tests.infra import git, kk

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"

# The field numbers: +12.8% at 64, +5.7% at 96 (and no detectable change at 32).
FIELD_LEVELS = [
    (32, 0.004, -0.012, 0.020, 0.55, "no detectable change"),
    (64, 0.128, 0.101, 0.154, 0.0004, "better"),
    (96, 0.057, 0.031, 0.084, 0.002, "better"),
]


def write_evidence(project, knob=KNOB, role="decode", value=512, levels=FIELD_LEVELS, age_days: float = 1,
                   engine_version: str | None = "0.5.5", commit: bool = True, inventory: str | None = "inventory/local.py",
                   engine: str = "sglang") -> str:
    """A schema-valid evidence doc (changelog/evidence/<stamp>-<id>.json); returns its id."""
    ident = new_id()
    created = utcnow() - timedelta(days=age_days)
    runs, judged = [], []
    base = {32: 3000.0, 64: 5200.0, 80: 5600.0, 96: 5400.0}
    for conc, effect, lo, hi, p, verdict in levels:
        a = base.get(conc, 4000.0)
        for rep in (1, 2, 3):
            jitter = 1 + 0.004 * (rep - 2)
            runs.append({"arm": "A", "repeat": rep, "concurrency": conc, "output_tokens_per_s": a * jitter, "errors": 0})
            runs.append({"arm": "B", "repeat": rep, "concurrency": conc,
                         "output_tokens_per_s": a * (1 + effect) * jitter, "errors": 0})
        judged.append({"concurrency": conc, "n_a": 3, "n_b": 3, "mean_a": a, "mean_b": a * (1 + effect),
                       "effect": effect, "ci_low": lo, "ci_high": hi, "p_value": p, "verdict": verdict,
                       "repeats_needed": None, "outliers_dropped": []})
    doc = {
        "schema": SCHEMA, "id": ident, "created": iso(created), "knob": knob, "role": role,
        "metric": "output_tokens_per_s",
        "arms": {"A": {"label": "baseline", "knobs": {knob: None}}, "B": {"label": "candidate", "knobs": {knob: value}}},
        "setup": {"inventory": inventory, "git_sha": None, "engine": engine, "engine_version": engine_version,
                  "model": "m", "device": "RTX PRO 6000",
                  "workload": {"api": "chat", "input_len": 1024, "output_len": 512, "requests_per_run": 200,
                               "duration_s": None}},
        "runs": runs,
        "judgement": {"method": "welch-log", "alpha": 0.05, "levels": judged},
        "anomalies": [{"arm": "A", "from_concurrency": 80, "to_concurrency": 96, "change": -0.036, "p_value": 0.01,
                       "confidence": 0.99}],
        "source": {"tool": "test", "raw_files": [], "format": None},
    }
    assert validate(doc) == []
    path = project.evidence_dir / f"{file_stem(created, ident)}.json"
    path.write_text(json.dumps(doc, indent=2))
    if commit:
        git(project.root, "add", project.rel(path))
        git(project.root, "commit", "-qm", f"evidence {ident}", "--", project.rel(path))
    return ident


def trailers(project, rev="HEAD") -> list[tuple[str, str]]:
    text = git(project.root, "log", "-1", "--format=%(trailers:only,unfold)", rev)
    return [tuple(line.split(": ", 1)) for line in text.splitlines() if ": " in line]


def commit_of(project, trailer: str) -> str:
    """The sha of the one commit carrying `trailer` (e.g. 'Entry: 1a2b3c4d')."""
    shas = git(project.root, "log", "--format=%H", "--grep", f"^{trailer}$").split()
    assert len(shas) == 1, (trailer, shas)
    return shas[0]


# --------------------------------------------------------------------------- the field story

def test_field_story_end_to_end(project):
    ev = write_evidence(project)
    # 1. set with evidence
    result = kk(project, "set", f"{KNOB}=512", "--role", "decode", "--reason", "A/B: +12.8% @64, +5.7% @96",
                "--evidence", ev, "--allow-undeclared")
    assert result.exit_code == 0, result.output
    set_entry = load_entries(project)[-1]
    # 2. incident, revert as suspect
    result = kk(project, "incident", "open", "multi-round harness hangs", "--started",
                iso(utcnow() - timedelta(minutes=5)), "--json")
    inc = json.loads(result.output)["id"]
    result = kk(project, "revert", KNOB, "--role", "decode", "--reason", "last deploy delta; suspect for the hang",
                "--incident", inc, "--hypothesis", "the harness stops hanging")
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    revert = load_entries(project)[-1]
    assert revert.action == "revert" and revert.incident == inc and revert.reverts == set_entry.id
    assert audit.revert_statuses(project)[revert.id].status == "suspected"
    # 3. the hang persists; later the root cause is found elsewhere
    result = kk(project, "incident", "note", inc, "hang persisted after the revert", "--refutes", revert.id)
    assert result.exit_code == 0, result.output
    assert audit.revert_statuses(project)[revert.id].status == "refuted"
    result = kk(project, "incident", "resolve", inc, "--root-cause", "faulty client proxy")
    assert result.exit_code == 0, result.output
    status = audit.revert_statuses(project)[revert.id]
    assert status.status == "refuted" and status.source == "resolution" and "faulty client proxy" in status.why
    # 4. one command answers "any perf we removed by reverts that we can claw back?"
    result = kk(project, "reclaimable")
    assert result.exit_code == 0, result.output
    text = result.output
    print(text)
    assert "Reclaimable: 1 knob" in text
    assert f"decode: {KNOB}=512  (now (unset))  gives back +12.8% at concurrency 64, +5.7% at 96" in text
    assert "       64   +12.8%  +10.1%..+15.4%" in text
    assert 'the note of' in text and 'had refuted it: "hang persisted after the revert"' in text
    assert "REFUTED" in text and "faulty client proxy" in text and "multi-round harness hangs" in text
    assert "+12.8%" in text and "+5.7%" in text and "       96    +5.7%  +3.1%..+8.4%" in text
    assert "last deploy delta; suspect for the hang" in text and "the harness stops hanging" in text
    assert f"restore     knobkeeper restore {KNOB} --role decode" in text
    data = json.loads(kk(project, "reclaimable", "--json").output)
    [item] = data["reclaimable"]
    assert item["command"] == f"knobkeeper restore {KNOB} --role decode"
    assert item["incident"]["root_cause"] == "faulty client proxy" and item["status"] == "refuted"
    gains = {g["concurrency"]: g for g in item["evidence"][0]["gains"]}
    assert set(gains) == {64, 96} and gains[64]["effect"] == 0.128 and gains[96]["effect"] == 0.057
    assert gains[64]["ci_low"] == 0.101 and gains[96]["ci_high"] == 0.084
    assert item["evidence"][0]["stale"] is False and item["evidence"][0]["engine_version"] == "0.5.5"
    # 5. restore: the refutation is recorded and the evidence carried
    result = kk(project, *item["command"].split()[1:])
    assert result.exit_code == 0, result.output
    restore = load_entries(project)[-1]
    assert restore.action == "restore" and restore.restores == revert.id and restore.refutes == revert.id
    assert restore.evidence == [ev] and restore.incident == inc
    assert "refuted by the resolution" in restore.reason and "faulty client proxy" in restore.reason
    t = trailers(project)
    for pair in (("Action", "restore"), ("Restores", revert.id), ("Refutes", revert.id), ("Incident", inc),
                 ("Evidence", ev), ("Entry", restore.id), ("New", "512")):
        assert pair in t, pair
    # `knobs` shows it back, `log` shows the chain
    knobs = kk(project, "knobs", "--role", "decode").output
    assert KNOB in knobs and "512" in knobs and restore.id in knobs and "restore" in knobs
    log = kk(project, "log", KNOB).output
    assert log.index(restore.id) < log.index(revert.id) < log.index(set_entry.id)
    assert f"restores={revert.id}" in log and f"reverts={set_entry.id} incident={inc}" in log
    assert "nothing to reclaim" in kk(project, "reclaimable").output
    # the git trailers link every step: set -> incident -> revert -> note -> resolve -> restore
    shas = [commit_of(project, f"Entry: {set_entry.id}"), git(project.root, "log", "--format=%H", "--grep",
            f"^Incident: {inc}$", "--grep", "^Action: open$", "--all-match"),
            commit_of(project, f"Entry: {revert.id}"),
            git(project.root, "log", "--format=%H", "--grep", f"^Incident: {inc}$", "--grep", "^Action: note$", "--all-match"),
            git(project.root, "log", "--format=%H", "--grep", f"^Incident: {inc}$", "--grep", "^Action: resolve$", "--all-match"),
            commit_of(project, f"Entry: {restore.id}")]
    assert all(len(s) == 40 for s in shas)
    assert ("Evidence", ev) in trailers(project, shas[0])
    assert ("Reverts", set_entry.id) in trailers(project, shas[2]) and ("Incident", inc) in trailers(project, shas[2])
    assert ("Refutes", revert.id) in trailers(project, shas[3])
    assert ("Refutes", revert.id) in trailers(project, shas[4])
    order = git(project.root, "rev-list", "--reverse", "HEAD").split()
    assert [order.index(s) for s in shas] == sorted(order.index(s) for s in shas)
    assert git(project.root, "status", "--porcelain") == ""


# --------------------------------------------------------------------------- status transitions

def _suspect(project, title="hang"):
    ev = write_evidence(project)
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[ev])
    inc = incidents.open_incident(project, title).incident
    revert = audit.revert(project, KNOB, "decode", "suspect", incident=inc.id, hypothesis="it stops").entry
    return inc, revert


def status_of(project, revert) -> str:
    return audit.revert_statuses(project)[revert.id].status


def test_unexplained_revert_and_its_warning(project):
    ev = write_evidence(project)
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[ev])
    result = kk(project, "revert", KNOB, "--role", "decode", "--reason", "just in case")
    assert result.exit_code == 0
    assert (f"warning: {KNOB} on decode had positive evidence; this revert gives up +12.8% at concurrency 64, "
            f"+5.7% at 96 (evidence {ev})") in result.output
    assert "names no incident (--incident ID) and no hypothesis" in result.output
    revert = load_entries(project)[-1]
    assert status_of(project, revert) == "unexplained"
    [item] = audit.reclaimable(project).reclaimable
    assert item.status.status == "unexplained"


def test_no_warning_without_positive_evidence(project):
    ev = write_evidence(project, levels=[(64, 0.01, -0.02, 0.04, 0.4, "no detectable change")])
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[ev])
    assert audit.revert(project, KNOB, "decode", "tidy").warnings == []
    assert audit.reclaimable(project).reclaimable == []


def test_incident_without_hypothesis_warns_about_the_hypothesis(project):
    ev = write_evidence(project)
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[ev])
    inc = incidents.open_incident(project, "hang").incident
    [warning] = audit.revert(project, KNOB, "decode", "suspect", incident=inc.id).warnings
    assert "names no hypothesis" in warning and "incident" not in warning.split("names no")[1]


def test_suspected_then_refuted_by_note(project):
    inc, revert = _suspect(project)
    assert status_of(project, revert) == "suspected"
    [item] = audit.reclaimable(project).reclaimable
    assert item.status.status == "suspected" and "is open" in item.status.why
    incidents.note_incident(project, inc.id, "no change", refutes=revert.id)
    assert status_of(project, revert) == "refuted"


def test_suspected_then_confirmed_by_note_then_latest_note_wins(project):
    inc, revert = _suspect(project)
    incidents.note_incident(project, inc.id, "it stopped", confirms=revert.id)
    assert status_of(project, revert) == "confirmed"
    incidents.note_incident(project, inc.id, "it came back an hour later", refutes=revert.id)
    assert status_of(project, revert) == "refuted"


def test_resolution_decides(project):
    inc, revert = _suspect(project)
    incidents.note_incident(project, inc.id, "it stopped", confirms=revert.id)
    incidents.resolve_incident(project, inc.id, "faulty client proxy")
    assert status_of(project, revert) == "refuted"
    inc2 = incidents.open_incident(project, "hang again").incident
    ops.restore_knob(project, KNOB, "decode", "back")
    revert2 = audit.revert(project, KNOB, "decode", "suspect", incident=inc2.id, hypothesis="x").entry
    incidents.resolve_incident(project, inc2.id, "the knob", implicates=[revert2.id])
    assert status_of(project, revert2) == "confirmed"


def test_confirmed_revert_is_not_reclaimable_and_restore_needs_force(project):
    inc, revert = _suspect(project)
    incidents.resolve_incident(project, inc.id, "too many CTAs", implicates=[revert.id])
    report = audit.reclaimable(project)
    assert report.reclaimable == [] and [c.knob for c in report.confirmed] == [KNOB]
    text = kk(project, "reclaimable").output
    assert "nothing to reclaim" in text and "Not reclaimable: 1 revert confirmed as the cause" in text
    assert f"only with --force: knobkeeper restore {KNOB} --role decode --force" in text
    head = git(project.root, "rev-parse", "HEAD")
    result = CliRunner().invoke(main, ["restore", KNOB, "--role", "decode", "--repo", str(project.root)])
    assert result.exit_code == 2 and f"revert {revert.id} is confirmed as the cause" in result.output
    assert "--force" in result.output and "too many CTAs" in result.output
    assert git(project.root, "rev-parse", "HEAD") == head and git(project.root, "status", "--porcelain") == ""
    result = kk(project, "restore", KNOB, "--role", "decode", "--force")
    assert result.exit_code == 0 and "restored because of --force" in result.output
    restore = load_entries(project)[-1]
    assert restore.refutes is None and "forced restore" in restore.reason
    assert ("Refutes", revert.id) not in trailers(project)


def test_restore_of_suspected_warns_and_records_no_refutation(project):
    inc, revert = _suspect(project)
    change = audit.restore(project, KNOB, "decode")
    assert change.entry.refutes is None and "still a suspect" in change.warnings[0]


def test_restore_with_own_reason_keeps_it_and_adds_the_refutation(project):
    inc, revert = _suspect(project)
    incidents.note_incident(project, inc.id, "hang persisted after the revert", refutes=revert.id)
    entry = audit.restore(project, KNOB, "decode", reason="reclaiming the perf").entry
    assert entry.reason.startswith("reclaiming the perf; revert") and "refuted by a note" in entry.reason
    assert entry.refutes == revert.id


# --------------------------------------------------------------------------- reclaimable details

def test_sorted_by_gain_and_stale_evidence_flagged(project):
    small = write_evidence(project, knob="KNOBKEEPER_SPLITKV_TARGET_CTAS", value=256,
                           levels=[(64, 0.06, 0.03, 0.09, 0.01, "better")], age_days=45)
    big = write_evidence(project, engine_version="0.4.0")
    ops.set_knob(project, "KNOBKEEPER_SPLITKV_TARGET_CTAS", "256", "decode", "A/B", evidence=[small])
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[big])
    audit.revert(project, "KNOBKEEPER_SPLITKV_TARGET_CTAS", "decode", "x")
    audit.revert(project, KNOB, "decode", "y")
    report = audit.reclaimable(project, engine_version="0.5.5")
    assert [r.knob for r in report.reclaimable] == [KNOB, "KNOBKEEPER_SPLITKV_TARGET_CTAS"]
    first, second = report.reclaimable
    assert first.evidence[0].stale and first.evidence[0].stale_why == ["measured on sglang 0.4.0, current is 0.5.5"]
    assert second.evidence[0].stale and "45 days old" in second.evidence[0].stale_why[0]
    assert not audit.reclaimable(project, stale_days=60).reclaimable[1].evidence[0].stale
    text = kk(project, "reclaimable", "--engine-version", "0.5.5").output
    assert text.index(KNOB) < text.index("KNOBKEEPER_SPLITKV_TARGET_CTAS") and text.count("STALE") == 2
    # the current engine version is what the evidence's inventory pins for its role today
    local = project.inventory_dir / "local.py"
    local.write_text(local.read_text().replace('"decode": "sim"', '"decode": "sim==0.5.5"'))
    assert audit.reclaimable(project).reclaimable[0].evidence[0].stale


def test_staleness_compares_engine_and_version_for_an_inventory_in_any_spelling(project):
    """`ab run` records the inventory as typed: `./inventory/<name>.py` or an absolute path is the same
    inventory as `inventory/<name>.py`, and its role's pin is (engine, version), not the version alone."""
    prod = project.inventory_dir / "example_prod.py"   # decode: sglang 0.5.23
    spellings = ["inventory/example_prod.py", "./inventory/example_prod.py", str(prod),
                 str(project.root / "inventory" / ".." / "inventory" / "example_prod.py")]
    for inventory in spellings:
        view = audit.view_evidence(project, write_evidence(project, inventory=inventory, commit=False), utcnow(), 30, None)
        assert view.stale_why == ["measured on sglang 0.5.5, current is sglang 0.5.23"], inventory
        assert view.version_note is None
    # The same version of another engine is another engine: the sim 0.5.5 is not sglang 0.5.5.
    local = project.inventory_dir / "local.py"
    local.write_text(local.read_text().replace('"decode": "sim"', '"decode": "sim==0.5.5"'))
    view = audit.view_evidence(project, write_evidence(project, commit=False), utcnow(), 30, None)
    assert view.stale_why == ["measured on sglang 0.5.5, current is sim 0.5.5"]
    same = write_evidence(project, engine="sim", inventory="./inventory/local.py", commit=False)
    assert not audit.view_evidence(project, same, utcnow(), 30, None).stale
    # Where it cannot be compared, it says so instead of passing in silence.
    elsewhere = write_evidence(project, inventory="/srv/other-repo/inventory/prod.py")
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[elsewhere])
    audit.revert(project, KNOB, "decode", "suspect")
    (item,) = audit.reclaimable(project).reclaimable
    assert not item.evidence[0].stale and item.evidence[0].version_note == (
        "version not checked: its inventory /srv/other-repo/inventory/prod.py is not one of inventory/*.py, "
        "whose pins are read")
    assert "(version not checked: its inventory /srv/other-repo/inventory/prod.py" in kk(project, "reclaimable").output
    assert json.loads(kk(project, "reclaimable", "--json").output)["reclaimable"][0]["evidence"][0]["version_note"]
    unversioned = write_evidence(project, engine_version=None, inventory="inventory/example_prod.py", commit=False)
    assert audit.view_evidence(project, unversioned, utcnow(), 30, None).version_note == (
        "version not checked: the evidence records no engine version (its role runs sglang 0.5.23 today)")


def test_value_set_again_is_not_reclaimable_and_changed_after_revert_gives_a_set_command(project):
    ev = write_evidence(project)
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[ev])
    audit.revert(project, KNOB, "decode", "x")
    ops.set_knob(project, KNOB, "256", "decode", "try less")
    [item] = audit.reclaimable(project).reclaimable
    assert item.command == (f'knobkeeper set {KNOB}=512 --role decode --reason "reclaim: revert {item.revert.id} '
                            f'was unexplained" --evidence {ev}')
    ops.set_knob(project, KNOB, "512", "decode", "back", evidence=[ev])
    assert audit.reclaimable(project).reclaimable == []


def test_missing_evidence_is_not_a_gain(project):
    ev = write_evidence(project)
    ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[ev])
    audit.revert(project, KNOB, "decode", "x")
    next(project.evidence_dir.glob(f"*-{ev}.json")).unlink()
    assert audit.reclaimable(project).reclaimable == []
    result = CliRunner().invoke(main, ["reclaimable", "--stale-days", "-1", "--repo", str(project.root)])
    assert result.exit_code == 2 and "--stale-days -1: expected 0 or more days" in result.output


# --------------------------------------------------------------------------- timeline

def write_deploy(project, restarts: list[tuple[str, str, str]]) -> str:
    """A deploy record (knobkeeper.deploy.record format): (role, issued, healthy) per restart."""
    from knobkeeper.deploy.record import DeployRecord, record_path

    started = parse_time(restarts[0][1]) - timedelta(microseconds=5)
    services = [{"host": "gpu-1", "service": f"sglang-{role}", "role": role, "action": "restarted",
                 "restart_issued_at": issued, "healthy_at": healthy,
                 "gate": {"result": "passed", "url": "http://gpu-1/health", "status": "200", "seconds": 1.0,
                          "checked_at": healthy}}
                for role, issued, healthy in restarts]
    services.append({"host": "gpu-1", "service": "router", "role": "router", "action": "unchanged",
                     "restart_issued_at": None, "healthy_at": None, "gate": {"result": "skipped"}})
    record = DeployRecord(id=new_id(), inventory="inventory/local.py", inventory_path="inventory/local.py",
                          commit="a" * 40, dirty=False, allow_dirty=False, options={}, order=["prefill", "decode", "router"],
                          started_at=iso(started), finished_at=restarts[-1][2], result="ok", services=services)
    path = record_path(project, record, committed=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.text())
    return record.id


def test_timeline_orders_entries_restarts_and_incident_events(project):
    ev = write_evidence(project)
    set_entry = ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=[ev]).entry
    other = ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", "debug").entry
    t0 = parse_time(other.time)
    dep = write_deploy(project, [("prefill", iso(t0 + timedelta(microseconds=10)), iso(t0 + timedelta(microseconds=20))),
                                 ("decode", iso(t0 + timedelta(microseconds=30)), iso(t0 + timedelta(microseconds=40)))])
    inc = incidents.open_incident(project, "multi-round harness hangs").incident
    revert = audit.revert(project, KNOB, "decode", "suspect", incident=inc.id, hypothesis="stops").entry
    incidents.note_incident(project, inc.id, "hang persisted after the revert", refutes=revert.id)

    tl = audit.timeline(project, *audit.window())
    kinds = [(e.kind, e.ref) for e in tl.events]
    assert kinds == [("knob", set_entry.id), ("knob", other.id), ("deploy", dep), ("restart", dep), ("restart", dep),
                     ("incident", inc.id), ("incident", inc.id), ("knob", revert.id), ("incident", inc.id)]
    assert [e.time for e in tl.events] == sorted(e.time for e in tl.events)
    [oi] = tl.open_incidents
    assert "coincidence in time is not cause" in oi.warning
    cands = {c.entry.id: c for c in oi.candidates}
    assert set(cands) == {set_entry.id, other.id}
    assert cands[set_entry.id].status.status == "refuted" and "the symptom did not change" in cands[set_entry.id].verdict
    assert cands[other.id].verdict == "not reverted"
    assert [r.data["role"] for r in oi.restarts] == ["prefill", "decode"]

    text = kk(project, "timeline").output
    assert "restarted decode sglang-decode on gpu-1, healthy" in text and "(gate passed)" in text
    assert f"Open incident {inc.id}" in text and "warning: coincidence in time is not cause" in text
    assert "hang persisted after the revert" in text and "the symptom did not change, refuted" in text
    assert "router" not in text.split("Open incident")[0].split("restart")[-1]  # unchanged services are not restarts
    data = json.loads(kk(project, "timeline", "--around", inc.opened, "--window", "1h", "--json").output)
    assert data["open_incidents"][0]["candidates"][0]["revert_status"] == "refuted"
    assert {e["kind"] for e in data["events"]} == {"knob", "deploy", "restart", "incident"}
    # a resolved incident has no candidates; a window before everything is empty
    incidents.resolve_incident(project, inc.id, "faulty client proxy")
    assert audit.timeline(project, *audit.window()).open_incidents == []
    empty = kk(project, "timeline", "--until", "2020-01-01", "--since", "2019-01-01").output
    assert empty.startswith("Timeline 2019-01-01T00:00:00Z .. 2020-01-01T00:00:00Z: 0 events")


@pytest.mark.parametrize("args, message", [
    (["--around", "2026-01-01", "--since", "2025-12-01"], "either --since/--until or --around/--window"),
    (["--window", "2h"], "only with --around"),
    (["--around", "noon"], "--around: 'noon' is not a time"),
    (["--around", "2026-01-01", "--window", "2 weeks"], "--window: '2 weeks' is not a duration"),
    (["--since", "2026-01-02", "--until", "2026-01-01"], "is before --since"),
    (["--lookback", "x"], "--lookback"),
])
def test_timeline_bad_input(shared, args, message):
    project = shared
    result = CliRunner().invoke(main, ["timeline", *args, "--repo", str(project.root)])
    assert result.exit_code == 2 and message in result.output, result.output


def test_timeline_reads_unreadable_deploy_records_as_problems(project):
    (project.deploys_dir / "20261129T000000.000000Z-deadbeef.json").write_text("{not json")
    tl = audit.timeline(project, *audit.window())
    assert tl.problems and "deadbeef.json: not a deploy record" in tl.problems[0]


# --------------------------------------------------------------------------- hostile text, huge windows

EVIL = "suspect\x1b[2J\x1b]0;owned\x07\nproblem: all clear \u202etxt.exe"


def test_timeline_and_incident_show_escape_what_files_hold_and_json_keeps_it_raw(project):
    entry = ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", EVIL).entry
    inc = incidents.open_incident(project, "hang\x1b[31m red").incident
    incidents.note_incident(project, inc.id, EVIL)
    for args in (["timeline"], ["incident", "show", inc.id], ["incident", "list"]):
        out = kk(project, *args).output
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out, args
        assert "hang\\x1b[31m red" in out, args
        if args[0] != "incident" or args[1] != "list":  # the list shows titles, not notes
            assert "\\x1b[2J" in out and "\\u202e" in out, args
        assert not any(line.startswith("problem: all clear") for line in out.splitlines()), args
    # timeline shortens reasons to one line (whitespace collapsed), then escapes what is left
    assert "suspect\\x1b[2J\\x1b]0;owned\\x07 problem: all clear \\u202etxt.exe" in kk(project, "timeline").output
    data = json.loads(kk(project, "timeline", "--json").output)
    [knob] = [e for e in data["events"] if e["kind"] == "knob"]
    assert knob["entry"]["reason"] == EVIL and knob["ref"] == entry.id
    assert json.loads(kk(project, "incident", "show", inc.id, "--json").output)["notes"][0]["text"] == EVIL


@pytest.mark.parametrize("args, message", [
    (["--around", "2026-01-01", "--window", "99999999999d"], "--window: '99999999999d' is too long a duration"),
    (["--around", "0001-01-02", "--window", "2d"], "--window 2d: reaches past the years 1..9999"),
    (["--lookback", "99999999999d"], "--lookback: '99999999999d' is too long a duration"),
])
def test_timeline_windows_beyond_the_calendar_are_one_line_and_exit_2(shared, args, message):
    result = CliRunner().invoke(main, ["timeline", *args, "--repo", str(shared.root)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_a_lookback_before_the_epoch_means_all_of_history(project):
    incidents.open_incident(project, "hang", started="2026-11-29T17:55:00Z")
    tl = audit.timeline(project, *audit.window(), lookback=timedelta(days=999_999))
    assert tl.open_incidents[0].since.startswith("1970-01-01")
