"""Issue 25 finding 10, `catalog import`: the registry readers (issue 22) read environ.py / envs.py
with `ast`, so a looping environ.py runs nothing (tests/test_registry.py::
test_a_hostile_environ_py_runs_nothing). One path still ran the engine's code: `--version V`
(with --wheelhouse DIR, or from the index) let `pip download` take an sdist, and pip builds an
sdist's metadata by running its build backend: a backend that writes a file and loops printing
hung the import for ever with its output buffered without bound. Now only wheels are taken (nothing
runs), pip's time is bounded and only the tail of its output is kept; the refusal is one line.
The real CLI in its own process, the sdist in a real local wheelhouse, pip for real."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.infra import snapshot
from tests.test_registry import TINY_ENVIRON, _wheel

BACKEND = '''
import os, sys
open(os.environ["KK_PWNED"], "w").write("ran")
while True:
    sys.stdout.write("x" * 65536)
'''


def _hostile_sdist(folder: Path, version: str) -> Path:
    """sglang-V.tar.gz whose in-tree build backend (no requirements: pip needs no index) writes a
    file, then prints without end."""
    files = {"pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
             "backend.py": BACKEND, "PKG-INFO": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"}
    path = folder / f"sglang-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"sglang-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _cli(project, env: dict, *args: str) -> tuple[int, str, str]:
    """The CLI in its own session; past 120 s the whole group is killed (so a hang fails, not stalls)."""
    proc = subprocess.Popen([sys.executable, "-m", "knobkeeper.cli", *args, "--repo", str(project.root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **env})
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"catalog import hung (killed after 120 s); stderr ends {err[-300:]!r}")
    return proc.returncode, out, err


def test_an_sdist_in_the_wheelhouse_is_never_built(bare, tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    _hostile_sdist(house, "9.9.5")
    marker = tmp_path / "pwned"
    env = {"KK_PWNED": str(marker), "KNOBKEEPER_CACHE": str(tmp_path / "cache")}
    before = snapshot(bare)
    code, out, err = _cli(bare, env, "catalog", "import", "sglang", "--version", "9.9.5", "--wheelhouse", str(house))
    assert not marker.exists()                      # the backend never ran
    assert code == 2, (code, out, err[-500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-500:]
    assert "sglang==9.9.5: not found in wheelhouse" in lines[0] and len(lines[0]) < 600, lines[0]
    assert snapshot(bare) == before
    # a wheel of the same release beside it is what is read (ast, offline)
    _wheel(house, "sglang", "9.9.5", TINY_ENVIRON.format(extra=""))
    code, out, err = _cli(bare, env, "catalog", "import", "sglang", "--version", "9.9.5", "--wheelhouse", str(house))
    assert code == 0, (code, out, err[-500:])
    knobs = json.loads((bare.inventory_dir / "engines" / "sglang-9.9.5.json").read_text())["knobs"]
    assert knobs["SGLANG_TINY_QUEUES"]["default"] == 4 and not marker.exists()


def test_pip_past_its_time_is_stopped_and_only_its_output_tail_is_kept():
    """The bound itself (PIP_DOWNLOAD_TIMEOUT_S is 900 s; here 2 s): a child that prints without end
    is killed with its group, and what is kept of its output is the last OUTPUT_TAIL_BYTES."""
    from knobkeeper.engine import source

    code, tail = source._bounded_run([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"], 2)
    assert code is None and 0 < len(tail) <= source.OUTPUT_TAIL_BYTES
    code, tail = source._bounded_run([sys.executable, "-c", "print('ERROR: no such release')"], 30)
    assert code == 0 and tail.strip() == "ERROR: no such release"
