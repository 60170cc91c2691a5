"""A real Kubernetes control plane for tests: etcd, kube-apiserver and kube-controller-manager on this
machine (knobkeeper/deploy/kube/localcluster.py does the work), under a short folder of its own, free
ports, loopback only.

    def test_x(kube_cluster): kube_cluster.kubectl("get", "ns", check=True)

The apiserver and controller-manager are built once per machine (knobkeeper/deploy/kube/build.py);
`make test` starts that build in the background at its start (scripts/test.sh), so the fixture waits
on the build's lock, then finds them built; alone (pytest by hand, cold cache) it builds them itself,
~6.5 min of one core. Teardown stops the three daemons by the PIDs their pid files name and fails when
any is still alive (the folder, logs included, then stays; after a clean stop it is removed). A failed
build or start FAILS the fixture (the tools are in the `test` extra and the build needs only apt and
them: a missing piece is a broken setup, never a reason to skip).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from knobkeeper.deploy.kube import build
from knobkeeper.deploy.kube.localcluster import LocalCluster, cluster_pids, start_cluster, stop_cluster
from knobkeeper.errors import UserError

# What a test module using the fixture marks itself with: the first test's setup may wait out the
# background build (cold: ~10 min of one niced core beside the rest of `make test`) or do it.
BUILD_WAIT_TIMEOUT_S = 1800


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[LocalCluster]:
    try:
        bin_dir = build.ensure_built(wait=True)
    except UserError as exc:
        pytest.fail(f"kube-apiserver build failed (not skipped): {exc}", pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="kk-kube-"))
    try:
        cluster = start_cluster(root / "c", bin_dir=bin_dir)
    except UserError as exc:
        pytest.fail(f"local Kubernetes control plane unavailable (not skipped): {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        stopped = stop_cluster(cluster.root)
        left = cluster_pids(cluster.root)
        assert len(stopped) == 3 and not left, f"Kubernetes daemons left behind: {left} (stopped {stopped})"
        shutil.rmtree(root, ignore_errors=True)   # etcd's wal/ folder alone is ~62 MB
