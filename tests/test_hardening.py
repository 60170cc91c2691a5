"""What a hostile test of the changelog broke (issue 18), one test per promise: secrets stay
with their fingerprints and out of git, history is ordered by commits not clocks, nothing
uncommitted is swept into a change or read as if committed, crashes of the Python process
or of git leave a consistent repo, and bad input is one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from knobkeeper.changelog import ops
from knobkeeper.changelog.entries import load_entries
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import fingerprint, load_catalog
from knobkeeper.knobs.state import read_declared
from tests.infra import git, kk

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
SECRET = "HF_TOKEN"
PY = sys.executable


def head(project) -> str:
    return git(project.root, "rev-parse", "HEAD")


def snapshot(project) -> tuple[str, str, str]:
    """HEAD, porcelain status (ignored files too) and knobs.toml: 'nothing written' keeps all three."""
    status = git(project.root, "status", "--porcelain", "--untracked-files=all", "--ignored")
    return head(project), status, project.knobs_path.read_text()


def cli(project, *args: str, input: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in its own process (argv bytes, stdin bytes, crashes and exit codes as users see them)."""
    return subprocess.run([PY, "-m", "knobkeeper.cli", *args, "--repo", str(project.root)], input=input,
                          capture_output=True, env={**os.environ, **(env or {})})


def set_secret(project, value: str, **kw):
    """KNOB=VALUE on argv still works (the help says why --value-file is better)."""
    return cli(project, "set", f"{SECRET}={value}", "--role", "decode", "--reason", "token", **kw)


def stored_values(project) -> list[str]:
    store = project.secrets_dir
    return sorted(p.read_text() for p in store.rglob("*") if p.is_file() and p.name != ".gitignore") if store.exists() else []


# --- secrets (items 1, 2, 4, 5) -----------------------------------------------------------

def test_revert_and_restore_of_a_secret_find_the_value_of_their_fingerprint(project):
    assert set_secret(project, "token-a").returncode == 0
    assert set_secret(project, "token-b").returncode == 0
    done = cli(project, "revert", SECRET, "--role", "decode", "--reason", "b is suspect")
    assert done.returncode == 0, done.stderr
    assert stored_values(project) == ["token-a", "token-b"]  # both kept, each under its fingerprint
    from knobkeeper.changelog.secrets import secret_mismatch, secret_value

    declared = read_declared(project.knobs_path)["decode"][SECRET]
    assert declared == fingerprint("token-a")
    assert secret_value(project, "decode", SECRET, declared) == b"token-a"
    assert secret_mismatch(project, "decode", SECRET, declared) is None
    assert cli(project, "restore", SECRET, "--role", "decode").returncode == 0
    declared = read_declared(project.knobs_path)["decode"][SECRET]
    assert secret_value(project, "decode", SECRET, declared) == b"token-b"
    # a stored value edited by hand no longer matches its name: reported, never shipped as in sync
    next(p for p in project.secrets_dir.rglob("*") if p.is_file() and p.read_text() == "token-b").write_text("evil")
    assert secret_value(project, "decode", SECRET, declared) is None
    assert "fingerprint" in secret_mismatch(project, "decode", SECRET, declared)


def test_setting_the_declared_secret_again_on_a_fresh_machine_stores_its_value(project):
    from knobkeeper.changelog.secrets import secret_mismatch

    assert set_secret(project, "token-a").returncode == 0
    before = head(project)
    for path in sorted(project.secrets_dir.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()  # a new clone has no store
    assert "not in" in secret_mismatch(project, "decode", SECRET, fingerprint("token-a"))
    done = set_secret(project, "token-a")
    assert done.returncode == 0 and b"nothing to commit" in done.stderr
    assert head(project) == before and secret_mismatch(project, "decode", SECRET, fingerprint("token-a")) is None


def test_a_value_in_the_old_one_file_layout_is_kept_and_found(project):
    from knobkeeper.changelog.secrets import secret_value

    assert set_secret(project, "token-a").returncode == 0
    folder = project.secrets_dir / "decode" / SECRET
    value_file = next(folder.iterdir())
    value_file.rename(project.secrets_dir / "decode" / "old")
    folder.rmdir()
    (project.secrets_dir / "decode" / "old").rename(folder)  # <role>/<KNOB> is the value itself
    assert secret_value(project, "decode", SECRET, fingerprint("token-a")) == b"token-a"
    assert set_secret(project, "token-b").returncode == 0
    assert cli(project, "revert", SECRET, "--role", "decode", "--reason", "r").returncode == 0
    assert secret_value(project, "decode", SECRET, fingerprint("token-a")) == b"token-a"
    assert stored_values(project) == ["token-a", "token-b"]


@pytest.mark.parametrize("how", ["branch exists", "fault", "crash"])
def test_a_secret_set_that_fails_leaves_no_value_behind(project, how):
    assert set_secret(project, "token-a").returncode == 0
    git(project.root, "branch", "taken")
    before = snapshot(project)
    if how == "branch exists":
        done = cli(project, "set", f"{SECRET}=token-b", "--role", "decode", "--reason", "r", "--branch", "taken")
    else:
        point = "before-commit" if how == "fault" else "before-commit:exit"
        done = set_secret(project, "token-b", env={"KNOBKEEPER_FAULT": point})
        kk(project, "knobs")  # the next command recovers the crash
    assert done.returncode != 0
    assert stored_values(project) == ["token-a"]
    assert snapshot(project) == before


def test_the_secret_store_ignores_itself_and_check_sees_tracked_files(project):
    (project.root / ".gitignore").write_text("__pycache__/\n")  # the repo's own rule is gone
    git(project.root, "commit", "-qam", "drop ignore rules")
    assert set_secret(project, "hf_live_secret").returncode == 0
    git(project.root, "add", "-A")
    assert not any(".knobkeeper-secrets" in line for line in git(project.root, "status", "--porcelain").splitlines())
    from knobkeeper.changelog.secrets import tracked_secret_files

    assert tracked_secret_files(project) == []
    leaked = next(p for p in project.secrets_dir.rglob("*") if p.is_file() and p.name != ".gitignore")
    git(project.root, "add", "-f", str(leaked))
    assert tracked_secret_files(project) == [project.rel(leaked)]


def test_value_file_and_stdin_keep_the_value_byte_for_byte(project, tmp_path):
    from knobkeeper.changelog.secrets import secret_value

    value = "tok\n\n"
    path = tmp_path / "token.txt"
    path.write_bytes(value.encode())
    done = cli(project, "set", SECRET, "--role", "decode", "--reason", "r", "--value-file", str(path))
    assert done.returncode == 0, done.stderr
    assert read_declared(project.knobs_path)["decode"][SECRET] == fingerprint(value)
    assert secret_value(project, "decode", SECRET, fingerprint(value)) == value.encode()
    assert set_secret(project, "other\r\n").returncode == 0
    assert read_declared(project.knobs_path)["decode"][SECRET] == fingerprint("other\r\n")
    assert "ps" in cli(project, "set", "--help").stdout.decode()  # the help says why not argv


def test_plaintext_secret_in_knobs_toml_is_reported_without_its_value(project):
    from knobkeeper.review import check

    def plaintext_secret_problems(project):
        return [f"{p.path}: {p.what}" for p in check(project).problems if "secret" in p.what]

    text = project.knobs_path.read_text().replace("[decode]\n", '[decode]\nHF_TOKEN = "hf_pasted_plaintext"\n')
    project.knobs_path.write_text(text)
    problems = plaintext_secret_problems(project)
    assert len(problems) == 1 and "plaintext value for secret knob HF_TOKEN (not shown)" in problems[0]
    assert "hf_pasted_plaintext" not in problems[0]
    done = cli(project, "knobs")
    assert done.returncode == 2 and b"hf_pasted_plaintext" not in done.stderr + done.stdout
    assert b"(not shown)" in done.stderr
    project.knobs_path.write_text(text.replace('"hf_pasted_plaintext"', f'"{fingerprint("x")}"'))
    assert plaintext_secret_problems(project) == []


# --- names (item 6) -------------------------------------------------------------------------

def test_catalog_knob_names_must_be_shell_variable_names(project):
    with open(project.catalog_path, "a") as handle:
        handle.write('\n[knobs."X;touch /tmp/p;Y"]\ntype = "int"\nroles = ["decode"]\nrisk = "perf"\n'
                     'source = "x"\nunset = "x"\ndoc = "x"\n')
    with pytest.raises(UserError, match=r"catalog.toml: .*'X;touch /tmp/p;Y' is not a valid variable name"):
        load_catalog(project.catalog_path)


# --- history order (item 8) -----------------------------------------------------------------

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


# --- uncommitted edits and pending journals (items 9, 10) -----------------------------------

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


# --- crashes of the Python process and of git (items 11, 12) --------------------------------

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


# --- bad input: one line, exit 2, nothing written (item 13) ---------------------------------

def _one_line_exit_2(done, needle: str) -> None:
    err = done.stderr.decode() if isinstance(done.stderr, bytes) else done.stderr
    assert done.returncode == 2, (done.returncode, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and needle in err, err


@pytest.mark.parametrize("args,needle", [
    (["show", "****"], "no such entry"),
    (["show", "**/*"], "no such entry"),
    (["set", f"{KNOB}=512", "--allow-undeclared", "--role", "decode", "--reason", "r", "--evidence", "**"], "--evidence '**'"),
    (["log", "--since", "9999-12-31T23:59:59-01:00"], "out of range"),
    (["incident", "open", "hang", "--started", "0001-01-01"], "before 1970-01-01"),
])
def test_bad_arguments_are_one_line(project, args, needle):
    ops.set_knob(project, KNOB, "256", "decode", "something to look at")
    before = snapshot(project)
    _one_line_exit_2(cli(project, *args), needle)
    assert snapshot(project) == before


def test_invalid_utf8_in_argv_is_one_line(project):
    before = snapshot(project)
    done = subprocess.run([PY.encode(), b"-m", b"knobkeeper.cli", b"set", f"{KNOB}=512".encode(), b"--allow-undeclared", b"--role", b"decode",
                           b"--reason", b"caf\xe9", b"--repo", str(project.root).encode()], capture_output=True)
    _one_line_exit_2(done, "not valid UTF-8")
    assert snapshot(project) == before


@pytest.mark.parametrize("field,bad", [
    ("time", "7"), ("time", '"yesterday"'), ("knob", "7"), ("author", '["x"]'), ("evidence", "[1, 2]"),
    ("reason", "42"), ("new", "{ a = 1 }"),
])
def test_entry_fields_of_the_wrong_type_are_one_line_naming_file_and_field(project, field, bad):
    change = ops.set_knob(project, KNOB, "512", "decode", "why")
    path = project.entries_dir / f"{change.entry.stem}.toml"
    lines = [line for line in path.read_text().splitlines() if not line.startswith(f"{field} =")]
    path.write_text("\n".join(lines) + f"\n{field} = {bad}\n")
    done = cli(project, "log")
    _one_line_exit_2(done, f"{path.name}: {field}: ")


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


def test_parse_duration_refuses_what_no_date_arithmetic_survives():
    from knobkeeper.timeutil import parse_duration

    assert parse_duration("7d") == timedelta(days=7)
    for text in ("99999999999d", "1e9d", "٣d"):
        with pytest.raises(ValueError):
            parse_duration(text)


# --- terminal safety and strict values (item 16) --------------------------------------------

def test_log_show_and_knobs_escape_what_they_print_and_json_stays_raw(project):
    reason = "looks fine\n2026-01-01T00:00:00Z deadbeef decode: set FAKE 1 -> 2\x1b]0;pwned\x07 \x1b[31mred\u202e"
    change = ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", reason)
    for args in (["log"], ["show", change.entry.id], ["knobs"]):
        out = cli(project, *args).stdout.decode()
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out, args
    log = cli(project, "log").stdout.decode()
    assert "\\x1b]0;pwned" in log and len(log.strip().splitlines()) == 2
    assert json.loads(cli(project, "log", "--json").stdout)[0]["reason"] == reason


def test_trailers_stay_parseable_and_unforgeable_whatever_the_reason_holds(project):
    reason = "why\n---\nKnob: FORGED\nRole: router\n\nEntry: 00000000\nAction: unset"
    change = ops.set_knob(project, KNOB, "512", "decode", reason)
    message = git(project.root, "log", "-1", "--format=%B", change.commit)
    parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=message, capture_output=True,
                            text=True).stdout.splitlines()
    assert parsed == [f"Knob: {KNOB}", "Role: decode", "Action: set", "Old: (unset)", "New: 512",
                      f"Entry: {change.entry.id}"]


@pytest.mark.parametrize("name,raw", [
    (KNOB, "1_000"), (KNOB, "0x10"), (KNOB, "\u0661\u0662\u0663"), (KNOB, "5e2"), (KNOB, "9" * 5000),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1_0.5"), ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "inf"),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "\u0662.5"), ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "1e400"),
])
def test_numbers_are_what_the_catalog_documents_only(name, raw):
    catalog = load_catalog(Path(__file__).parent.parent / "inventory" / "catalog.toml")
    with pytest.raises(UserError, match="expected"):
        catalog.get(name).parse(raw)


def test_documented_number_forms_still_parse():
    catalog = load_catalog(Path(__file__).parent.parent / "inventory" / "catalog.toml")
    assert catalog.get(KNOB).parse(" +512 ") == 512
    interval = catalog.get("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL")
    assert interval.parse("2.5") == 2.5 and interval.parse("25e-1") == 2.5 and interval.parse(".5") == 0.5


@pytest.mark.parametrize("bound", ["min", "max"])
def test_a_catalog_bound_of_nan_fails_validation(project, bound):
    text = project.catalog_path.read_text().replace("min = 1\nmax = 8192\n", f"{bound} = nan\n", 1)
    assert "nan" in text
    project.catalog_path.write_text(text)
    with pytest.raises(UserError, match=rf"knobs\.{KNOB}\.{bound}: expected a finite number"):
        load_catalog(project.catalog_path)
