"""Deploy timings of the local stack (supervisord, two sim workers, the real sglang-router):

  no-op deploy          median wall time of `pyinfra -y inventory/local.py deploy.py` changing nothing
  one-knob deploy       median wall time after `knobkeeper set` of a decode knob (decode restarts)
  co-restart            time from the first restart issued to the router healthy, against the sum of
                        the three services' own start-up times (restart issued -> healthy); the
                        difference is the ordering + gate overhead
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the repo on sys.path)

from knobkeeper.changelog.ops import set_knob
from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.local import stop_local
from knobkeeper.timeutil import parse_time
from tests.infra import make_infra_repo
from tests.procs import free_port

REPEATS = int(os.environ.get("KK_BENCH_REPEATS", "5"))


def _deploy(project, **kwargs):
    result = run_deploy(project, "inventory/local.py", timeout=300, **kwargs)
    if not result.ok:
        raise SystemExit(f"deploy failed: {result.error}\n{result.output[-3000:]}")
    return result


def _secs(a: str, b: str) -> float:
    return (parse_time(b) - parse_time(a)).total_seconds()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kkb-"))
    ports = {k: free_port() for k in ("prefill", "bootstrap", "decode", "router", "router_metrics")}
    os.environ["KNOBKEEPER_LOCAL_PORTS"] = ",".join(f"{k}={v}" for k, v in ports.items())
    project = make_infra_repo(tmp)
    prefix = project.state_dir / "local"
    try:
        first = _deploy(project)
        print(f"first deploy (starts all three): {first.seconds:.2f} s")
        noop = [_deploy(project).seconds for _ in range(REPEATS)]
        print(f"no-op deploy:    median {statistics.median(noop):.2f} s over {len(noop)} runs "
              f"(min {min(noop):.2f}, max {max(noop):.2f})")
        one = []
        for i in range(REPEATS):
            set_knob(project, "SGLANG_SM120_MMA_TARGET_CTAS", str(256 * (1 + i % 2)), "decode", f"bench {i}")
            result = _deploy(project)
            assert [r["action"] for r in result.record.services] == ["unchanged", "restarted", "unchanged"]
            one.append(result.seconds)
        print(f"one-knob deploy: median {statistics.median(one):.2f} s over {len(one)} runs "
              f"(min {min(one):.2f}, max {max(one):.2f}; decode restarted, router gated)")
        totals, sums, walls = [], [], []
        for _ in range(max(3, REPEATS // 2)):
            result = _deploy(project, restart="co")
            rows = result.record.services
            totals.append(_secs(rows[0]["restart_issued_at"], rows[-1]["healthy_at"]))
            sums.append(sum(_secs(r["restart_issued_at"], r["healthy_at"]) for r in rows))
            walls.append(result.seconds)
        total, own = statistics.median(totals), statistics.median(sums)
        print(f"co-restart:      first restart -> router ready median {total:.2f} s; sum of the three "
              f"services' own start-up times {own:.2f} s; gate/ordering overhead {total - own:.2f} s "
              f"(whole deploy {statistics.median(walls):.2f} s)")
    finally:
        stop_local(prefix)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
