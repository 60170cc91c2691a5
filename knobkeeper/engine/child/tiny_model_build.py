"""The tiny model's builder: run as a script in the engine environment, never imported by knobkeeper.

    <env>/bin/python -I tiny_model_build.py --out DIR --seed N

knobkeeper.engine.tiny_model spawns it, waits, and checks what it wrote (that side is the controller's
and never imports torch; this side imports the stdlib and the engine's own torch, transformers,
tokenizers and safetensors, at the versions vLLM will read the checkpoint with). Files in
knobkeeper/engine/child/ are such scripts: tests/test_kernels.py allows them torch and holds every
other module of the package to not importing them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

import numpy
import safetensors
import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 4096
CORPUS_BYTES = 3_000_000     # of stdlib sources: ~10 s of one-thread BPE training
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
STAND_IN = ("a stand-in for your model: random weights from seed {seed}, built by knobkeeper for a real engine "
            "on a machine without your checkpoint; its output is noise")


def corpus_files() -> list[Path]:
    """Stdlib .py files of this interpreter, by name, until CORPUS_BYTES (the text that ships with Python)."""
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
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((p.read_text(encoding="utf-8", errors="replace") for p in files), trainer=trainer)
    return tok


def _child(out: Path, seed: int) -> None:
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
    parser = argparse.ArgumentParser(description="build the tiny stand-in model (run in the engine environment)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()
    _child(args.out, args.seed)
