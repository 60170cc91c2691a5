"""Fixtures shared by the test files: temporary infra repos (see tests/infra.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.infra import git, make_infra_repo


@pytest.fixture
def project():
    """A fresh infra repo per test: committed, clean, on main, with its own git identity. Under a
    short path: inventory/local.py puts supervisord's unix socket under the repo (< 100 chars)."""
    with tempfile.TemporaryDirectory(prefix="kk") as tmp:
        yield make_infra_repo(Path(tmp))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One repo per module for the cases that must write nothing (each checks that they did not)."""
    return make_infra_repo(tmp_path_factory.mktemp("shared"))


@pytest.fixture
def bare(tmp_path):
    """An infra repo without any imported registry (inventory/engines/ removed and committed)."""
    import shutil

    project = make_infra_repo(tmp_path, name="bare")
    shutil.rmtree(project.inventory_dir / "engines")
    git(project.root, "commit", "-q", "-am", "no registries")
    return project
