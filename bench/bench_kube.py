"""The Kubernetes target's costs (knobkeeper/deploy/kube/), each a median of 5, printed:

    render + validate   whole process: `knobkeeper render inventory/example_k8s.py` (the three roles'
                        manifests); then the render alone and the render plus strict validation of every
                        object (what `check` adds for the stack), the same script side by side
    one-knob apply      against the local API server (kube-apiserver + kube-controller-manager 1.20.2):
                        from `knobkeeper deploy` of a decode knob change to the deploy's exit, and the part
                        of it from the apply of decode to the new ReplicaSet named in the record
    build               the control plane's build: cached (ensure_built finding it) timed here; cold as the
                        build's own stamp recorded it (built.json: seconds, when)

    .venv/bin/python bench/bench_kube.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, time_call, time_command

from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.kube import build
from knobkeeper.deploy.kube.localcluster import start_cluster, stop_cluster
from knobkeeper.timeutil import parse_time
from tests.infra import make_infra_repo

INV = "inventory/example_k8s.py"
RENDER = ("from pathlib import Path; from knobkeeper.project import Project; "
          "from knobkeeper.deploy import repo_files; from knobkeeper.deploy.stack import load_stack; "
          "from knobkeeper.deploy.target import target_of; p = Project(Path('.')); "
          f"files = repo_files.repo_files(p, '{INV}'); assert len(files) == 3")
VALIDATE = RENDER + f"; assert target_of(load_stack(p.root, '{INV}')).lint(files) == []"


def main() -> None:
    cli_s, _ = time_command([sys.executable, "-m", "knobkeeper.cli", "render", INV], repeats=5, cwd=ROOT)
    render_s, _ = time_command([sys.executable, "-c", RENDER], repeats=5, cwd=ROOT)
    validate_s, _ = time_command([sys.executable, "-c", VALIDATE], repeats=5, cwd=ROOT)
    print(f"`knobkeeper render {INV}` (3 roles, 6 objects), whole process: median {cli_s:.2f} s")
    print(f"render alone / render + strict validation of every object, whole process, side by side: medians "
          f"{render_s:.2f} / {validate_s:.2f} s (validation {validate_s - render_s:+.2f} s)")

    cached_s, _ = time_call(lambda: build.ensure_built(wait=True), repeats=5)
    stamp = json.loads((build.ensure_built(wait=True).parent / "built.json").read_text())
    print(f"control plane build: cached {cached_s * 1000:.1f} ms (median of 5); cold {stamp.get('seconds')} s "
          f"(recorded by the build at {stamp.get('when')})")

    tmp = Path(tempfile.mkdtemp(prefix="kkb", dir="/tmp"))
    cluster = start_cluster(tmp / "c")
    os.environ["KNOBKEEPER_KUBECONFIG"] = cluster.kubeconfig
    try:
        project = make_infra_repo(tmp)
        inv = "inventory/local_k8s.py"
        assert run_deploy(project, inv).ok
        whole, to_rs = [], []
        for n in range(5):
            value = 64 * (n + 2)
            started = time.perf_counter()
            result = run_deploy(project, inv, knob_overrides={"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": value}},
                                record=False)
            whole.append(time.perf_counter() - started)
            assert result.ok, result.error
            applied = result.record.kubernetes.apply_of("knobkeeper-decode")
            assert applied.decision == "rolls" and applied.replica_set
            to_rs.append((parse_time(applied.observed_at) - parse_time(applied.applied_at)).total_seconds())
        print(f"one-knob deploy to the local API server (decode rolls, prefill and router checked): median "
              f"{statistics.median(whole):.2f} s of the whole deploy; apply of decode -> new ReplicaSet observed: "
              f"median {statistics.median(to_rs):.2f} s")
    finally:
        stop_cluster(cluster.root)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
