"""Every Python file of the project compiles, and every knobkeeper module imports: a module no test
reaches (the demo, a benchmark) still fails here on a syntax error or a broken import."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import knobkeeper

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for pattern in ("knobkeeper/**/*.py", "bench/**/*.py", "kernels/**/*.py", "inventory/**/*.py",
                                   "tests/*.py", "scripts/*.py", "*.py")
                 for p in ROOT.glob(pattern) if ".venv" not in p.parts)


def test_every_source_file_compiles():
    assert len(SOURCES) > 100
    broken = []
    for path in SOURCES:
        try:
            compile(path.read_text(), str(path), "exec")
        except SyntaxError as exc:
            broken.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert not broken, broken


MODULES = sorted(m.name for m in pkgutil.walk_packages(knobkeeper.__path__, "knobkeeper.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    importlib.import_module(name)
