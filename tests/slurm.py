"""A real Slurm cluster for tests: munged, slurmctld and three slurmd on this machine (Debian's
slurm-wlm 22.05, installed by `make test`'s system step), per-run key, state and spool folders, free
ports, loopback only (knobkeeper/deploy/slurm/localcluster.py does the work; `make demo TARGET=slurm`
uses the same code).

    cluster = slurm_cluster_fixture("module")   # in a test module: a fixture yielding a LocalCluster

Teardown cancels every job and waits for its steps (job processes are not children of slurmd), then
stops every slurmd, slurmctld and munged by the PIDs their pid files name, and fails the test when any
of them, or any slurmstepd of the cluster, is still alive. A missing Slurm FAILS the fixture (CI
installs it; a missing daemon is a broken CI, never a reason to skip).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from knobkeeper.deploy.slurm.localcluster import LocalCluster, cluster_pids, start_cluster, stop_cluster
from knobkeeper.errors import UserError


def slurm_cluster_fixture(scope: str = "module") -> Callable[..., Iterator[LocalCluster]]:
    @pytest.fixture(scope=scope)
    def _cluster() -> Iterator[LocalCluster]:
        # A short root of its own: slurmd's spool sockets and munge's socket path must stay short.
        root = Path(tempfile.mkdtemp(prefix="kk-slurm-"))
        root.chmod(0o755)  # munged runs as the munge user
        try:
            cluster = start_cluster(root / "c", locked_partition=True)
        except UserError as exc:
            pytest.fail(f"local Slurm cluster unavailable (not skipped: CI must provide it): {exc}", pytrace=False)
        try:
            yield cluster
        finally:
            stopped = stop_cluster(cluster.root)
            left = cluster_pids(cluster.root)
            assert stopped and not left, f"Slurm processes left behind: {left}"

    return _cluster
