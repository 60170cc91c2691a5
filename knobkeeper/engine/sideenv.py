"""A side environment per (engine, version), holding just enough of the engine to run its own
argument parser.

`<cache>/sideenv/<engine>-<V>/site` is a `pip install --no-deps --target` of the engine's wheel and
the packages its parser imports (the family's ParserSpec: sglang's `server_args`, vLLM's `serve`
subcommand), at the versions the wheel's own METADATA pins where it pins them. It is built once,
under a file lock (two `check`s at once build it once), and reused. It is run by this interpreter
with the folder first on PYTHONPATH, so the torch of the project's own environment (the Makefile
installs the CPU torch of versions.TORCH_VERSION for the kernels) is reused; only where this
interpreter has no torch is that torch installed into the side environment too. Nothing of it is
imported into this process: knobkeeper itself never imports torch or an engine.

Cold, on this kind of machine (2 cores, PyPI over the network): sglang 0.5.23 ~40 s; vllm 0.32.0
(the 133 MB CPU wheel and ~23 packages, 0.7 GB) ~1-2 min, and its first parse ~15 s (vllm imports
torch). Warm: the parser's verdicts are cached per argv beside the side environment.

Offline: `wheel=` (a local engine wheel) and `wheelhouse=` (a folder of wheels for everything,
pip --no-index --find-links) work without a network.

It repairs itself: a verdict cache that is not {argv: verdict} (a `[]`, integers, a hand edit) is
ignored with one note and rewritten; a "ready" environment whose parser does not import (a module
deleted, a half-copied folder) is rebuilt once, and if it still does not import the error names
the folder to delete; the `site-XXXX` folder a killed build left (up to a few hundred MB) is removed
the next time the environment is used (under the build lock, where no build can be running).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from knobkeeper.engine import family
from knobkeeper.engine.pins import engine_pins
from knobkeeper.engine.source import cached_wheel, normal_name, open_wheel
from knobkeeper.engine.versions import TORCH_VERSION, cache_dir
from knobkeeper.errors import UserError
from knobkeeper.fsio import atomic_write, lock_file, replace_dir, unlock_file

TORCH = f"torch=={TORCH_VERSION}"
READY = "ready.json"
BROKEN = "broken.txt"   # a rebuild did not make the parser import: reported, never rebuilt again


def side_env_dir(engine: str, version: str) -> Path:
    return cache_dir() / "sideenv" / f"{engine}-{version}"


def _pip_failure(done: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.startswith("ERROR")] or done.stderr.strip().splitlines()
    return lines[-1] if lines else f"pip exited with status {done.returncode}"


def pinned_deps(wheel: Path, deps: tuple[str, ...]) -> list[str]:
    """Each of `deps` with the version specifier the wheel's METADATA gives it (markers dropped; a
    dependency it does not name is taken as the newest release)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = zf.read(meta).decode("utf-8", "replace")
    pins: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement, _, marker = line.split(":", 1)[1].partition(";")
        if "extra ==" in marker:
            continue
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$", requirement)
        if found:
            pins.setdefault(normal_name(found.group(1)), found.group(3).strip().strip("()"))
    return [f"{dep}{pins.get(normal_name(dep), '')}" for dep in deps]


def ensure_side_env(engine: str, version: str, wheel: Path | None = None, wheelhouse: Path | None = None) -> Path:
    """The site folder of the side environment for `engine` `version`, built on first use (UserError if not possible)."""
    spec = family(engine).parser
    if spec is None:
        raise UserError(f"engine {engine}: knobkeeper runs no flag parser for it")
    home = side_env_dir(engine, version)
    site = home / "site"
    if _ready(home, spec.deps) and not _stale_builds(home):
        return site
    home.mkdir(parents=True, exist_ok=True)
    lock = lock_file(home / ".lock")  # another process may be building it: wait, then use its build
    try:
        for stale in _stale_builds(home):  # under the lock no build runs: these are a killed one's
            shutil.rmtree(stale, ignore_errors=True)
        if _ready(home, spec.deps):
            return site
        if wheel is not None:
            found = open_wheel(wheel, spec.wheels, engine).version
            if found != version:
                raise UserError(f"--wheel {wheel}: holds {engine} {found}, not {version}")
        else:
            wheel = cached_wheel(spec.wheels, version, wheelhouse)
        wanted = [str(wheel), *pinned_deps(wheel, spec.deps)]
        if importlib.util.find_spec("torch") is None:
            wanted.append(TORCH)
        build = Path(tempfile.mkdtemp(prefix="site-", dir=home))
        args = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q",
                "--target", str(build), *wanted]
        if wheelhouse is not None:
            args[4:4] = ["--no-index", "--find-links", str(wheelhouse)]
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(build, ignore_errors=True)
            raise UserError(f"side environment for {engine} {version}: pip install failed: {_pip_failure(done)}")
        shutil.rmtree(site, ignore_errors=True)
        replace_dir(build, site)
        (home / BROKEN).unlink(missing_ok=True)
        atomic_write(home / READY, json.dumps({"engine": engine, "version": version, "wheel": Path(wheel).name,
                                               "deps": list(spec.deps), "packages": wanted[1:]}) + "\n")
    finally:
        unlock_file(lock)
    return site


def _stale_builds(home: Path) -> list[Path]:
    """The temporary build folders (`site-XXXX`) in `home`: a build in progress, or a killed one's."""
    return sorted(p for p in home.glob("site-*") if p.is_dir()) if home.is_dir() else []


def _unready(home: Path) -> None:
    """Mark the environment for a rebuild (the next ensure_side_env builds it again)."""
    (home / READY).unlink(missing_ok=True)


def _ready(home: Path, deps: tuple[str, ...]) -> bool:
    """Built, and for the parser's dependencies as this knobkeeper names them (a new list rebuilds it)."""
    try:
        return (home / "site").is_dir() and json.loads((home / READY).read_text()).get("deps") == list(deps)
    except (OSError, ValueError, AttributeError):
        return False


def _child_env(site: Path, tmp: str) -> dict[str, str]:
    """This environment without the engines' own variables (a user's VLLM_* must not change what the
    parser accepts), the side environment first on the path, caches in a temp folder, no network."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "SGLANG_", "SGL_"))}
    env.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
                "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(Path(tmp) / "cache"),
                "VLLM_CONFIG_ROOT": str(Path(tmp) / "config"), "TMPDIR": tmp})
    return env


def _read_verdicts(path: Path, notes: list[str] | None) -> dict[str, dict]:
    """The verdict cache {argv JSON: {"ok": bool, ...}}; anything else in the file is ignored (with
    one note) and rewritten by the next parse."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and all(isinstance(v, dict) and isinstance(v.get("ok"), bool) for v in data.values()):
        return data
    if notes is not None:
        notes.append(f"{path}: not a verdict cache (expected {{argv: verdict}}); ignored, rebuilt from the parser")
    return {}


def _run_parser(engine: str, version: str, site: Path, missing: list[list[str]]) -> tuple[list[dict] | None, str]:
    """The parser's verdicts for `missing`, or (None, its last line of error) when it did not run."""
    spec = family(engine).parser
    with tempfile.TemporaryDirectory(prefix="knobkeeper-parse-") as tmp:
        src, dst = Path(tmp) / "argv.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(missing))
        done = subprocess.run([sys.executable, "-c", spec.child, str(src), str(dst)], capture_output=True,
                              text=True, env=_child_env(site, tmp), cwd=tmp, timeout=300)
        if done.returncode != 0 or not dst.exists():
            return None, (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return json.loads(dst.read_text()), ""


def parse_launch_args(engine: str, version: str, argvs: list[list[str]], wheel: Path | None = None,
                      wheelhouse: Path | None = None, notes: list[str] | None = None) -> list[dict]:
    """Each argv (what the family's parser_argv took from a rendered command) through the pinned
    version's own parser: {"ok": True, "args": {...}} or {"ok": False, "message": argparse's message}.

    Verdicts are cached per (version, argv) beside the side environment: the parser is a pure function
    of its arguments, and a warm `check` should not pay torch's import (2-15 s) again. A parser that
    does not import in a "ready" environment has it rebuilt once; `notes` gets one line per repair.
    """
    site = ensure_side_env(engine, version, wheel, wheelhouse)
    broken = site.parent / BROKEN
    if broken.exists():  # rebuilt once already and it still did not import: say so, do not rebuild again
        raise UserError(broken.read_text().strip())
    verdicts_path = site.parent / "verdicts.json"
    verdicts = _read_verdicts(verdicts_path, notes)
    keys = [json.dumps(argv) for argv in argvs]
    missing = [json.loads(k) for k in dict.fromkeys(keys) if k not in verdicts]
    if missing:
        results, error = _run_parser(engine, version, site, missing)
        if results is None and ("ImportError" in error or "ModuleNotFoundError" in error):
            if notes is not None:
                notes.append(f"{site}: {engine} {version}'s parser did not import ({error}); rebuilt the side environment")
            _unready(site.parent)
            site = ensure_side_env(engine, version, wheel, wheelhouse)
            results, error = _run_parser(engine, version, site, missing)
            if results is None:
                message = (f"{engine} {version}'s parser does not import in {site} even after a rebuild: {error}; "
                           f"delete {site.parent} and run the command again")
                broken.write_text(message + "\n")
                raise UserError(message)
        if results is None:
            raise UserError(f"{engine} {version}'s parser did not run in {site}: {error}")
        for argv, result in zip(missing, results):
            verdicts[json.dumps(argv)] = result
        atomic_write(verdicts_path, json.dumps(verdicts))
    return [verdicts[k] for k in keys]


def prepare(inventory_dir: Path, wheelhouse: Path | None = None) -> list[tuple[str, str, float, str]]:
    """Build the side environment of every (engine, version) the inventories pin whose family has a
    parser; [(engine, version, seconds, "built" | "cached" | "skipped: why")]."""
    out = []
    for engine, version in sorted({(p.engine, p.version) for p in engine_pins(inventory_dir) if p.version}):
        if family(engine).parser is None:
            continue
        ready = _ready(side_env_dir(engine, version), family(engine).parser.deps)
        started = time.monotonic()
        try:
            ensure_side_env(engine, version, wheelhouse=wheelhouse)
            state = "cached" if ready else "built"
        except UserError as exc:
            state = f"skipped: {exc}"
        out.append((engine, version, time.monotonic() - started, state))
    return out


if __name__ == "__main__":
    # `python -m knobkeeper.engine.sideenv [INVENTORY_DIR]`: what `make test` runs before the suite, so
    # that the first `check` of a new machine does not build them inside a test's time limit.
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "inventory")
    for engine, version, seconds, state in prepare(folder):
        print(f"side environment {engine} {version}: {state} ({seconds:.1f} s) in {side_env_dir(engine, version)}")
