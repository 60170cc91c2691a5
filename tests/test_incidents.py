"""Incidents: open/note/resolve/list/show through the API and the CLI, one commit each with its
trailers, and bad input (unknown ids, entries that are not reverts for the incident, resolving
twice) refused with one line, exit 2 and nothing written."""

from __future__ import annotations

import json
import tomllib
from datetime import timedelta

import pytest
from click.testing import CliRunner

from knobkeeper.changelog import incidents
from knobkeeper.changelog import ops
from knobkeeper.cli import main
from knobkeeper.errors import UserError
from knobkeeper.timeutil import iso, utcnow
from tests.infra import git, kk

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def snapshot(project):
    return (git(project.root, "rev-parse", "HEAD"), git(project.root, "status", "--porcelain", "--untracked-files=all"))


def trailers(project, rev="HEAD") -> list[tuple[str, str]]:
    text = git(project.root, "log", "-1", "--format=%(trailers:only,unfold)", rev)
    return [tuple(line.split(": ", 1)) for line in text.splitlines() if ": " in line]


def suspect_revert(project, incident_id: str):
    ops.set_knob(project, KNOB, "512", "decode", "A/B")
    return ops.revert_knob(project, KNOB, "decode", "suspect", incident=incident_id, hypothesis="the hang stops").entry


def test_open_note_resolve_each_one_commit_with_trailers(project):
    began = iso(utcnow() - timedelta(minutes=7))
    opened = incidents.open_incident(project, "multi-round harness hangs", began)
    inc = opened.incident
    path = incidents.incident_path(project, inc)
    assert path.name == f"{inc.stem}.toml" and path.stem.endswith(f"-{inc.id}")
    assert git(project.root, "log", "-1", "--format=%s") == f'incident {inc.id}: open "multi-round harness hangs"'
    assert trailers(project) == [("Incident", inc.id), ("Action", "open")]
    assert git(project.root, "show", "--name-only", "--format=", "HEAD") == project.rel(path)
    data = tomllib.loads(path.read_text())
    assert data["title"] == "multi-round harness hangs" and data["started"] == began
    assert data["opened_by"] == "Test Operator <test.operator@example.com>" and "status" not in data
    assert inc.status == "open"

    revert = suspect_revert(project, inc.id[:6])  # revert --incident accepts a prefix and stores the full id
    assert revert.incident == inc.id
    noted = incidents.note_incident(project, inc.id, "hang persisted after the revert", refutes=revert.id[:5])
    assert noted.incident.notes[-1].refutes == revert.id
    assert ("Refutes", revert.id) in trailers(project) and ("Action", "note") in trailers(project)
    assert git(project.root, "log", "-1", "--format=%s").startswith(f'incident {inc.id}: note "hang persisted')

    resolved = incidents.resolve_incident(project, inc.id, "faulty client proxy")
    assert resolved.incident.status == "resolved"
    t = trailers(project)
    assert ("Action", "resolve") in t and ("Refutes", revert.id) in t and not [k for k, _ in t if k == "Implicates"]
    again = incidents.find_incident(project, inc.id[:4])
    assert again.resolution.root_cause == "faulty client proxy" and again.resolution.implicates == []
    assert [n.text for n in again.notes] == ["hang persisted after the revert"]
    assert git(project.root, "status", "--porcelain") == ""
    # every step is its own commit: open, set, revert, note, resolve
    assert git(project.root, "rev-list", "--count", "HEAD") == "6"


def test_cli_open_note_resolve_list_show(project):
    result = kk(project, "incident", "open", "multi-round harness hangs", "--started", iso(utcnow() - timedelta(hours=1)), "--json")
    assert result.exit_code == 0, result.output
    ident = json.loads(result.output)["id"]
    revert = suspect_revert(project, ident)
    result = kk(project, "incident", "note", ident, "hang persisted after the revert", "--refutes", revert.id)
    assert result.exit_code == 0 and f"incident {ident}: note (open)" in result.output
    result = kk(project, "incident", "list")
    assert ident in result.output and "open" in result.output and f"{KNOB} refuted" in result.output
    result = kk(project, "incident", "show", ident)
    assert "hang persisted after the revert" in result.output and f"refutes {revert.id}" in result.output
    assert f"revert: {revert.id}" in result.output and "REFUTED" in result.output and "the hang stops" in result.output
    result = kk(project, "incident", "resolve", ident, "--root-cause", "faulty client proxy")
    assert result.exit_code == 0 and "(resolved)" in result.output
    shown = json.loads(kk(project, "incident", "show", ident, "--json").output)
    assert shown["status"] == "resolved" and shown["resolution"]["root_cause"] == "faulty client proxy"
    assert shown["reverts"][0]["status"] == "refuted" and shown["reverts"][0]["source"] == "resolution"
    assert kk(project, "incident", "list", "--status", "open").output.strip() == "no incidents open"
    listed = json.loads(kk(project, "incident", "list", "--json").output)
    assert [i["id"] for i in listed] == [ident]


def test_confirming_note_and_implicating_resolution(project):
    inc = incidents.open_incident(project, "decode OOM").incident
    revert = suspect_revert(project, inc.id)
    incidents.note_incident(project, inc.id, "OOM stopped after the revert", confirms=revert.id)
    assert ("Confirms", revert.id) in trailers(project)
    change = incidents.resolve_incident(project, inc.id, "too many CTAs exhaust shared memory", implicates=[revert.id[:6]])
    assert change.incident.resolution.implicates == [revert.id] and change.warnings == []
    t = trailers(project)
    assert ("Implicates", revert.id) in t and ("Refutes", revert.id) not in t


def test_resolution_that_overrules_a_note_warns(project):
    inc = incidents.open_incident(project, "hang").incident
    revert = suspect_revert(project, inc.id)
    incidents.note_incident(project, inc.id, "hang stopped", confirms=revert.id)
    change = incidents.resolve_incident(project, inc.id, "faulty client proxy")
    assert len(change.warnings) == 1 and "now refuted" in change.warnings[0]


def test_notes_after_resolution_are_plain_only(project):
    inc = incidents.open_incident(project, "hang").incident
    revert = suspect_revert(project, inc.id)
    incidents.resolve_incident(project, inc.id, "faulty client proxy")
    incidents.note_incident(project, inc.id, "restored, no recurrence after 7 days")
    before = snapshot(project)
    with pytest.raises(UserError, match="resolution decides every revert"):
        incidents.note_incident(project, inc.id, "actually it helped", confirms=revert.id)
    assert snapshot(project) == before


@pytest.mark.parametrize("args, message", [
    (["incident", "note", "dead", "x"], "incident 'dead': no such incident"),
    (["incident", "note", "ab", "x"], "give at least 4 characters"),
    (["incident", "resolve", "deadbeef", "--root-cause", "x"], "no such incident"),
    (["incident", "show", "deadbeef"], "no such incident"),
    (["incident", "open", "  "], "must not be empty"),
    (["incident", "open", "t", "--started", "yesterday"], "--started: 'yesterday' is not a time"),
    (["incident", "open", "t", "--started", "2999-01-01"], "in the future"),
])
def test_bad_incident_input_exits_2_and_writes_nothing(shared, args, message):
    project = shared
    before = snapshot(project)
    result = CliRunner().invoke(main, [*args, "--repo", str(project.root)])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert snapshot(project) == before


def test_bad_entry_links_are_refused(project):
    inc = incidents.open_incident(project, "hang").incident
    other = incidents.open_incident(project, "another").incident
    set_entry = ops.set_knob(project, KNOB, "512", "decode", "A/B").entry
    before = snapshot(project)
    with pytest.raises(UserError, match=r"--refutes ffffffff: entry 'ffffffff': no such entry"):
        incidents.note_incident(project, inc.id, "x", refutes="ffffffff")
    with pytest.raises(UserError, match=rf"entry {set_entry.id} is a set of {KNOB} on decode, not a revert"):
        incidents.note_incident(project, inc.id, "x", confirms=set_entry.id)
    with pytest.raises(UserError, match="--implicates ffffffff: entry 'ffffffff': no such entry"):
        incidents.resolve_incident(project, inc.id, "cause", implicates=["ffffffff"])
    revert = ops.revert_knob(project, KNOB, "decode", "suspect", incident=other.id).entry
    before = snapshot(project)
    with pytest.raises(UserError, match=f"was made for incident {other.id}, not for incident {inc.id}"):
        incidents.note_incident(project, inc.id, "x", refutes=revert.id)
    with pytest.raises(UserError, match="cannot both refute and confirm"):
        incidents.note_incident(project, other.id, "x", refutes=revert.id, confirms=revert.id)
    ops.set_knob(project, "NCCL_DEBUG", "INFO", "decode", "debug")
    plain = ops.revert_knob(project, "NCCL_DEBUG", "decode", "noise").entry
    before = snapshot(project)
    with pytest.raises(UserError, match="was made with no incident"):
        incidents.note_incident(project, other.id, "x", refutes=plain.id)
    assert snapshot(project) == before


def test_resolving_twice_is_refused(project):
    inc = incidents.open_incident(project, "hang").incident
    incidents.resolve_incident(project, inc.id, "faulty client proxy")
    before = snapshot(project)
    result = kk(project, "incident", "resolve", inc.id, "--root-cause", "something else")
    assert result.exit_code == 2 and "already resolved" in result.output and "add a note instead" in result.output
    assert snapshot(project) == before


def test_revert_with_unknown_incident_is_refused(project):
    ops.set_knob(project, KNOB, "512", "decode", "A/B")
    before = snapshot(project)
    result = kk(project, "revert", KNOB, "--role", "decode", "--reason", "x", "--incident", "deadbeef")
    assert result.exit_code == 2 and "no such incident" in result.output
    assert snapshot(project) == before


def test_cache_follows_hand_edits_and_malformed_files_are_named(project):
    inc = incidents.open_incident(project, "hang").incident
    assert [i.title for i in incidents.load_incidents(project)] == ["hang"]
    assert (project.private_dir / "incidents.json").exists()
    path = incidents.incident_path(project, inc)
    path.write_text(path.read_text().replace('title = "hang"', 'title = "harness hang"'))
    assert [i.title for i in incidents.load_incidents(project)] == ["harness hang"]
    path.write_text(path.read_text() + "\nseverity = 1\n")
    with pytest.raises(UserError, match=f"{path.name}: unknown field 'severity'"):
        incidents.load_incidents(project)
    path.write_text("id = \n")
    with pytest.raises(UserError, match="malformed TOML"):
        incidents.load_incidents(project)


def test_revert_for_a_resolved_incident_is_refused(project):
    inc = incidents.open_incident(project, "hang").incident
    incidents.resolve_incident(project, inc.id, "faulty client proxy")
    ops.set_knob(project, KNOB, "512", "decode", "A/B")
    before = snapshot(project)
    result = kk(project, "revert", KNOB, "--role", "decode", "--reason", "x", "--incident", inc.id)
    assert result.exit_code == 2 and "resolved at" in result.output and "open a new incident" in result.output
    assert snapshot(project) == before


def test_snapshot_reads_the_incidents_or_the_deployed_stack_never_an_undeployed_default(project, monkeypatch):
    """`incident snapshot ID` read inventory/local.py by default and committed "unreachable" for a
    stack never deployed. It reads the stack the incident's last snapshot read, else the one last
    deployed, and refuses (nothing written) when there is none, or when nothing answers in a stack
    this repo never deployed. The engines are stood in for: what is asked is which stack is read."""
    from knobkeeper.deploy import record, stack
    from knobkeeper.evidence import metrics

    read: list[str] = []
    answers = {"error": "connection refused"}
    monkeypatch.setattr(stack, "running_stack", lambda root, inventory: read.append(inventory) or inventory)
    monkeypatch.setattr(metrics, "snapshot", lambda _stack, window: {"window_s": window, "services": [
        {"host": "@local", "service": "knobkeeper-decode", "role": "decode", **answers}]})
    inc = incidents.open_incident(project, "harness hangs").incident
    before = snapshot(project)
    refused = kk(project, "incident", "snapshot", inc.id, "--window", "0.01")
    assert refused.exit_code == 2 and read == [], refused.output
    assert refused.output == (f"error: incident snapshot {inc.id}: no stack to read: the incident has no snapshot yet "
                              f"and changelog/deploys/ no deploy record; give --inventory PATH of the deployed stack "
                              f"the incident is about\n")
    never = kk(project, "incident", "snapshot", inc.id, "--inventory", "inventory/local.py", "--window", "0.01")
    assert never.exit_code == 2 and "--inventory inventory/local.py: nothing answered, and this repo has no deploy " \
                                    "record of it: not recorded" in never.output, never.output
    assert snapshot(project) == before and read == ["inventory/local.py"]

    def deployed(inventory_path: str, started_at: str) -> None:
        record.save(project, record.DeployRecord(id=started_at[-9:-1], inventory=inventory_path.split("/")[-1][:-3],
                                                 inventory_path=inventory_path, commit="0" * 40, dirty=False,
                                                 allow_dirty=False, options={}, order=[], started_at=started_at,
                                                 result="ok"), commit=True)

    deployed("inventory/local_vllm.py", "2026-12-01T10:00:00.000001Z")
    down = kk(project, "incident", "snapshot", inc.id, "--window", "0.01")  # deployed, down now: the observation
    assert down.exit_code == 0 and read[-1] == "inventory/local_vllm.py", down.output
    assert "knobkeeper-decode unreachable" in down.output
    deployed(f"{project.root}/inventory/local.py", "2026-12-01T11:00:00.000001Z")  # any spelling of the path
    answers = {"error": None, "running": 0, "queued": 0, "tokens_per_s": 0.0}
    kk(project, "incident", "snapshot", inc.id, "--window", "0.01")
    assert read[-1] == "inventory/local_vllm.py"  # the incident's own stack, not the one deployed since
    other = incidents.open_incident(project, "another").incident
    kk(project, "incident", "snapshot", other.id, "--window", "0.01")
    assert read[-1] == "inventory/local.py"  # a new incident: the stack deployed last
    stored = sorted(json.loads(p.read_text())["inventory"] for p in project.incidents_dir.rglob("snapshot-*.json"))
    assert stored == ["inventory/local.py", "inventory/local_vllm.py", "inventory/local_vllm.py"]
