"""Fixtures shared by the test files: temporary infra repos (see tests/infra.py)."""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from tests.infra import git, make_infra_repo


@pytest.fixture
def short_tmp():
    """An empty folder per test under a short path (/tmp/kkXXXXXXXX, not pytest's deep tmp_path):
    inventory/local.py puts supervisord's unix socket under the repo made in it, whose path must stay
    under 100 characters. Under /tmp itself, whatever TMPDIR says; removed after the test, whatever a
    killed process left in it."""
    path = Path(tempfile.mkdtemp(prefix="kk", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def project(short_tmp):
    """A fresh infra repo per test: committed, clean, on main, with its own git identity. Under a
    short path: short_tmp/infra (inventory/local.py puts supervisord's unix socket under the repo,
    < 100 chars); a test that also asks for short_tmp gets the folder the repo is in."""
    return make_infra_repo(short_tmp)


@pytest.fixture
def infra_repo(tmp_path):
    """For a test that needs more than `project`: a maker of infra repos under the test's tmp_path,
    `infra_repo(name="infra", identity="Test Operator")` -> the repo at tmp_path/name (two repos:
    two names)."""
    def make(name: str = "infra", identity: str = "Test Operator"):
        return make_infra_repo(tmp_path, name=name, identity=identity)

    return make


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One repo per module for the cases that must write nothing (each checks that they did not)."""
    return make_infra_repo(tmp_path_factory.mktemp("shared"))


@pytest.fixture
def bare(tmp_path):
    """An infra repo without any imported registry (inventory/engines/ removed and committed)."""
    project = make_infra_repo(tmp_path, name="bare")
    shutil.rmtree(project.inventory_dir / "engines")
    git(project.root, "commit", "-q", "-am", "no registries")
    return project


# --- the real vLLM stack (tests/real_vllm.py) ----------------------------------------------------------


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    # `make test` (scripts/test.sh) stops its background half with SIGTERM on a Ctrl-C: taken as an
    # interrupt, so the session's fixtures (the real stack's above all) stop their processes by PID.
    signal.signal(signal.SIGTERM, _interrupted)
    config.addinivalue_line("markers", "engine_env: needs the cached vLLM engine environment (runs after the "
                                       "tests that need none)")
    config.addinivalue_line("markers", "real_engine: runs against the session's real vLLM stack (run last)")


def pytest_collection_modifyitems(session, config, items):
    """Three groups, in this order: the tests that need no real engine; those that need the engine
    environment (marked engine_env) or start engines of their own; those that use the session's
    real stack. `make test` runs the first group in one process and the other two in another, at
    the same time (scripts/test.sh); in one process (pytest alone, `make test-real`) the order is
    why the engine environment is ready when its first test runs.

    Why the engine environment waits: it installs in the background from the start (tests/real_vllm.py
    `preinstall`, ~3 min cold), so the first test that needs it finds it ready, or waits on the
    install's lock, instead of paying for it in series.
    Why the stack comes last: it (~6 GB, two engines) is then started once, late, and stopped as the
    session ends instead of idling meanwhile. Those that start engines of their own run before it:
    an idle real stack was not idle on this machine before nixl's progress thread slept (each vLLM
    instance's NIXL progress thread polled without sleeping, one core each): the start-up-crash test
    took 235 s in CI beside it; run before it, that test, the port-taken test and the preflight
    faults passed within about a minute (seen once).
    The Kubernetes tests close the first group for the same reason: their control plane builds in the
    background (cold, once per machine) while every other test of the group runs."""
    def order(item) -> tuple[bool, bool, bool]:
        engine = item.get_closest_marker("engine_env") is not None or item.get_closest_marker("real_engine") is not None
        # Last of the first group: the tests on the local Kubernetes control plane, whose build (cold:
        # ~6 min of one niced core, tests/kube.py) runs in the background from the start of `make test`.
        kube = not engine and "kube_cluster" in getattr(item, "fixturenames", ())
        return engine, kube, engine and "real_stack" in getattr(item, "fixturenames", ())

    items.sort(key=order)  # stable: the order is kept otherwise


@pytest.fixture(scope="session")
def real_stack():
    """The real vLLM PD stack deployed once for the session (tests/real_vllm.RealStack: its API)."""
    from tests.real_vllm import started_real_stack

    with started_real_stack() as stack:
        yield stack
