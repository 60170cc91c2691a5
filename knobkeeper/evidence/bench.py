"""`ab run --bench TOOL`: the user's own benchmark tool loads each arm, level and repeat.

    tool = locate("vllm", python=None)       the tool's python and version, or UserError (not installed)
    load = ToolLoad(tool, out_dir, args)     a Harness.load: runs the tool once per level, reads its file
                                             with the tool's reader (knobkeeper.evidence.importers)

Where the tool is: `--bench-python PY` (or KNOBKEEPER_BENCH_PYTHON), the python of the environment
the tool is installed in; else the tool's console script on PATH (`vllm`, `guidellm`, `aiperf`; for
sglang, whose bench_serving has none, `python3`), whose `#!` line names that python. Every tool is
run as that python with the tool's entry (`-m sglang.bench_serving`, vllm's CLI main), so the
version comes from the same environment (importlib.metadata, nothing imported) and a tool that is
not installed there is said before any arm is switched.

What each tool is asked (the command lines live beside each reader: importers.vllm_command, ...):
the same prompt shape (api, input and output tokens, --ignore-eos or its like) and the same seed for
every arm, level and repeat, `requests` requests at the level's concurrency. The block's warm-up
(thrown away) stays the built-in load generator: it only warms the engine, and a tool start costs
seconds. `--bench-arg` words are appended to every command as given.

A tool that exits non-zero stops the run (UserError with its last lines); `measure` restores the
declared state in its `finally`. Each result file is kept (`raw`: copied beside the evidence, as
`ab import` does) and read with the tool's reader: its counts (failed requests, or "not recorded"),
its throughput and latencies are the run's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError
from knobkeeper.evidence import importers

PYTHON_ENV = "KNOBKEEPER_BENCH_PYTHON"
TAIL_LINES = 12


@dataclass(frozen=True)
class Located:
    tool: importers.BenchTool
    python: str
    version: str | None


def _shebang_python(script: str) -> str | None:
    """The interpreter a console script's `#!` line names (None: not a python script)."""
    try:
        with open(script, "rb") as fh:
            first = fh.readline(400).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = [shutil.which(words[1]) or words[1]]
    return words[0] if words and "python" in Path(words[0]).name else None


def locate(name: str, python: str | None = None) -> Located:
    """The tool `name`'s python and version (see the module doc), or UserError naming what to do."""
    if name not in importers.TOOLS:
        raise UserError(f"--bench {name!r}: expected loadgen or one of {', '.join(importers.TOOLS)}")
    tool = importers.TOOLS[name]
    python = python or os.environ.get(PYTHON_ENV) or None
    how = f"--bench-python {python}"
    if python is None:
        script = shutil.which(tool.script)
        if script is None:
            raise UserError(f"--bench {name}: {tool.label} is not installed (no `{tool.script}` on PATH); install it "
                            f"(pip install {tool.dists[0]}) or pass --bench-python /path/to/its/venv/bin/python")
        python = script if tool.script.startswith("python") else _shebang_python(script)
        how = f"`{script}` on PATH"
        if python is None:
            raise UserError(f"--bench {name}: {script} is not a python console script; pass --bench-python "
                            f"/path/to/the/venv/bin/python of the environment {tool.label} is installed in")
    if shutil.which(python) is None:
        raise UserError(f"--bench-python {python}: no such executable")
    probe = ("import importlib.metadata as m, sys\n"
             f"for d in {list(tool.dists)!r}:\n"
             "    try: print(m.version(d)); sys.exit(0)\n"
             "    except m.PackageNotFoundError: pass\n"
             "sys.exit(3)\n")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"--bench {name}: cannot run {python} ({exc})") from None
    if done.returncode != 0:
        raise UserError(f"--bench {name}: {tool.label} is not installed in {python} ({how}; looked for the "
                        f"distribution {' or '.join(tool.dists)}); pip install {tool.dists[0]} there, or pass "
                        f"--bench-python of the environment that has it")
    return Located(tool, python, done.stdout.strip().split("+")[0] or None)


def served_model(endpoint: str, timeout: float = 10.0) -> str:
    """The first model the endpoint serves (/v1/models), for the tools' --model."""
    try:
        with urllib.request.urlopen(f"{endpoint.rstrip('/')}/v1/models", timeout=timeout) as resp:
            data = json.loads(resp.read())
        return str(data["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        raise UserError(f"--endpoint {endpoint}: /v1/models names no model; pass --model") from None


@dataclass
class ToolLoad:
    """A `Harness.load` that runs the located tool once per call into `out_dir` and returns the run
    its reader reads (`{"run": evidence run fields, "raw_file": path}`); `_block` files it."""

    located: Located
    out_dir: Path
    args: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    seed: int = 0
    calls: int = 0
    setup: dict[str, Any] | None = None                  # what the first result file says of the setup
    seconds: list[float] = field(default_factory=list)   # each tool run's wall time (the benchmark reads it)

    @property
    def label(self) -> str:
        return f"{self.located.tool.label} {self.located.version or ''}".strip()

    def __call__(self, endpoint: str, concurrency: int, *, requests: int | None = None, api: str = "chat",
                 model: str | None = None, input_len: int = 128, output_len: int = 64, **_: Any) -> dict:
        tool = self.located.tool
        if requests is None:
            raise UserError(f"--bench {tool.name}: give --requests (the tools run a number of prompts, not a duration)")
        if api not in tool.apis:
            raise UserError(f"--api {api}: {tool.label} cannot send it through knobkeeper (accepted: "
                            f"{', '.join(tool.apis)})")
        self.calls += 1
        suffix = ".jsonl" if tool.name == "sglang" else "" if tool.name == "aiperf" else ".json"
        out = self.out_dir / f"{self.calls:03d}-c{concurrency}{suffix}"
        load = importers.Load(endpoint.rstrip("/"), model or served_model(endpoint), self.tokenizer, api, input_len,
                              output_len, requests, concurrency, self.seed, out)
        argv = [self.located.python, *tool.python_args, *tool.command(load), *self.args]
        env = {**os.environ, **dict(tool.env)}
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.out_dir)
        except OSError as exc:
            raise UserError(f"--bench {tool.name}: cannot run {argv[0]} ({exc})") from None
        self.seconds.append(time.monotonic() - started)
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines()[-TAIL_LINES:] or ["(no output)"]
            # One line, as every error is (the CLI would print a newline as a literal \n).
            raise UserError(f"--bench {tool.name}: {self.label} exited with status {done.returncode}; "
                            f"its last lines: {' | '.join(line.strip() for line in lines)}")
        result = tool.result(load)
        if not result.exists():
            raise UserError(f"--bench {tool.name}: {self.label} exited 0 but wrote no {result}")
        if result.is_dir():   # aiperf's artifact directory: its one per-level file is the raw result
            result = importers.aiperf_files(result)[0]
        _, imp = importers.read(result, tool.name)
        if len(imp.runs) != 1 or int(imp.runs[0]["concurrency"]) != concurrency:
            levels = [r.get("concurrency") for r in imp.runs]
            raise UserError(f"{result}: {self.label} recorded levels {levels}, but it was run at {concurrency}")
        self.setup = self.setup or dict(imp.setup, model=load.model)
        return {"run": importers.evidence_fields(imp.runs[0]), "raw_file": result}
