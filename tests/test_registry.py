"""The engine registry: sglang's own variable declarations (srt/environ.py) per version, imported into
inventory/engines/, and what `set`, `check` and `catalog diff` make of them.

The real wheels (sglang 0.5.23, 0.5.6) come from PyPI once (`pip download --no-deps`) into the
user's cache dir (~/.cache/knobkeeper, or $KNOBKEEPER_CACHE); later runs read them from there.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from knobkeeper.changelog import ops
from knobkeeper.engine import pins as engine_pins
from knobkeeper.engine.source import cached_wheel
from knobkeeper.errors import UserError
from knobkeeper.knobs import pinned, registry
from knobkeeper.knobs.catalog import load_catalog
from tests.infra import git, kk, refused, snapshot

STORY = "SGLANG_SM120_MMA_TARGET_CTAS"
SHIPPED = Path(__file__).resolve().parent.parent / "inventory" / "engines" / "sglang-0.5.23.json"


@pytest.fixture(scope="module")
def fresh_023() -> dict:
    return registry.generate("sglang", version="0.5.23")


def _wheel(path: Path, name: str, version: str, environ: str | None) -> Path:
    wheel = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
        if environ is not None:
            zf.writestr("sglang/srt/environ.py", environ)
    return wheel


TINY_ENVIRON = '''
class EnvField:
    def __init__(self, default, secret=False):
        self.default = default
        self.secret = secret
class EnvInt(EnvField): pass
class EnvStr(EnvField): pass
class Envs:
    # Queues between prefill and decode.
    SGLANG_TINY_QUEUES = EnvInt(4)
    {extra}
'''


# --- the real registry ---------------------------------------------------------------------------


def test_real_023_registry_types_defaults_and_docs(fresh_023):
    knobs = fresh_023["knobs"]
    assert 700 <= fresh_023["count"] == len(knobs) <= 900
    kinds = {entry["kind"] for entry in knobs.values()}
    assert {"EnvBool", "EnvInt", "EnvFloat", "EnvStr", "EnvTuple", "EnvJSON"} <= kinds
    assert knobs["SGLANG_DISAGGREGATION_QUEUE_SIZE"] == {**knobs["SGLANG_DISAGGREGATION_QUEUE_SIZE"], "type": "int", "default": 4}
    assert knobs["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"]["type"] == "float"
    assert knobs["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"]["default"] == 5.0
    assert knobs["SGLANG_DISAGGREGATION_THREAD_POOL_SIZE"]["default"] is None
    assert knobs["IS_H200"]["type"] == "bool" and knobs["IS_H200"]["default"] is False
    assert knobs["SGLANG_ROLE_NAMESPACES"]["type"] == "string" and knobs["SGLANG_ROLE_NAMESPACES"]["default"] == "off"
    # EnvTuple and EnvJSON are text to the process: strings, their kind kept.
    tuple_knob = knobs["SGLANG_DISABLED_MODEL_ARCHS"]
    assert (tuple_knob["type"], tuple_knob["kind"], tuple_knob["default"]) == ("string", "EnvTuple", [])
    assert {e["type"] for e in knobs.values() if e["kind"] == "EnvJSON"} == {"string"}
    # secret=True fields are secrets; aliases (the old name still accepted) are kept.
    assert knobs["EXA_API_KEY"]["type"] == "secret" and knobs["EXA_API_KEY"]["secret"] is True
    assert knobs["SGLANG_EPLB_P2P_BATCH_CHUNK_SIZE"]["alias"] == "SGLANG_EPLB_ROCM_P2P_BATCH_CHUNK_SIZE"
    # A callable default is recorded as its source text, not evaluated.
    assert knobs["SGLANG_QWEN4_PLE_FILE_DIR"]["default_computed"] == 'lambda: _default_cache_subdir("ple")'
    # The comment above a field is its doc; section headers are not.
    assert knobs["SGLANG_SORT_WEIGHT_FILES"]["doc"].startswith("Controls weight-file ordering")
    assert "=====" not in json.dumps(fresh_023) and "Runtime configuration" not in knobs["SGLANG_ROLE_NAMESPACES"]["doc"]
    assert STORY not in knobs


def test_shipped_registry_is_exactly_a_fresh_import(fresh_023):
    assert SHIPPED.read_text() == registry.dump(fresh_023)


# --- import: one commit, idempotent --------------------------------------------------------------


def test_import_is_one_commit_then_idempotent(bare):
    start = git(bare.root, "rev-parse", "HEAD")
    first = kk(bare, "catalog", "import", "sglang", "--version", "0.5.6")
    assert first.exit_code == 0, first.output
    second = kk(bare, "catalog", "import", "sglang", "--version", "0.5.23")
    assert second.exit_code == 0, second.output
    assert git(bare.root, "rev-list", "--count", f"{start}..HEAD") == "2"
    assert git(bare.root, "show", "--name-only", "--format=", "HEAD") == "inventory/engines/sglang-0.5.23.json"
    message = git(bare.root, "log", "-1", "--format=%B")
    assert message.startswith("catalog import: sglang 0.5.23 (770 variables)")
    assert "Against sglang 0.5.6:" in message and "no longer declared" in message
    assert "No longer declared: SGLANG_CUTLASS_MOE" in message
    assert 'Defaults changed: MOONCAKE_PROTOCOL "tcp" -> "rdma"' in message
    assert "Engine-Version: 0.5.23" in git(bare.root, "log", "-1", "--format=%(trailers)")
    assert (bare.inventory_dir / "engines" / "sglang-0.5.23.json").read_text() == SHIPPED.read_text()
    again = kk(bare, "catalog", "import", "sglang", "--version", "0.5.23")
    assert again.exit_code == 0 and "already up to date" in again.output
    assert git(bare.root, "rev-list", "--count", f"{start}..HEAD") == "2"
    assert git(bare.root, "status", "--porcelain") == ""


def test_import_from_a_wheel_file_offline(bare, tmp_path):
    wheel = cached_wheel(("sglang",), "0.5.23")
    result = kk(bare, "catalog", "import", "sglang", "--wheel", str(wheel))
    assert result.exit_code == 0, result.output
    assert (bare.inventory_dir / "engines" / "sglang-0.5.23.json").read_text() == SHIPPED.read_text()


def test_catalog_diff_lists_removed_added_and_defaults(project):
    result = kk(project, "catalog", "diff", "sglang", "0.5.6", "0.5.23")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("sglang 0.5.6 -> sglang 0.5.23: 658 added, 15 removed")
    assert "removed SGLANG_GRAMMAR_TIMEOUT" in lines
    assert "added SGLANG_USE_MODELSCOPE" not in lines and "removed SGLANG_USE_MODELSCOPE" not in lines  # in both
    assert "added IS_H200" in lines
    assert 'default MOONCAKE_PROTOCOL: "tcp" -> "rdma"' in lines
    # Only 0.5.23 is shipped: 0.5.6 was generated into the cache, not the repo.
    assert not (project.inventory_dir / "engines" / "sglang-0.5.6.json").exists()
    assert git(project.root, "status", "--porcelain") == ""


def test_diff_names_a_rename_through_the_alias():
    old = registry.Registry("sglang", "1", {"SGLANG_OLD": {"type": "int", "default": 1}})
    new = registry.Registry("sglang", "2", {"SGLANG_NEW": {"type": "int", "default": 1, "alias": "SGLANG_OLD"}})
    d = registry.diff_registries(old, new)
    assert (d.renamed, d.removed, d.added) == ([("SGLANG_OLD", "SGLANG_NEW")], [], [])


# --- set against the pinned version --------------------------------------------------------------


def test_set_refuses_the_story_knob_against_023_without_allow_undeclared(project):
    before = snapshot(project)
    line = refused(kk(project, "set", f"{STORY}=512", "--role", "decode", "--reason", "A/B"),
                            STORY, "sglang 0.5.23", "inventory/example_k8s.py", "does not declare it",
                            "close names it declares:", "--allow-undeclared")
    assert line.startswith("error: ")
    assert snapshot(project) == before
    ok = kk(project, "set", f"{STORY}=512", "--role", "decode", "--reason", "A/B", "--allow-undeclared")
    assert ok.exit_code == 0, ok.output
    assert f"warning: {STORY}: not declared by sglang 0.5.23" in ok.output


def test_allow_undeclared_needs_a_catalog_source_naming_the_origin(project):
    catalog = project.catalog_path
    catalog.write_text(catalog.read_text().replace('source = "sglang fork (SM120 MMA split decode; not declared by sglang 0.5.23)"',
                                                   'source = "sglang"'))
    git(project.root, "commit", "-q", "-am", "claim it is in the release")
    before = snapshot(project)
    refused(kk(project, "set", f"{STORY}=512", "--role", "decode", "--reason", "x", "--allow-undeclared"),
                     "does not declare it", "say so in the catalog entry's source")
    assert snapshot(project) == before


def test_a_knob_only_the_registry_knows_is_settable(project):
    result = kk(project, "set", "SGLANG_SORT_WEIGHT_FILES=2", "--role", "prefill", "--reason", "stagger weight reads")
    assert result.exit_code == 0, result.output
    assert "SGLANG_SORT_WEIGHT_FILES = 2" in project.knobs_path.read_text()
    knob = load_catalog(project.catalog_path).get("SGLANG_SORT_WEIGHT_FILES")
    assert (knob.type, knob.risk, knob.roles, knob.default) == ("int", "unreviewed", ("prefill", "decode"), 0)
    shown = kk(project, "catalog", "SGLANG_SORT_WEIGHT_FILES")
    assert "unreviewed" in shown.output and "weight-file ordering" in shown.output
    # ...with the registry's type, and only on the roles that run the engine.
    refused(kk(project, "set", "SGLANG_SORT_WEIGHT_FILES=many", "--role", "prefill", "--reason", "x"),
                     "expected an integer")
    refused(kk(project, "set", "SGLANG_SORT_WEIGHT_FILES=1", "--role", "router", "--reason", "x"),
                     "applies to prefill, decode")
    # The plain listing stays the hand-written catalog.
    listing = kk(project, "catalog")
    assert listing.exit_code == 0 and STORY in listing.output and "SGLANG_SORT_WEIGHT_FILES" not in listing.output


def test_library_set_leaves_the_decision_to_the_catalog_source(project):
    change = ops.set_knob(project, STORY, "512", "decode", "A/B")
    assert any("not declared by sglang 0.5.23" in w for w in change.warnings)
    with pytest.raises(UserError, match="pass --allow-undeclared"):
        ops.set_knob(project, STORY, "256", "decode", "A/B", allow_undeclared=False)


# --- check: declared knobs the pinned version would ignore ---------------------------------------


def test_ignored_knobs_lists_what_the_pinned_version_would_ignore(project):
    assert pinned.ignored_knobs(project) == []
    ops.set_knob(project, STORY, "512", "decode", "A/B", allow_undeclared=True)
    assert pinned.ignored_knobs(project) == []  # its catalog source says where it comes from
    lines = pinned.ignored_knobs(project, include_other_origin=True)
    # One line per inventory that pins sglang 0.5.23 for decode (the Kubernetes and Slurm ones pin it too).
    assert [line.split("(pinned in ", 1)[1].split(")", 1)[0] for line in lines] == [
        "inventory/example_k8s.py", "inventory/example_prod.py", "inventory/example_slurm.py", "inventory/local_k8s.py"]
    assert lines[1:2] == [f"inventory/knobs.toml: [decode] {STORY}: sglang 0.5.23 (pinned in inventory/example_prod.py) "
                     f"does not declare it; the engine would ignore it (close names it declares: "
                     f"{', '.join(registry.load_registry(project.inventory_dir, 'sglang', '0.5.23').close(STORY))})"]
    # A knob the catalog claims is sglang's, declared by hand, that 0.5.23 does not read.
    with project.catalog_path.open("a") as fh:
        fh.write('\n[knobs.SGLANG_GRAMMAR_TIMEOUT]\ntype = "float"\nroles = ["decode"]\nrisk = "behaviour"\n'
                 'source = "sglang"\nunset = "300 s"\ndoc = "Grammar compile timeout (removed after 0.5.6)."\n')
    project.knobs_path.write_text(project.knobs_path.read_text().replace("[decode]\n", "[decode]\nSGLANG_GRAMMAR_TIMEOUT = 30.0\n", 1))
    (line, *_others) = pinned.ignored_knobs(project)  # example_k8s.py, then example_prod.py, ...
    assert line.startswith("inventory/knobs.toml: [decode] SGLANG_GRAMMAR_TIMEOUT: sglang 0.5.23") and "would ignore it" in line


# --- bad input: one line, exit 2, nothing written -------------------------------------------------


def test_unknown_engine_and_unknown_version(bare, tmp_path):
    before = snapshot(bare)
    refused(kk(bare, "catalog", "import", "tensorrt-llm", "--version", "0.9.0"), "engine 'tensorrt-llm'",
                     "known: sglang, vllm")
    empty = tmp_path / "wheelhouse"
    empty.mkdir()
    refused(kk(bare, "catalog", "import", "sglang", "--version", "0.0.1", "--wheelhouse", str(empty)),
                     "sglang==0.0.1", "not found in wheelhouse")
    refused(kk(bare, "catalog", "import", "sglang", "--version", "0.5.23; rm -rf /"), "expected a release")
    refused(kk(bare, "catalog", "import", "sglang"), "exactly one of --version V, --wheel PATH, --from-installed")
    refused(kk(bare, "catalog", "import", "sglang", "--from-installed"), "not installed")
    refused(kk(bare, "catalog", "diff", "sglang", "0.5.23", "0.0.1", "--wheelhouse", str(empty)), "sglang==0.0.1")
    assert snapshot(bare) == before


def test_no_network_and_no_wheelhouse(bare, tmp_path, monkeypatch):
    monkeypatch.setenv("KNOBKEEPER_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # what pip sees without a network: no index at all
    before = snapshot(bare)
    refused(kk(bare, "catalog", "import", "sglang", "--version", "0.5.23"),
                     "sglang==0.5.23: not found in the package index", "--wheel PATH or --wheelhouse DIR")
    assert snapshot(bare) == before


def test_a_wheel_that_is_not_sglang(bare, tmp_path):
    before = snapshot(bare)
    refused(kk(bare, "catalog", "import", "sglang", "--wheel", str(_wheel(tmp_path, "requests", "2.0.0", None))),
                     "a wheel of 'requests', not sglang")
    text = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    text.write_text("not a zip")
    refused(kk(bare, "catalog", "import", "sglang", "--wheel", str(text)), "not a wheel")
    no_registry = tmp_path / "other"
    no_registry.mkdir()
    refused(kk(bare, "catalog", "import", "sglang", "--wheel", str(_wheel(no_registry, "sglang", "9.9.9", None))),
                     "has no sglang/srt/environ.py")
    assert snapshot(bare) == before


def test_environ_is_read_not_run_and_a_bad_name_is_refused(bare, tmp_path):
    before = snapshot(bare)
    odd = tmp_path / "b"
    odd.mkdir()
    wheel = _wheel(odd, "sglang", "9.9.2", TINY_ENVIRON.format(extra="SGLANG_Ü = EnvInt(1)"))
    refused(kk(bare, "catalog", "import", "sglang", "--wheel", str(wheel)), "variable name 'SGLANG_Ü'",
                     "^[A-Za-z_][A-Za-z0-9_]*$")
    assert snapshot(bare) == before
    good = tmp_path / "c"
    good.mkdir()
    # An import the file needs (torch) does not matter: nothing of it runs.
    wheel = _wheel(good, "sglang", "9.9.3", "import torch\n" + TINY_ENVIRON.format(
        extra="SGLANG_TINY_NAME = EnvStr(lambda: 'x')  # computed"))
    assert kk(bare, "catalog", "import", "sglang", "--wheel", str(wheel)).exit_code == 0
    tiny = json.loads((bare.inventory_dir / "engines" / "sglang-9.9.3.json").read_text())["knobs"]
    assert tiny["SGLANG_TINY_QUEUES"] == {"type": "int", "kind": "EnvInt", "default": 4, "doc": "Queues between prefill and decode."}
    assert tiny["SGLANG_TINY_NAME"]["default_computed"] == "lambda: 'x'" and tiny["SGLANG_TINY_NAME"]["doc"] == "computed"


HOSTILE_ENVIRON = '''
import os
open(os.environ.get("KK_PWNED", "/tmp/kk-pwned"), "w").write("ran")
os.fork()
while True:
    pass
'''


def test_a_hostile_environ_py_runs_nothing(bare, tmp_path, monkeypatch):
    """environ.py is read with ast: its module code (a file write, a fork, an endless loop) and its
    defaults (a huge power, a file read) never run; a doc with terminal escapes and bidi controls is
    stored as the engine wrote it and shown escaped."""
    marker = tmp_path / "pwned"
    monkeypatch.setenv("KK_PWNED", str(marker))
    doc = "\x1b]8;;http://evil\x07link\x1b]8;;\x07 \u202eevil\u202c"
    extra = (f"# {doc}\n    SGLANG_TINY_HUGE = EnvInt(9 ** 9 ** 9)\n"
             "    SGLANG_TINY_PATH = EnvStr(open('/etc/passwd').read())")
    wheel = _wheel(tmp_path, "sglang", "9.9.4", HOSTILE_ENVIRON + TINY_ENVIRON.format(extra=extra))
    result = kk(bare, "catalog", "import", "sglang", "--wheel", str(wheel))
    assert result.exit_code == 0, result.output
    assert not marker.exists()
    knobs = json.loads((bare.inventory_dir / "engines" / "sglang-9.9.4.json").read_text())["knobs"]
    assert knobs["SGLANG_TINY_HUGE"]["default_computed"] == "9 ** 9 ** 9"
    assert knobs["SGLANG_TINY_PATH"]["default_computed"] == "open('/etc/passwd').read()"
    assert knobs["SGLANG_TINY_HUGE"]["doc"] == doc
    shown = kk(bare, "catalog", "SGLANG_TINY_HUGE").output
    assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown
    assert "\\x1b]8;;http://evil\\x07link" in shown and "\\u202eevil" in shown


def test_corrupt_registry_file(project):
    path = project.inventory_dir / "engines" / "sglang-0.5.23.json"
    for broken, needle in (("{not json", "not JSON"), (json.dumps({"schema": "x"}), "expected \"schema\""),
                           (SHIPPED.read_text().replace('"type": "int"', '"type": "integer"', 1), ".type: expected one of")):
        path.write_text(broken)
        git(project.root, "commit", "-q", "-am", "break the registry")
        before = snapshot(project)
        refused(kk(project, "set", "SGLANG_DISAGGREGATION_QUEUE_SIZE=8", "--role", "prefill", "--reason", "x"),
                         "inventory/engines/sglang-0.5.23.json: corrupt engine registry", needle,
                         "knobkeeper catalog import sglang --version 0.5.23")
        assert snapshot(project) == before


def test_catalog_type_that_disagrees_with_the_engine(project, bare):
    for repo in (project, bare):
        catalog = repo.catalog_path
        text = catalog.read_text()
        head = "[knobs.SGLANG_DISAGGREGATION_QUEUE_SIZE]\ntype = \"int\""
        assert head in text
        catalog.write_text(text.replace(head, "[knobs.SGLANG_DISAGGREGATION_QUEUE_SIZE]\ntype = \"float\""))
        git(repo.root, "commit", "-q", "-am", "a float queue count")
    before = snapshot(bare)
    refused(kk(bare, "catalog", "import", "sglang", "--version", "0.5.23"),
                     "knobs.SGLANG_DISAGGREGATION_QUEUE_SIZE.type = 'float'", "sglang 0.5.23 reads it as int")
    assert snapshot(bare) == before and not (bare.inventory_dir / "engines").exists()
    before = snapshot(project)
    refused(kk(project, "set", "SGLANG_DISAGGREGATION_QUEUE_SIZE=8", "--role", "prefill", "--reason", "x"),
                     "inventory/catalog.toml: knobs.SGLANG_DISAGGREGATION_QUEUE_SIZE.type = 'float'")
    assert snapshot(project) == before


def test_a_role_pinned_to_a_version_without_registry(project):
    inventory = project.inventory_dir / "example_prod.py"
    inventory.write_text(inventory.read_text().replace('"sglang==0.5.23"', '"sglang==0.5.6"'))
    git(project.root, "commit", "-q", "-am", "back to 0.5.6")
    before = snapshot(project)
    refused(kk(project, "set", "SGLANG_DISAGGREGATION_QUEUE_SIZE=8", "--role", "prefill", "--reason", "x"),
                     "runs sglang 0.5.6", "knobkeeper catalog import sglang --version 0.5.6")
    assert snapshot(project) == before


def test_pins_come_from_host_and_group_data(project):
    def of(role, stack=""):
        return sorted((p.inventory, p.engine, p.version) for p in engine_pins.pins_for(project.inventory_dir, stack, role))

    assert of("decode") == [("inventory/example_k8s.py", "sglang", "0.5.23"), ("inventory/example_prod.py", "sglang", "0.5.23"),
                            ("inventory/example_slurm.py", "sglang", "0.5.23"), ("inventory/local.py", "sim", None),
                            ("inventory/local_k8s.py", "sglang", "0.5.23"), ("inventory/local_slurm.py", "sim", None)]
    assert of("decode", "vllm") == [("inventory/example_prod_vllm.py", "vllm", "0.32.0"),
                                    ("inventory/local_vllm.py", "vllm", "0.32.0")]
    assert of("router", "vllm") == [("inventory/example_prod_vllm.py", "vllm-router", "0.1.17"),
                                    ("inventory/local_vllm.py", "vllm-router", "0.1.17")]
    (pin,) = [p for p in engine_pins.pins_for(project.inventory_dir, "", "decode")
              if p.inventory == "inventory/example_prod.py"]
    assert pin.hosts == ("decode-1", "decode-2")
    group = project.inventory_dir / "group_data" / "decode.py"
    group.write_text(group.read_text() + '\nengines = {"decode": "sglang==0.5.6"}\n')
    # Host data wins over group data (every inventory here sets engines in host data).
    assert of("decode") == [("inventory/example_k8s.py", "sglang", "0.5.23"), ("inventory/example_prod.py", "sglang", "0.5.23"),
                            ("inventory/example_slurm.py", "sglang", "0.5.23"), ("inventory/local.py", "sim", None),
                            ("inventory/local_k8s.py", "sglang", "0.5.23"), ("inventory/local_slurm.py", "sim", None)]


def test_launch_script_unsets_only_hand_written_catalog_knobs(project):
    """With 770 registry knobs, the rendered script still names only the catalog's own knobs in its
    `unset` line; a registry-only knob appears only where it is declared (exported)."""
    from knobkeeper.deploy.render import render_stack
    from knobkeeper.deploy.stack import load_stack

    ops.set_knob(project, "SGLANG_SORT_WEIGHT_FILES", "2", "prefill", "stagger weight reads")
    rendered = render_stack(project, load_stack(project.root, "inventory/example_prod.py"))
    catalog = load_catalog(project.catalog_path)
    prefill = rendered[("prefill-1", "knobkeeper-prefill")].launch
    decode = rendered[("decode-1", "knobkeeper-decode")].launch
    assert "export SGLANG_SORT_WEIGHT_FILES=2" in prefill and "SGLANG_SORT_WEIGHT_FILES" not in decode
    for script, role in ((prefill, "prefill"), (decode, "decode")):
        (unset,) = [line for line in script.splitlines() if line.startswith("unset ")]
        names = set(unset.split()[1:])
        assert names == {n for n, k in catalog.knobs.items() if role in k.roles} - {"SGLANG_SORT_WEIGHT_FILES"}
        assert len(names) < 20


def test_plan_warns_about_knobs_the_pinned_engine_would_ignore(project):
    from knobkeeper.deploy.plan import engine_warnings, plan_text

    assert engine_warnings(project, "inventory/example_prod.py") == []
    ops.set_knob(project, STORY, "512", "decode", "A/B", allow_undeclared=True)
    [line] = engine_warnings(project, "inventory/example_prod.py")
    assert f"[decode] {STORY}: sglang 0.5.23 (pinned in inventory/example_prod.py) does not declare it" in line
    assert engine_warnings(project, "inventory/local.py") == []  # the sim pins no sglang version
    plan = {"inventory": "inventory/example_prod.py", "options": {"restart": "changed", "only": None, "batch": None},
            "counts": {"restart": 0, "start": 0, "unchanged": 0, "unknown": 0}, "roles": [], "unreachable": {},
            "engine_warnings": [line]}
    assert f"warning: {line}" in plan_text(plan).splitlines()


# --- `catalog import` never builds an sdist (issue 25, finding 10) ---------------------------------
# The registry readers read environ.py / envs.py with `ast`, so a looping environ.py runs nothing
# (test_a_hostile_environ_py_runs_nothing above). One path still ran the engine's code: `--version V`
# (with --wheelhouse DIR, or from the index) let `pip download` take an sdist, and pip builds an
# sdist's metadata by running its build backend: a backend that writes a file and loops printing hung
# the import for ever with its output buffered without bound. Now only wheels are taken (nothing runs),
# pip's time is bounded and only the tail of its output is kept; the refusal is one line. The real CLI
# in its own process, the sdist in a real local wheelhouse, pip for real.

BACKEND = '''
import os, sys
open(os.environ["KK_PWNED"], "w").write("ran")
while True:
    sys.stdout.write("x" * 65536)
'''


def _hostile_sdist(folder: Path, version: str) -> Path:
    """sglang-V.tar.gz whose in-tree build backend (no requirements: pip needs no index) writes a
    file, then prints without end."""
    files = {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
             "backend.py": BACKEND, "PKG-INFO": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"}
    path = folder / f"sglang-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"sglang-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _cli(project, env: dict, *args: str) -> tuple[int, str, str]:
    """The CLI in its own session; past 120 s the whole group is killed (so a hang fails, not stalls)."""
    proc = subprocess.Popen([sys.executable, "-m", "knobkeeper.cli", *args, "--repo", str(project.root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **env})
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"catalog import hung (killed after 120 s); stderr ends {err[-300:]!r}")
    return proc.returncode, out, err


def test_an_sdist_in_the_wheelhouse_is_never_built(bare, tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    _hostile_sdist(house, "9.9.5")
    marker = tmp_path / "pwned"
    env = {"KK_PWNED": str(marker), "KNOBKEEPER_CACHE": str(tmp_path / "cache")}
    before = snapshot(bare)
    code, out, err = _cli(bare, env, "catalog", "import", "sglang", "--version", "9.9.5", "--wheelhouse", str(house))
    assert not marker.exists()                      # the backend never ran
    assert code == 2, (code, out, err[-500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-500:]
    assert "sglang==9.9.5: not found in wheelhouse" in lines[0] and len(lines[0]) < 600, lines[0]
    assert snapshot(bare) == before
    # a wheel of the same release beside it is what is read (ast, offline)
    _wheel(house, "sglang", "9.9.5", TINY_ENVIRON.format(extra=""))
    code, out, err = _cli(bare, env, "catalog", "import", "sglang", "--version", "9.9.5", "--wheelhouse", str(house))
    assert code == 0, (code, out, err[-500:])
    knobs = json.loads((bare.inventory_dir / "engines" / "sglang-9.9.5.json").read_text())["knobs"]
    assert knobs["SGLANG_TINY_QUEUES"]["default"] == 4 and not marker.exists()


def test_pip_past_its_time_is_stopped_and_only_its_output_tail_is_kept():
    """The bound itself (PIP_DOWNLOAD_TIMEOUT_S is 900 s; here 2 s): a child that prints without end
    is killed with its group, and what is kept of its output is the last OUTPUT_TAIL_BYTES."""
    from knobkeeper.engine import source

    code, tail = source._bounded_run([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"], 2)
    assert code is None and 0 < len(tail) <= source.OUTPUT_TAIL_BYTES
    code, tail = source._bounded_run([sys.executable, "-c", "print('ERROR: no such release')"], 30)
    assert code == 0 and tail.strip() == "ERROR: no such release"
