"""Bad input to the CLI: one line, exit 2, nothing written (a full disk too); and what it prints is safe
for a terminal (escaped) while --json stays raw, with commit trailers no reason can forge."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from datetime import timedelta

import pytest

from knobkeeper.changelog import ops
from tests.infra import cli, git, one_line_exit_2, snapshot

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
PY = sys.executable


# --- bad input: one line, exit 2, nothing written -------------------------------------------------

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
    one_line_exit_2(cli(project, *args), needle)
    assert snapshot(project) == before


def test_invalid_utf8_in_argv_is_one_line(project):
    before = snapshot(project)
    done = subprocess.run([PY.encode(), b"-m", b"knobkeeper.cli", b"set", f"{KNOB}=512".encode(), b"--allow-undeclared", b"--role", b"decode",
                           b"--reason", b"caf\xe9", b"--repo", str(project.root).encode()], capture_output=True)
    one_line_exit_2(done, "not valid UTF-8")
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
    one_line_exit_2(done, f"{path.name}: {field}: ")


def test_parse_duration_refuses_what_no_date_arithmetic_survives():
    from knobkeeper.timeutil import parse_duration

    assert parse_duration("7d") == timedelta(days=7)
    for text in ("99999999999d", "1e9d", "٣d"):
        with pytest.raises(ValueError):
            parse_duration(text)


# --- a full disk: one line, nothing changed (issue 25, finding 10) -------------------------------
# A disk that fills up during `set` ends in one line naming the file and saying that nothing was
# changed, not an OSError traceback. A small RLIMIT_FSIZE in the real CLI's own process stands for the
# full disk (Python ignores SIGXFSZ: a write past it is EFBIG).

def _limited(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_during_set_is_one_line_and_changes_nothing(project):
    before = snapshot(project)
    for limit in (64,):   # the journal fails
        done = subprocess.run([sys.executable, "-m", "knobkeeper.cli", "set", f"{KNOB}=512", "--role", "decode",
                               "--reason", "x", "--allow-undeclared", "--repo", str(project.root)],
                              capture_output=True, text=True, preexec_fn=_limited(limit))
        err = done.stderr.strip()
        assert done.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, (limit, err)
        assert "cannot write (File too large); nothing was changed" in err, err
        assert snapshot(project) == before
    ok = subprocess.run([sys.executable, "-m", "knobkeeper.cli", "set", f"{KNOB}=512", "--role", "decode",
                         "--reason", "x", "--allow-undeclared", "--repo", str(project.root)], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr


# --- terminal safety and trailers -----------------------------------------------------------------

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
