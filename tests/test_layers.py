"""The layers of docs/design.md hold: import-linter's contracts (pyproject.toml, [tool.importlinter])
over the tree as it stands, and the same contracts failing, naming both modules and the line, on a
scratch copy of the package that adds one upward import."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    assert LINT.exists(), f"{LINT}: missing; import-linter comes with the test extra (pip install -e '.[test]')"
    env = dict(os.environ, PYTHONPATH=str(pythonpath), NO_COLOR="1")
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_its_layers():
    done = _lint(ROOT, ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def _lint_with_import(tmp_path, module: str, line: str):
    """lint-imports over a scratch copy of the tree whose `module` (a path under knobkeeper/) has
    `line` right after its `from __future__` line; (its result, that line's number)."""
    shutil.copytree(ROOT / "knobkeeper", tmp_path / "knobkeeper", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "knobkeeper" / module
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, text in enumerate(lines) if text.startswith("from __future__"))
    lines.insert(at + 1, line + "\n")
    path.write_text("".join(lines))
    return _lint(tmp_path, tmp_path), at + 2


def test_an_upward_import_fails_naming_both_modules(tmp_path):
    """An engine family that imports the changelog (a layer above it): the contract is broken and the
    output names the importer, the imported module and the line."""
    done, line = _lint_with_import(tmp_path, "engine/family.py", "import knobkeeper.changelog.ops  # upward")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "Contracts: 3 kept, 1 broken." in done.stdout
    assert "knobkeeper.engine is not allowed to import knobkeeper.changelog.ops" in done.stdout
    assert f"knobkeeper.engine.family -> knobkeeper.changelog.ops (l.{line})" in done.stdout


def test_a_deploy_module_that_names_a_target_fails(tmp_path):
    """status.py asking for the Slurm package by name (an `if is_slurm` coming back) breaks the
    target contract: targets are reached through deploy.target only."""
    done, line = _lint_with_import(tmp_path, "deploy/status.py", "import knobkeeper.deploy.slurm.job  # by name")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "Deploy targets are reached through deploy.target, never by name BROKEN" in done.stdout
    assert "knobkeeper.deploy.status is not allowed to import knobkeeper.deploy.slurm" in done.stdout
    assert f"knobkeeper.deploy.status -> knobkeeper.deploy.slurm.job (l.{line})" in done.stdout


def test_every_deploy_module_is_under_the_target_contract():
    """The target contract lists its source modules one by one (import-linter has no "all but"): a
    module added to deploy/ and left off the list could import a target by name unnoticed."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in config if c["name"].startswith("Deploy targets are reached through deploy.target")]
    targets = set(contract["forbidden_modules"])
    modules = {f"knobkeeper.deploy.{p.stem}" for p in (ROOT / "knobkeeper" / "deploy").glob("*.py") if p.stem != "__init__"}
    unlisted = sorted(m for m in modules - set(contract["source_modules"]) if m not in targets)
    assert unlisted == [], f"add {unlisted} to the target contract's source_modules in pyproject.toml"


def test_the_package_imports_nothing_of_the_tests():
    """The test tooling (tests/browser.py, tests/fieldstory.py, tests/infra.py) is not shipped: no
    module of knobkeeper/ imports the tests package, at module level or in a function."""
    found = []
    for path in sorted((ROOT / "knobkeeper").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                      if name == "tests" or name.startswith("tests.")]
    assert found == [], found


# A function-level import can hide an import circle (Python never trips on it at import time, so
# nobody sees that two modules need each other), so each one states why it is not at the top: a comment on it or on the line above its group of imports, "imported here" in its
# function's docstring, or, for a module where every command imports on first use, a paragraph of the
# module's docstring that starts with LAZY_PARAGRAPH (with the start-up it saves, measured).
LAZY_PARAGRAPH = "Imports inside functions:"


def unexplained_function_imports(path: Path) -> list[int]:
    """Line numbers of the function-level imports of `path` that give no reason."""
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    if LAZY_PARAGRAPH in (ast.get_docstring(tree) or ""):
        return []
    lines = text.splitlines()

    def explained(node: ast.stmt, func: ast.AST) -> bool:
        at = node.lineno - 1
        while at >= 0 and lines[at].strip().startswith(("import ", "from ")):
            if "#" in lines[at]:
                return True
            at -= 1
        return (at >= 0 and lines[at].strip().startswith("#")) or "imported here" in (ast.get_docstring(func) or "").lower()

    found: list[int] = []

    def walk(node: ast.AST, func: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if func is not None and isinstance(child, (ast.Import, ast.ImportFrom)) and not explained(child, func):
                found.append(child.lineno)
            walk(child, inner)

    walk(tree, None)
    return found


def test_every_function_level_import_says_why():
    bare = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "knobkeeper").rglob("*.py"))
            if (lines := unexplained_function_imports(p))}
    assert not bare, f"function-level imports without a reason (hoist them, or say why): {bare}"


def test_a_bare_function_level_import_is_found(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text('"""A module."""\n\nimport os\n\n\ndef f():\n    """Doc."""\n    import json\n\n'
                    '    # a reason\n    import sys\n    import re\n    return json, sys, re, os\n')
    assert unexplained_function_imports(path) == [8]
    path.write_text(path.read_text().replace('"""A module."""', f'"""A module.\n\n{LAZY_PARAGRAPH} why."""'))
    assert unexplained_function_imports(path) == []
