"""The knob catalog, declared state and the git-backed changelog: API and CLI, bad input,
merges across branches, racing writers, and crashes between writing and committing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper.changelog import ops
from knobkeeper.changelog.entries import load_entries
from knobkeeper.cli import main
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import fingerprint, load_catalog
from knobkeeper.knobs.state import read_declared
from tests.infra import git, kk, set_identity

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def head(project) -> str:
    return git(project.root, "rev-parse", "HEAD")


def tree_snapshot(project) -> tuple[str, str, str]:
    """HEAD, porcelain status and knobs.toml: what 'nothing written' must leave unchanged."""
    return head(project), git(project.root, "status", "--porcelain", "--untracked-files=all"), project.knobs_path.read_text()


# --- the catalog ---------------------------------------------------------------------------

def test_shipped_catalog_has_the_field_knobs_with_their_defaults():
    catalog = load_catalog(Path(__file__).parent.parent / "inventory" / "catalog.toml")
    assert catalog.get(KNOB).type == "int" and catalog.get(KNOB).roles == ("decode",) and catalog.get(KNOB).risk == "perf"
    defaults = {
        "SGLANG_DISAGGREGATION_QUEUE_SIZE": 4, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": 300,
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": 5, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": 2,
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 300,
    }
    for name, default in defaults.items():
        assert catalog.get(name).default == default, name
    assert catalog.get("NCCL_IB_DISABLE").type == "bool"
    assert catalog.get("NCCL_DEBUG").choices
    assert catalog.get("KNOBKEEPER_SPLITKV_TARGET_CTAS").source == "knobkeeper-kernels"
    assert any(k.secret for k in catalog.knobs.values())


@pytest.mark.parametrize("name,raw,expected", [
    (KNOB, "512", 512), (KNOB, "+512", 512), ("NCCL_IB_DISABLE", "yes", True), ("NCCL_IB_DISABLE", "0", False),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2.5", 2.5), ("NCCL_DEBUG", "INFO", "INFO"),
])
def test_parse_typed_values(name, raw, expected):
    catalog = load_catalog(Path(__file__).parent.parent / "inventory" / "catalog.toml")
    assert catalog.get(name).parse(raw) == expected


@pytest.mark.parametrize("name,raw,accepted", [
    (KNOB, "abc", "an integer in [1, 8192]"), (KNOB, "0", "an integer in [1, 8192]"), (KNOB, "9000", "[1, 8192]"),
    ("NCCL_IB_DISABLE", "maybe", "true or false"), ("NCCL_DEBUG", "LOUD", "one of VERSION, WARN, INFO, TRACE"),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "nan", "a number"),
])
def test_parse_rejects_with_what_is_accepted(name, raw, accepted):
    catalog = load_catalog(Path(__file__).parent.parent / "inventory" / "catalog.toml")
    with pytest.raises(UserError, match="expected .*" + accepted.replace("[", r"\[").replace("]", r"\]")):
        catalog.get(name).parse(raw)


def test_catalog_command_lists_and_describes(project):
    listing = kk(project, "catalog")
    assert listing.exit_code == 0 and KNOB in listing.output and "NCCL_DEBUG" in listing.output
    one = kk(project, "catalog", KNOB)
    assert "decode" in one.output and "perf" in one.output and "unset means" in one.output
    data = json.loads(kk(project, "catalog", "--json").output)
    assert {k["name"] for k in data} >= {KNOB, "NCCL_IB_DISABLE"}


# --- the five-minute tour, through the CLI -------------------------------------------------

def test_tour_set_knobs_log_git_log_revert_restore(project):
    start = head(project)
    out = kk(project, "set", f"{KNOB}=512", "--role", "decode", "--reason", "A/B: +12.8% at 64", "--allow-undeclared")
    assert out.exit_code == 0, out.output
    entry_id = out.output.split("(entry ")[1].split(")")[0]
    assert git(project.root, "rev-list", "--count", f"{start}..HEAD") == "1"

    knobs = json.loads(kk(project, "knobs", "--json").output)
    assert knobs == [{"role": "decode", "knob": KNOB, "value": 512, "entry": entry_id, "action": "set",
                      "time": knobs[0]["time"], "author": "Test Operator <test.operator@example.com>"}]
    assert "[decode]\nSGLANG_SM120_MMA_TARGET_CTAS = 512" in project.knobs_path.read_text()
    # the comments of the hand-written file survive machine edits
    assert project.knobs_path.read_text().startswith("# Declared knob values per role")

    trailers = git(project.root, "log", "-1", "--format=%(trailers)")
    assert f"Knob: {KNOB}" in trailers and "Role: decode" in trailers and "Action: set" in trailers
    assert "Old: (unset)" in trailers and "New: 512" in trailers and f"Entry: {entry_id}" in trailers

    revert = kk(project, "revert", KNOB, "--role", "decode", "--reason", "suspect in hang")
    assert revert.exit_code == 0, revert.output
    assert "SGLANG_SM120_MMA_TARGET_CTAS" not in project.knobs_path.read_text().split("[decode]")[1].split("[router]")[0]
    assert f"Reverts: {entry_id}" in git(project.root, "log", "-1", "--format=%(trailers)")

    restore = kk(project, "restore", KNOB, "--role", "decode")
    assert restore.exit_code == 0, restore.output
    assert read_declared(project.knobs_path)["decode"][KNOB] == 512
    log = kk(project, "log", KNOB)
    lines = [line for line in log.output.splitlines() if not line.startswith(" ")]
    assert [line.split()[3] for line in lines] == ["restore", "revert", "set"]
    assert git(project.root, "status", "--porcelain") == ""


def test_show_and_log_json_and_filters(project):
    change = ops.set_knob(project, KNOB, "512", "decode", "why")
    ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", "debugging")
    shown = json.loads(kk(project, "show", change.entry.id[:6], "--json").output)
    assert shown["knob"] == KNOB and shown["new"] == 512 and shown["reason"] == "why"
    assert "action: set" in kk(project, "show", change.entry.id).output.replace("    ", "")
    assert len(json.loads(kk(project, "log", "--json").output)) == 2
    assert [e["knob"] for e in json.loads(kk(project, "log", "--role", "prefill", "--json").output)] == ["NCCL_DEBUG"]
    assert json.loads(kk(project, "log", "--since", "2999-01-01", "--json").output) == []
    assert kk(project, "log", "--since", "yesterday").exit_code == 2


def test_unset_and_typed_values_round_trip(project):
    ops.set_knob(project, "NCCL_IB_DISABLE", "true", "decode", "no IB on this fabric")
    ops.set_knob(project, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "2.5", "prefill", "faster failover")
    declared = read_declared(project.knobs_path)
    assert declared["decode"]["NCCL_IB_DISABLE"] is True
    assert declared["prefill"]["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == 2.5
    out = kk(project, "unset", "NCCL_IB_DISABLE", "--role", "decode", "--reason", "IB fixed")
    assert out.exit_code == 0, out.output
    assert "NCCL_IB_DISABLE" not in read_declared(project.knobs_path)["decode"]
    assert ops.unexplained_edits(project) == []


def test_secret_value_never_reaches_git(project):
    secret = "hf_live_very_secret_token"
    out = kk(project, "set", f"HF_TOKEN={secret}", "--role", "decode", "--reason", "gated weights")
    assert out.exit_code == 0, out.output
    assert secret not in out.output
    history = subprocess.run(["git", "-C", str(project.root), "log", "-p", "--all"], capture_output=True, text=True).stdout
    assert secret not in history and fingerprint(secret) in history
    stored = project.secrets_dir / "decode" / "HF_TOKEN" / fingerprint(secret).removeprefix("sha256:")
    assert stored.read_text() == secret and (stored.stat().st_mode & 0o777) == 0o600
    assert git(project.root, "status", "--porcelain") == ""  # .knobkeeper-secrets/ is ignored
    assert read_declared(project.knobs_path)["decode"]["HF_TOKEN"] == fingerprint(secret)


def test_record_turns_hand_edits_into_entries_in_one_commit(project):
    text = project.knobs_path.read_text().replace("[decode]\n", f"[decode]\n{KNOB} = 1024\nNCCL_DEBUG = \"WARN\"\n")
    project.knobs_path.write_text(text)
    git(project.root, "commit", "-qam", "hand edit")
    assert ops.unexplained_edits(project)
    before = head(project)
    out = kk(project, "record", "--reason", "hot fix during incident")
    assert out.exit_code == 0, out.output
    assert git(project.root, "rev-list", "--count", f"{before}..HEAD") == "1"
    actions = {(e.knob, e.action, e.new) for e in load_entries(project)}
    assert actions == {(KNOB, "record", 1024), ("NCCL_DEBUG", "record", "WARN")}
    assert ops.unexplained_edits(project) == []
    assert kk(project, "record", "--reason", "again").exit_code == 2


def test_no_commit_stages_and_branch_commits_on_a_new_branch(project):
    before = head(project)
    change = ops.set_knob(project, KNOB, "512", "decode", "try", options=ops.CommitOptions(no_commit=True))
    assert change.commit is None and head(project) == before
    staged = git(project.root, "diff", "--cached", "--name-only").splitlines()
    assert "inventory/knobs.toml" in staged and any(p.startswith("changelog/entries/") for p in staged)
    git(project.root, "commit", "-qm", "by hand")
    out = kk(project, "set", "NCCL_DEBUG=INFO", "--role", "decode", "--reason", "r", "--branch", "knob/nccl-debug")
    assert out.exit_code == 0, out.output
    assert git(project.root, "branch", "--show-current") == "knob/nccl-debug"
    assert git(project.root, "log", "-1", "--format=%s", "main") == "by hand"
    again = kk(project, "set", "NCCL_DEBUG=WARN", "--role", "decode", "--reason", "r", "--branch", "knob/nccl-debug")
    assert again.exit_code == 2 and "already exists" in again.output


DECODE_MANIFESTS = ("manifests/example_k8s/decode.yaml", "manifests/local_k8s/decode.yaml")


def test_commit_holds_only_its_own_paths(project):
    notes = project.root / "NOTES.md"
    notes.write_text("staged work\n")
    git(project.root, "add", "NOTES.md")
    (project.root / "inventory" / "local.py").write_text("# unstaged edit\n") if (project.root / "inventory" / "local.py").exists() else None
    scratch = project.root / "scratch.txt"
    scratch.write_text("untracked\n")
    change = ops.set_knob(project, KNOB, "512", "decode", "only mine")
    committed = git(project.root, "show", "--name-only", "--format=", change.commit).splitlines()
    # its entry, knobs.toml, and the manifests it renders anew (the Kubernetes inventories' decode role)
    assert sorted(committed) == sorted(["inventory/knobs.toml", f"changelog/entries/{change.entry.stem}.toml",
                                        *DECODE_MANIFESTS])
    assert "A  NOTES.md" in git(project.root, "status", "--porcelain")  # still staged, not committed
    assert scratch.exists()


# --- bad input: one line, exit 2, nothing written ------------------------------------------

def _bad(project, args, needle):
    before = tree_snapshot(project)
    result = kk(project, *args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.output
    assert tree_snapshot(project) == before


def test_bad_inputs_exit_2_and_write_nothing(project):
    ops.set_knob(project, "NCCL_DEBUG", "INFO", "decode", "x")
    _bad(project, ["set", "SGLANG_SM120_MMA_TARGET_CTS=5", "--role", "decode", "--reason", "x"], f"did you mean {KNOB}")
    _bad(project, ["set", f"{KNOB}=fast", "--role", "decode", "--reason", "x"], "expected an integer in [1, 8192]")
    _bad(project, ["set", f"{KNOB}=100000", "--role", "decode", "--reason", "x"], "[1, 8192]")
    _bad(project, ["set", f"{KNOB}=512", "--role", "prefill", "--reason", "x"], "applies to decode")
    _bad(project, ["set", f"{KNOB}", "--role", "decode", "--reason", "x"], "expected KNOB=VALUE")
    _bad(project, ["set", f"{KNOB}=512", "--role", "decode", "--reason", " "], "--reason is required")
    _bad(project, ["set", f"{KNOB}=512", "--role", "decode", "--reason", "x", "--evidence", "deadbeef"], "no such evidence")
    _bad(project, ["revert", KNOB, "--role", "decode", "--reason", "x"], "nothing to revert")
    _bad(project, ["restore", "NCCL_DEBUG", "--role", "decode"], "nothing reverted to restore")
    _bad(project, ["revert", "NCCL_DEBUG", "--role", "decode", "--reason", "x", "--incident", "abcd1234"], "no such incident")
    _bad(project, ["unset", KNOB, "--role", "decode", "--reason", "x"], "not set on decode")
    _bad(project, ["show", "ffffffff"], "no such entry")
    _bad(project, ["set", "NCCL_DEBUG=INFO", "--role", "decode", "--reason", "x"], "already INFO")


def test_revert_twice_is_nothing_to_revert(project):
    ops.set_knob(project, KNOB, "512", "decode", "x")
    ops.revert_knob(project, KNOB, "decode", "suspect")
    _bad(project, ["revert", KNOB, "--role", "decode", "--reason", "x"], "is a revert")


BIND = "VLLM_CPU_OMP_THREADS_BIND"  # only vLLM's registry declares it; inventory/local_vllm.py runs it from knob_defaults


def test_revert_restore_unset_without_the_stack_hint_it_as_set_does(project):
    """A knob declared only under [vllm.decode]: without --stack, revert said only "nothing to
    revert", where set names the stack; each now gives set's hint, in its own verb."""
    ops.set_knob(project, BIND, "0-1", "vllm.decode", "both cores")
    _bad(project, ["set", f"{BIND}=0", "--role", "decode", "--reason", "x"], "; declare it for --stack vllm")
    _bad(project, ["revert", BIND, "--role", "decode", "--reason", "x"],
         f"revert {BIND} on decode: nothing to revert (no changelog entry for it); revert it for --stack vllm")
    _bad(project, ["restore", BIND, "--role", "decode"], "(it has no changelog entry); restore it for --stack vllm")
    _bad(project, ["unset", BIND, "--role", "decode", "--reason", "x"], "nothing to unset; unset it for --stack vllm")
    alone = kk(project, "revert", KNOB, "--role", "decode", "--reason", "x")  # in no stack: no stack to name
    assert alone.exit_code == 2 and alone.output.rstrip().endswith("nothing to revert (no changelog entry for it)")


def test_malformed_files_are_named_with_their_line(project):
    good = project.knobs_path.read_text()
    project.knobs_path.write_text(good + "\n[decode\n")
    git(project.root, "commit", "-qam", "broken")
    _bad(project, ["knobs"], "inventory/knobs.toml: malformed TOML")
    _bad(project, ["set", f"{KNOB}=1", "--role", "decode", "--reason", "x"], "(at line")
    project.knobs_path.write_text(good.replace("[decode]\n", "[decode]\nSGLANG_SM120_MMA_TARGET_CTAS = \"many\"\n"))
    git(project.root, "commit", "-qam", "bad value")
    _bad(project, ["knobs"], "[decode] SGLANG_SM120_MMA_TARGET_CTAS='many'")
    project.knobs_path.write_text(good)
    git(project.root, "commit", "-qam", "fixed")
    catalog = project.catalog_path.read_text()
    project.catalog_path.write_text(catalog.replace('risk = "perf"', 'risk = "speedy"', 1))
    git(project.root, "commit", "-qam", "bad catalog")
    _bad(project, ["catalog"], "knobs.SGLANG_SM120_MMA_TARGET_CTAS.risk: expected one of perf, numerics, behaviour")
    project.catalog_path.write_text(catalog)
    git(project.root, "commit", "-qam", "catalog fixed")
    change = ops.set_knob(project, KNOB, "512", "decode", "x")
    entry_file = project.entries_dir / f"{change.entry.stem}.toml"
    entry_file.write_text(entry_file.read_text() + "oops = [\n")
    git(project.root, "commit", "-qam", "corrupt entry")
    _bad(project, ["log"], f"changelog/entries/{change.entry.stem}.toml: malformed TOML")


def test_not_a_repository_detached_head_and_merge_in_progress(project, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    result = CliRunner().invoke(main, ["knobs", "--repo", str(plain)])
    assert result.exit_code == 2 and "not a git repository" in result.output

    ops.set_knob(project, KNOB, "512", "decode", "x")
    git(project.root, "checkout", "-q", "--detach", "HEAD")
    _bad(project, ["set", "NCCL_DEBUG=INFO", "--role", "decode", "--reason", "x"], "HEAD is detached")
    git(project.root, "checkout", "-q", "main")

    git(project.root, "checkout", "-q", "-b", "other")
    ops.set_knob(project, KNOB, "1024", "decode", "other")
    git(project.root, "checkout", "-q", "main")
    ops.set_knob(project, KNOB, "256", "decode", "main")
    subprocess.run(["git", "-C", str(project.root), "merge", "-q", "other"], capture_output=True)
    assert (project.git_dir / "MERGE_HEAD").exists()
    result = kk(project, "set", "NCCL_DEBUG=INFO", "--role", "decode", "--reason", "x")
    assert result.exit_code == 2 and "a merge is in progress" in result.output


# --- merges, races, crashes ----------------------------------------------------------------

def test_two_branches_adding_entries_merge_without_conflict(project):
    ops.set_knob(project, KNOB, "256", "decode", "base")
    git(project.root, "checkout", "-q", "-b", "alice")
    for value in ("512", "1024"):
        ops.set_knob(project, KNOB, value, "decode", f"alice {value}")
    git(project.root, "checkout", "-q", "main")
    git(project.root, "checkout", "-q", "-b", "bob")
    ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", "bob")
    ops.set_knob(project, "SGLANG_DISAGGREGATION_QUEUE_SIZE", "8", "prefill", "bob")
    git(project.root, "checkout", "-q", "main")
    git(project.root, "merge", "-q", "--no-edit", "alice")
    merged = subprocess.run(["git", "-C", str(project.root), "merge", "--no-edit", "bob"], capture_output=True, text=True)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    entries = load_entries(project)
    assert len(entries) == 5 and len({e.id for e in entries}) == 5
    assert [e.time for e in entries] == sorted(e.time for e in entries)
    assert ops.unexplained_edits(project) == []
    assert read_declared(project.knobs_path)["decode"][KNOB] == 1024


RACER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from knobkeeper.changelog import ops
    from knobkeeper.project import Project
    project, knob, role, rounds = Project(Path(sys.argv[1])), sys.argv[2], sys.argv[3], int(sys.argv[4])
    for i in range(rounds):
        ops.set_knob(project, knob, str(i % 3 + 1 if knob != "NCCL_DEBUG" else ["INFO", "WARN", "TRACE"][i % 3]), role, f"race {i}")
""")


def test_racing_writers_serialise_on_the_lock(project):
    rounds = 12
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(project.root), KNOB, "decode", str(rounds)]),
        subprocess.Popen([sys.executable, "-c", RACER, str(project.root), "NCCL_DEBUG", "decode", str(rounds)]),
    ]
    assert [p.wait(120) for p in racers] == [0, 0]
    entries = load_entries(project)
    assert len(entries) == 2 * rounds
    assert git(project.root, "rev-list", "--count", "HEAD") == str(2 * rounds + 1)
    assert git(project.root, "status", "--porcelain") == ""
    assert ops.unexplained_edits(project) == []
    for sha in git(project.root, "rev-list", "HEAD~" + str(2 * rounds) + "..HEAD").splitlines():
        files = git(project.root, "show", "--name-only", "--format=", sha).splitlines()
        # knobs.toml, exactly its own entry, and the decode manifests that change with it
        assert len([f for f in files if not f.startswith("manifests/")]) == 2
        assert set(files) - {f for f in files if not f.startswith("manifests/")} == set(DECODE_MANIFESTS), files


# --- the Old of a change: what the role ran, declared or the inventories' knob_defaults -------

INVENTORY_DEFAULT = "1 (inventory default: inventory/local_vllm.py)"


def test_a_first_set_names_the_inventory_default_the_role_ran(project):
    """knobs.toml declares nothing for [vllm.decode], but inventory/local_vllm.py runs decode with
    BIND=1 (knob_defaults): the first set recorded `(unset) -> 0-1`. Its Old is that 1 now, saying
    where it came from, alike in the entry, the trailer, the command's line, `log` and the review;
    the revert takes the role back to it by removing the declaration; declaring the default itself
    is still a change."""
    git(project.root, "rm", "-q", "inventory/example_prod_vllm.py")  # local_vllm.py alone runs stack vllm
    git(project.root, "commit", "-qm", "one vLLM inventory")
    base, before = head(project), project.knobs_path.read_text()
    done = kk(project, "set", f"{BIND}=0-1", "--stack", "vllm", "--role", "decode", "--reason", "both cores")
    assert done.exit_code == 0, done.output
    assert f"vllm.decode: set {BIND}: {INVENTORY_DEFAULT} -> 0-1  (entry " in done.output
    [entry] = load_entries(project)
    assert (entry.old, entry.old_from) == ("1", "inventory default: inventory/local_vllm.py")
    assert f"Old: {INVENTORY_DEFAULT}\nNew: 0-1" in git(project.root, "log", "-1", "--format=%(trailers)")
    assert f"{INVENTORY_DEFAULT} -> 0-1" in kk(project, "log", BIND).output
    review = kk(project, "review", "--base", base)
    assert review.exit_code == 0, review.output
    assert f"| vllm.decode | `{BIND}` | {INVENTORY_DEFAULT} -> 0-1 | set |" in review.output

    ops.revert_knob(project, BIND, "vllm.decode", "suspect")
    assert BIND not in read_declared(project.knobs_path)["vllm.decode"]  # the role runs the default 1 again
    assert project.knobs_path.read_text() == before + "\n[vllm.decode]\n"  # the table set added stays, empty
    declared = ops.set_knob(project, BIND, "1", "vllm.decode", "declare the baseline").entry
    assert (declared.old, declared.old_from, declared.new) == ("1", "inventory default: inventory/local_vllm.py", "1")


def test_a_first_set_says_so_when_the_stacks_inventories_run_different_values(project):
    """Stack vllm's two inventories disagree (local_vllm.py runs 1, example_prod_vllm.py the
    engine's default): the Old names both instead of picking one."""
    entry = ops.set_knob(project, BIND, "0-1", "vllm.decode", "both cores").entry
    differ = "inventory defaults differ: engine default in inventory/example_prod_vllm.py, 1 in inventory/local_vllm.py"
    assert (entry.old, entry.old_from) == (None, differ)
    assert f"Old: (unset; {differ})" in git(project.root, "log", "-1", "--format=%(trailers:unfold)")
    plain = ops.set_knob(project, "NCCL_DEBUG", "INFO", "vllm.decode", "no inventory default").entry
    assert (plain.old, plain.old_from) == (None, None)


def test_a_failure_between_writing_and_committing_leaves_the_old_state(project, monkeypatch):
    before = tree_snapshot(project)
    monkeypatch.setenv("KNOBKEEPER_FAULT", "after-write")
    with pytest.raises(RuntimeError, match="injected"):
        ops.set_knob(project, KNOB, "512", "decode", "x")
    assert tree_snapshot(project) == before
    monkeypatch.setenv("KNOBKEEPER_FAULT", "before-commit")
    with pytest.raises(RuntimeError, match="injected"):
        ops.set_knob(project, KNOB, "512", "decode", "x")
    assert tree_snapshot(project) == before


def test_a_killed_process_is_rolled_back_by_the_next_command(project):
    before = tree_snapshot(project)
    env = {**os.environ, "KNOBKEEPER_FAULT": "after-write:exit"}
    died = subprocess.run([sys.executable, "-m", "knobkeeper.cli", "set", f"{KNOB}=512", "--role", "decode",
                           "--reason", "x", "--allow-undeclared", "--repo", str(project.root)], env=env, capture_output=True)
    assert died.returncode == 70
    assert tree_snapshot(project) != before  # the half-written change is on disk...
    assert (project.private_dir / "journal.json").exists()
    change = ops.set_knob(project, "NCCL_DEBUG", "INFO", "decode", "next command")  # ...until the next writer
    assert [e.knob for e in load_entries(project)] == ["NCCL_DEBUG"]
    assert KNOB not in project.knobs_path.read_text()
    assert git(project.root, "status", "--porcelain") == ""
    assert change.commit == head(project)


def test_every_command_help_ends_with_an_example():
    def walk(group, prefix=()):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, (*prefix, name))
            else:
                yield (*prefix, name)

    for path in walk(main):
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, path
        assert "Example:" in result.output and "knobkeeper " in result.output.split("Example:")[1], path


def test_identity_comes_from_git_config(infra_repo):
    project = infra_repo(identity="Ada Operator")
    change = ops.set_knob(project, KNOB, "64", "decode", "x")
    assert change.entry.author == "Ada Operator <ada.operator@example.com>"
    set_identity(project.root, "Grace Operator")
    assert ops.set_knob(project, KNOB, "128", "decode", "x").entry.author.startswith("Grace Operator")
