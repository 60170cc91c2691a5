"""The engine registry's costs, whole-process medians side by side.

- `catalog import sglang --version 0.5.23` (wheel already in the cache): read environ.py, write the
  770-variable registry, one commit.
- the parser check of inventory/example_prod.py (every sglang command through prepare_server_args
  of sglang 0.5.23) with the side environment built: with the verdict cache warm, and with it
  emptied (the parser really runs: torch + sglang import). Target < 3 s warm.
- `set` of a catalog knob with the 770-knob registry judging it vs without any registry (no role
  runs sglang): must stay within 10%.
- `knobs` with a registry-only knob declared (the registry and the pins are loaded) vs without.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, time_call, time_command

from tests.infra import git, make_infra_repo

KK = [str(Path(sys.executable).parent / "knobkeeper")]
CHECK = ("import sys; from knobkeeper.deploy.stack import load_stack; from knobkeeper.engine.contract import contract_problems; "
         "p, s, w = contract_problems(load_stack(__import__('pathlib').Path(sys.argv[1]), 'inventory/example_prod.py'), "
         "'inventory/example_prod.py'); assert not p and not s, (p, s)")


def _set_pair(with_registry, without, repeats: int) -> tuple[float, float]:
    """Median `set` time in each repo, the runs interleaved so that machine load hits both alike."""
    samples: dict[str, list[float]] = {"with": [], "without": []}
    for i in range(repeats + 1):
        for name, project in (("with", with_registry), ("without", without)):
            start = time.perf_counter()
            subprocess.run([*KK, "set", f"SGLANG_DISAGGREGATION_QUEUE_SIZE={i + 2}", "--role", "prefill",
                            "--reason", "bench", "--repo", str(project.root)], capture_output=True, check=True)
            if i:  # the first round warms the OS cache
                samples[name].append(time.perf_counter() - start)
    return statistics.median(samples["with"]), statistics.median(samples["without"])


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kk-bench-registry-"))
    try:
        from knobkeeper.engine.sideenv import side_env_dir
        from knobkeeper.engine.source import cached_wheel

        cached_wheel(("sglang",), "0.5.23")
        bare = make_infra_repo(tmp, name="bare")
        shutil.rmtree(bare.inventory_dir / "engines")
        git(bare.root, "commit", "-qam", "no registry")
        start_sha = git(bare.root, "rev-parse", "HEAD")

        def import_once() -> None:
            git(bare.root, "reset", "-q", "--hard", start_sha)
            subprocess.run([*KK, "catalog", "import", "sglang", "--version", "0.5.23", "--repo", str(bare.root)],
                           capture_output=True, check=True)

        imported = time_call(import_once, 5)[0]
        print(f"catalog import sglang 0.5.23 (770 variables, one commit): median {imported:.3f} s")

        with_registry = make_infra_repo(tmp, name="with")
        check = [sys.executable, "-c", CHECK, str(with_registry.root)]
        subprocess.run(check, check=True, capture_output=True, cwd=ROOT)  # builds the side env once
        warm, _ = time_command(check, repeats=5, cwd=ROOT)
        verdicts = side_env_dir("sglang", "0.5.23") / "verdicts.json"

        def parser_runs() -> None:
            verdicts.unlink(missing_ok=True)
            subprocess.run(check, check=True, capture_output=True, cwd=ROOT)

        uncached = time_call(parser_runs, 3)[0]
        print(f"parser check of example_prod (5 services, 4 sglang): warm {warm:.3f} s; "
              f"verdict cache emptied (parser runs) {uncached:.3f} s  (target < 3 s warm)")

        without = make_infra_repo(tmp, name="without")
        shutil.rmtree(without.inventory_dir / "engines")
        (without.inventory_dir / "example_prod.py").unlink()
        git(without.root, "commit", "-qam", "no registry, no sglang role")
        with_s, without_s = _set_pair(with_registry, without, 11)
        print(f"set (catalog knob): with the 770-knob registry {with_s:.3f} s, without {without_s:.3f} s, "
              f"ratio {with_s / without_s:.3f}  (must stay within 1.10)")

        plain, _ = time_command([*KK, "knobs", "--repo", str(with_registry.root)], repeats=7)
        subprocess.run([*KK, "set", "SGLANG_SORT_WEIGHT_FILES=2", "--role", "prefill", "--reason", "bench",
                        "--repo", str(with_registry.root)], capture_output=True, check=True)
        lazy, _ = time_command([*KK, "knobs", "--repo", str(with_registry.root)], repeats=7)
        print(f"knobs: catalog knobs only {plain:.3f} s; with a registry-only knob declared "
              f"(registry + pins loaded) {lazy:.3f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
