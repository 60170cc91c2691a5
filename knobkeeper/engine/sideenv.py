"""A side environment per engine version, holding just enough of the engine to run its argument parser.

`<cache>/sideenv/sglang-<V>/site` is a `pip install --no-deps --target` of the sglang wheel and the
few small packages `sglang.srt.server_args` imports (see PARSER_DEPS), built once and reused. It is
run by this interpreter with the folder first on PYTHONPATH, so the torch of the project's own
environment (the Makefile installs torch 2.13.0 CPU for the kernels) is reused; only where this
interpreter has no torch is torch==2.13.0 installed into the side environment too. Nothing of it is
imported into this process: knobkeeper itself never imports torch or sglang.

Offline: `wheel=` (a local sglang wheel) and `wheelhouse=` (a folder of wheels for everything,
pip --no-index --find-links) work without a network.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from knobkeeper.errors import UserError
from knobkeeper.knobs.registry import cache_dir, cached_wheel, read_wheel

PARSER_DEPS = ("psutil", "pybase64", "requests", "urllib3", "certifi", "idna", "charset-normalizer", "pyzmq",
               "tqdm", "ipython", "traitlets", "msgspec")
TORCH = "torch==2.13.0"
READY = "ready.json"


def side_env_dir(engine: str, version: str) -> Path:
    return cache_dir() / "sideenv" / f"{engine}-{version}"


def _pip_failure(done: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.startswith("ERROR")] or done.stderr.strip().splitlines()
    return lines[-1] if lines else f"pip exited with status {done.returncode}"


def ensure_side_env(engine: str, version: str, wheel: Path | None = None, wheelhouse: Path | None = None) -> Path:
    """The site folder of the side environment for `engine` `version`, built on first use (UserError if not possible)."""
    home = side_env_dir(engine, version)
    site = home / "site"
    if (home / READY).is_file() and site.is_dir():
        return site
    if wheel is not None:
        found, _ = read_wheel(engine, wheel)
        if found != version:
            raise UserError(f"--wheel {wheel}: holds {engine} {found}, not {version}")
    else:
        wheel = cached_wheel(engine, version, wheelhouse)
    wanted = [str(wheel), *PARSER_DEPS]
    if importlib.util.find_spec("torch") is None:
        wanted.append(TORCH)
    home.mkdir(parents=True, exist_ok=True)
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
    os.replace(build, site)
    (home / READY).write_text(json.dumps({"engine": engine, "version": version, "wheel": Path(wheel).name,
                                          "packages": wanted[1:]}) + "\n")
    return site


# The child's side: parse each argv with the engine's own parser; argparse's message on rejection.
_PARSE = r"""
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args
FIELDS = ("model_path", "served_model_name", "page_size", "kv_cache_dtype", "disaggregation_transfer_backend",
          "disaggregation_mode", "disaggregation_bootstrap_port", "host", "port", "tp_size")
argvs = json.load(open(sys.argv[1]))
out = []
for argv in argvs:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parsed = prepare_server_args(list(argv))
        out.append({"ok": True, "args": {f: getattr(parsed, f, None) for f in FIELDS}})
    except SystemExit as exc:
        lines = [l for l in err.getvalue().strip().splitlines() if "error:" in l] or err.getvalue().strip().splitlines()
        text = lines[-1].split("error:", 1)[-1].strip() if lines else f"exit status {exc.code}"
        out.append({"ok": False, "message": text})
    except Exception as exc:
        out.append({"ok": False, "message": f"{type(exc).__name__}: {exc}"})
json.dump(out, open(sys.argv[2], "w"), default=str)
"""


def parse_launch_args(engine: str, version: str, argvs: list[list[str]], wheel: Path | None = None,
                      wheelhouse: Path | None = None) -> list[dict]:
    """Each argv (the arguments after `-m sglang.launch_server`) through `prepare_server_args` of `version`:
    {"ok": True, "args": {...}} or {"ok": False, "message": argparse's message}.

    Verdicts are cached per (version, argv) beside the side environment: the parser is a pure function
    of its arguments, and a warm `check` should not pay torch's import (~2 s) again.
    """
    site = ensure_side_env(engine, version, wheel, wheelhouse)
    verdicts_path = site.parent / "verdicts.json"
    try:
        verdicts = json.loads(verdicts_path.read_text())
    except (OSError, ValueError):
        verdicts = {}
    keys = [json.dumps(argv) for argv in argvs]
    missing = [json.loads(k) for k in dict.fromkeys(keys) if k not in verdicts]
    if missing:
        with tempfile.TemporaryDirectory(prefix="knobkeeper-parse-") as tmp:
            src, dst = Path(tmp) / "argv.json", Path(tmp) / "out.json"
            src.write_text(json.dumps(missing))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
            done = subprocess.run([sys.executable, "-c", _PARSE, str(src), str(dst)], capture_output=True, text=True,
                                  env=env, cwd=tmp, timeout=300)
            if done.returncode != 0 or not dst.exists():
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                raise UserError(f"{engine} {version}'s parser did not run in {site}: {last}")
            for argv, result in zip(missing, json.loads(dst.read_text())):
                verdicts[json.dumps(argv)] = result
        tmp_path = verdicts_path.with_suffix(".tmp")
        tmp_path.write_text(json.dumps(verdicts))
        os.replace(tmp_path, verdicts_path)
    return [verdicts[k] for k in keys]
