"""The changelog store: history ordered by the commit graph (never a clock), nothing uncommitted swept
into a change or read as if committed, and a killed Python process or git leaves a consistent repo
(the journal, the lock handed to git, index.lock); linked worktrees and long messages work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

from knobkeeper.changelog import ops
from knobkeeper.changelog.entries import load_entries
from knobkeeper.knobs.state import read_declared
from tests.infra import cli, git, kk, snapshot

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
PY = sys.executable


# --- history order --------------------------------------------------------------------------------

def test_order_is_the_commit_graph_not_the_clock(project, monkeypatch):
    import knobkeeper.timeutil as timeutil

    first = ops.set_knob(project, KNOB, "512", "decode", "first, on main").entry
    git(project.root, "switch", "-q", "-c", "pr")
    # a colleague whose clock is an hour behind: commit dates and the entry's stamp
    skewed = timeutil.utcnow() - timedelta(hours=1)
    monkeypatch.setattr(timeutil, "utcnow", lambda: skewed)
    for var in ("GIT_COMMITTER_DATE", "GIT_AUTHOR_DATE"):
        monkeypatch.setenv(var, skewed.isoformat())
    on_branch = ops.set_knob(project, KNOB, "1024", "decode", "the PR's change").entry
    assert on_branch.time < first.time  # the stamp says it came first
    monkeypatch.undo()
    git(project.root, "switch", "-q", "main")
    ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", "newer work on main")
    git(project.root, "merge", "-q", "--no-ff", "pr", "-m", "merge pr")
    assert read_declared(project.knobs_path)["decode"][KNOB] == 1024

    assert [e.reason for e in load_entries(project)] == ["first, on main", "newer work on main", "the PR's change"]
    (project.private_dir / "entry-order.json").unlink()  # the order is the graph's, not the cache's
    assert [e.reason for e in load_entries(project)] == ["first, on main", "newer work on main", "the PR's change"]
    assert ops.unexplained_edits(project) == []  # what check replays
    knobs = {row["knob"]: row for row in json.loads(kk(project, "knobs", "--json").output)}
    assert knobs[KNOB]["entry"] == on_branch.id
    revert = ops.revert_knob(project, KNOB, "decode", "suspect")
    assert revert.entry.reverts == on_branch.id and read_declared(project.knobs_path)["decode"][KNOB] == 512


def test_entries_of_one_commit_keep_file_name_order_and_uncommitted_ones_come_last(project):
    text = project.knobs_path.read_text().replace("[decode]\n", f"[decode]\n{KNOB} = 1024\nNCCL_DEBUG = \"WARN\"\n")
    project.knobs_path.write_text(text)
    record = ops.record_edits(project, "two at once")
    staged = ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", "staged",
                          options=ops.CommitOptions(no_commit=True)).entry
    ids = [e.id for e in load_entries(project)]
    assert ids == sorted((e.id for e in record.entries), key=lambda i: next(e.stem for e in record.entries if e.id == i)) + [staged.id]


# --- uncommitted edits and pending journals -------------------------------------------------------

def test_a_hand_edit_is_never_swept_into_another_change(project):
    text = project.knobs_path.read_text().replace("[decode]\n", f"[decode]\n{KNOB} = 1024\n")
    project.knobs_path.write_text(text)
    before = snapshot(project)
    done = kk(project, "set", "NCCL_DEBUG=INFO", "--role", "prefill", "--reason", "r")
    assert done.exit_code == 2
    assert "inventory/knobs.toml has changes no entry explains; run `knobkeeper record` or undo them" in done.output
    assert snapshot(project) == before
    # a comment is not a value: changes may go on
    project.knobs_path.write_text("# a note by hand\n" + git(project.root, "show", "HEAD:inventory/knobs.toml") + "\n")
    assert kk(project, "set", "NCCL_DEBUG=INFO", "--role", "prefill", "--reason", "r").exit_code == 0


def test_an_earlier_no_commit_is_not_swept_into_the_next_change(project):
    ops.set_knob(project, KNOB, "512", "decode", "try", options=ops.CommitOptions(no_commit=True))
    before = snapshot(project)
    done = kk(project, "set", "NCCL_DEBUG=INFO", "--role", "prefill", "--reason", "r")
    assert done.exit_code == 2 and "not committed yet" in done.output
    assert snapshot(project) == before


def test_read_commands_recover_a_crashed_change_before_reading(project):
    before = snapshot(project)
    crashed = cli(project, "set", f"{KNOB}=512", "--allow-undeclared", "--role", "decode", "--reason", "r",
                  env={"KNOBKEEPER_FAULT": "before-commit:exit"})
    assert crashed.returncode == 70 and (project.private_dir / "journal.json").exists()
    assert json.loads(kk(project, "knobs", "--json").output) == []
    assert kk(project, "log").output == ""
    assert not (project.private_dir / "journal.json").exists()
    assert snapshot(project) == before


# --- crashes of the Python process and of git -----------------------------------------------------

def test_the_lock_covers_a_git_commit_that_outlives_its_parent(project, tmp_path):
    started = tmp_path / "commit-started"
    hook = project.root / ".git" / "hooks" / "reference-transaction"
    # git calls this while the commit's ref update is prepared: the first time, it holds git there.
    hook.write_text(f'#!/bin/sh\nif [ "$1" = prepared ] && [ ! -e {started} ]; then touch {started}; sleep 3; fi\n')
    hook.chmod(0o755)
    writer = subprocess.Popen([PY, "-m", "knobkeeper.cli", "set", f"{KNOB}=512", "--allow-undeclared", "--role", "decode", "--reason", "one",
                               "--repo", str(project.root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.exists()
    os.kill(writer.pid, signal.SIGKILL)  # the Python process dies; its git commit goes on
    writer.wait()
    second = kk(project, "set", "NCCL_DEBUG=INFO", "--role", "prefill", "--reason", "two")
    assert second.exit_code == 0, second.output
    declared = read_declared(project.knobs_path)
    assert declared["prefill"]["NCCL_DEBUG"] == "INFO"
    assert ops.unexplained_edits(project) == []
    assert git(project.root, "status", "--porcelain") == ""
    assert git(project.root, "show", "HEAD:inventory/knobs.toml") == project.knobs_path.read_text().rstrip("\n")


def test_a_stale_index_lock_is_removed_when_no_git_process_is_alive(project):
    lock = project.root / ".git" / "index.lock"
    lock.write_text("")
    done = kk(project, "set", f"{KNOB}=512", "--allow-undeclared", "--role", "decode", "--reason", "r")
    assert done.exit_code == 0, done.output
    assert not lock.exists() and git(project.root, "status", "--porcelain") == ""


def test_an_index_lock_held_by_a_live_git_is_named_in_one_line(project):
    lock = project.root / ".git" / "index.lock"
    lock.write_text("")
    alive = subprocess.Popen(["git", "-C", str(project.root), "cat-file", "--batch"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        before = snapshot(project)
        done = cli(project, "set", f"{KNOB}=512", "--allow-undeclared", "--role", "decode", "--reason", "r")
        err = done.stderr.decode()
        assert done.returncode == 2 and len(err.strip().splitlines()) == 1
        assert str(lock) in err and "['" not in err and f"git process {alive.pid}" in err
        assert snapshot(project) == before
    finally:
        alive.stdin.close()
        alive.wait()


# --- git as users have it -------------------------------------------------------------------------

def test_a_linked_worktree_is_supported(project, tmp_path):
    tree = tmp_path / "wt"
    git(project.root, "worktree", "add", "-q", "-b", "side", str(tree))
    done = subprocess.run([PY, "-m", "knobkeeper.cli", "set", f"{KNOB}=512", "--allow-undeclared", "--role", "decode", "--reason", "r",
                           "--repo", str(tree)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert git(tree, "log", "-1", "--format=%(trailers:key=Knob,valueonly)") == KNOB
    assert git(project.root, "log", "-1", "--format=%s", "main") == "infra repo"
    assert json.loads(subprocess.run([PY, "-m", "knobkeeper.cli", "knobs", "--json", "--repo", str(tree)],
                                     capture_output=True, text=True).stdout)[0]["value"] == 512


def test_a_reason_over_64k_is_committed_whole(project):
    reason = "x" * 200_000  # one argv string is limited to 128 KiB: the message goes on stdin
    change = ops.set_knob(project, KNOB, "512", "decode", reason)
    assert reason in git(project.root, "log", "-1", "--format=%B", change.commit)


# --- the caches beside the lock -------------------------------------------------------------------

def test_a_cache_write_never_takes_a_temp_file_another_process_is_writing(project):
    """The entry-order and entries caches were written through a fixed `<name>.tmp`: two commands
    at once wrote into one temp file, and one renamed the other's half-written bytes into place."""
    ops.set_knob(project, KNOB, "512", "decode", "x")
    private = project.private_dir
    theirs = {private / "entry-order.tmp": "half of another process's order cache",
              private / "entries.tmp": "half of another process's entries cache"}
    for path, text in theirs.items():
        path.write_text(text)
    (private / "entry-order.json").unlink(missing_ok=True)
    (private / "entries.json").unlink(missing_ok=True)
    assert [e.knob for e in load_entries(project)] == [KNOB]
    assert {path: path.read_text() for path in theirs} == theirs
    assert json.loads((private / "entry-order.json").read_text())["order"]
    assert json.loads((private / "entries.json").read_text())["files"]
