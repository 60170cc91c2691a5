"""Secrets: the value behind each fingerprint is kept (revert and restore find it), never enters git,
and a change that fails leaves no value behind; a plaintext value pasted into knobs.toml is named,
never shown."""

from __future__ import annotations

import pytest

from knobkeeper.knobs.catalog import fingerprint
from knobkeeper.knobs.state import read_declared
from tests.infra import cli, git, head, kk, snapshot

SECRET = "HF_TOKEN"


def set_secret(project, value: str, **kw):
    """KNOB=VALUE on argv still works (the help says why --value-file is better)."""
    return cli(project, "set", f"{SECRET}={value}", "--role", "decode", "--reason", "token", **kw)


def stored_values(project) -> list[str]:
    store = project.secrets_dir
    return sorted(p.read_text() for p in store.rglob("*") if p.is_file() and p.name != ".gitignore") if store.exists() else []


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
