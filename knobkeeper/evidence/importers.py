"""Read the result files of the benchmark tools people already use into evidence runs.

One small function per format, each returning an `Imported` (runs without arm/repeat, plus
what the file says about the setup). Field names follow each tool's own writer
(../shared/notes/bench-formats.md):

    sglang    `python -m sglang.bench_serving` JSONL: one JSON object per line, one run per line;
              the level is `max_concurrency` (the configured one), never `concurrency`
              (sglang's measured sum-of-latencies / duration).
    vllm      `vllm bench serve --save-result` JSON: one object per file; `max_concurrency`;
              `request_rate` may be `Infinity` (Python's json writes that for inf).
    guidellm  benchmarks.json: {"benchmarks": [...]}, each with a concurrent/synchronous strategy
              (in `config.strategy` since the v0.7-era schema, `args.strategy` before) and
              `metrics.<name>.successful.{mean,median,percentiles}`.
    aiperf    profile_export_aiperf.json: top-level metric tags with unit/avg/pNN; the level is
              `input_config.loadgen.concurrency`.
    kernels   the kernels benchmark (kernels/knobkeeper_kernels/bench.py): already an evidence
              doc (schema knobkeeper.evidence/1 or /2) whose runs carry arm A/B; a NaN, zero or
              negative throughput anywhere is a broken file (refused).

TTFT and TPOT (median, p99) are read wherever the tool writes them: they are the guards.
A throughput of 0 is read, not refused: the validity gates name it (zero generated tokens).

Anything unknown or malformed is a UserError naming the file and the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from knobkeeper.errors import UserError

FORMATS = ("sglang", "vllm", "guidellm", "aiperf", "kernels")
METRIC = "output_tokens_per_s"


@dataclass
class Imported:
    """Runs of one file (arm and repeat assigned by the caller) and what it says of the setup."""

    tool: str
    runs: list[dict] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)
    arm_runs: dict[str, list[dict]] | None = None   # kernels only: runs already split by arm
    doc: dict | None = None                         # kernels only: the source evidence doc


class _File:
    """A parsed file plus helpers that raise UserError naming it and the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, what: str) -> UserError:
        return UserError(f"{self.path}: {where}: {what}")

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

    def level(self, obj: Any, key: str, where: str) -> int:
        value = obj.get(key) if isinstance(obj, dict) else None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value) or value < 1):
            unlimited = value is None or (isinstance(value, float) and math.isinf(value))
            hint = " (unlimited concurrency: a level needs a configured concurrency)" if unlimited else ""
            raise self.fail(f"{where}{key}", f"expected a positive integer concurrency, got {value!r}{hint}")
        return int(value)


def _load_json(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)   # accepts Infinity/NaN as Python's json writes them
    except json.JSONDecodeError:
        pass
    lines = [ln for ln in text.splitlines() if ln.strip()]
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: line {i}: not JSON ({exc.msg})") from None
    if not out:
        raise UserError(f"{path}: empty file (expected a benchmark result)")
    return out


def _pct(obj: dict, mapping: dict[str, str], f: _File, where: str) -> dict | None:
    out = {k: f.num(obj, src, where, required=False) for k, src in mapping.items()}
    return out if any(v is not None for v in out.values()) else None


_TPOT = {"mean": "mean_tpot_ms", "p50": "median_tpot_ms", "p90": "p90_tpot_ms", "p99": "p99_tpot_ms"}
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


# ---------------------------------------------------------------- sglang bench_serving

_SGLANG_API = {"sglang": "generate", "sglang-native": "generate", "sglang-oai": "completions",
               "sglang-oai-chat": "chat", "vllm": "completions", "vllm-chat": "chat"}


def read_sglang(path: Path, data: Any = None) -> Imported:
    f = _File(path)
    data = _load_json(path) if data is None else data
    records = data if isinstance(data, list) else [data]
    out = Imported("sglang.bench_serving")
    for i, rec in enumerate(records):
        where = f"line {i + 1}: "
        if not isinstance(rec, dict):
            raise f.fail(f"line {i + 1}", "expected a JSON object")
        run = {
            "concurrency": f.level(rec, "max_concurrency", where),
            METRIC: f.num(rec, "output_throughput", where, nonnegative=True),
            "requests_per_s": f.num(rec, "request_throughput", where, required=False),
            "ttft_ms": _pct(rec, {"mean": "mean_ttft_ms", "p50": "median_ttft_ms", "p90": "p90_ttft_ms",
                                  "p99": "p99_ttft_ms"}, f, where),
            "tpot_ms": _pct(rec, _TPOT, f, where),
            "itl_ms": _pct(rec, {"mean": "mean_itl_ms", "p50": "median_itl_ms", "p90": "p90_itl_ms",
                                 "p99": "p99_itl_ms"}, f, where),
            "e2e_ms": _pct(rec, {"mean": "mean_e2e_latency_ms", "p50": "median_e2e_latency_ms",
                                 "p90": "p90_e2e_latency_ms", "p99": "p99_e2e_latency_ms"}, f, where),
            "completed": _int_or_none(rec.get("completed")),
            "errors": _int_or_none(rec.get("failed")) or 0,
            "requested": _int_or_none(rec.get("num_prompts")),
            "output_tokens": _int_or_none(rec.get("total_output_tokens")),
            "duration_s": f.num(rec, "duration", where, required=False),
            "measured_concurrency": f.num(rec, "concurrency", where, required=False),
        }
        env = _server_env(rec.get("server_info"))
        if env is not None:
            run["server_env"] = env
        out.runs.append(run)
        out.setup.update({k: v for k, v in {
            "api": _SGLANG_API.get(rec.get("backend")),
            "input_len": _int_or_none(rec.get("random_input_len")),
            "output_len": _int_or_none(rec.get("random_output_len")),
            "requests_per_run": _int_or_none(rec.get("completed")),
            "model": rec.get("model_id") or rec.get("model"),
        }.items() if v is not None})
    return out


# ---------------------------------------------------------------- vllm bench serve

_VLLM_API = {"openai-chat": "chat", "vllm-chat": "chat", "openai": "completions", "vllm": "completions",
             "sglang": "completions"}


def read_vllm(path: Path, data: Any = None) -> Imported:
    f = _File(path)
    rec = _load_json(path) if data is None else data
    if not isinstance(rec, dict):
        raise f.fail("(top level)", "expected one JSON object (vllm bench serve --save-result)")
    run = {
        "concurrency": f.level(rec, "max_concurrency", ""),
        METRIC: f.num(rec, "output_throughput", "", nonnegative=True),
        "requests_per_s": f.num(rec, "request_throughput", "", required=False),
        "ttft_ms": _pct(rec, {"mean": "mean_ttft_ms", "p50": "median_ttft_ms", "p90": "p90_ttft_ms",
                              "p99": "p99_ttft_ms"}, f, ""),
        "tpot_ms": _pct(rec, _TPOT, f, ""),
        "itl_ms": _pct(rec, {"mean": "mean_itl_ms", "p50": "median_itl_ms", "p90": "p90_itl_ms",
                             "p99": "p99_itl_ms"}, f, ""),
        "e2e_ms": _pct(rec, {"mean": "mean_e2el_ms", "p50": "median_e2el_ms", "p90": "p90_e2el_ms",
                             "p99": "p99_e2el_ms"}, f, ""),
        "completed": _int_or_none(rec.get("completed")),
        "errors": _int_or_none(rec.get("failed")) or 0,
        "requested": _int_or_none(rec.get("num_prompts")),
        "output_tokens": _int_or_none(rec.get("total_output_tokens")),
        "duration_s": f.num(rec, "duration", "", required=False),
    }
    # `vllm bench serve --metadata KEY=VALUE` puts the pairs at the top level: the way a user
    # records the server's environment in the result file.
    metadata = {k: v for k, v in rec.items() if _ENV_NAME.match(k) and isinstance(v, (str, int, float))}
    env = _server_env(rec.get("server_info"))
    if metadata or env is not None:
        run["server_env"] = {**{k: str(v) for k, v in metadata.items()}, **(env or {})}
    setup = {k: v for k, v in {
        "api": _VLLM_API.get(rec.get("backend")),
        "model": rec.get("model_id"),
        "requests_per_run": _int_or_none(rec.get("num_prompts")),
    }.items() if v is not None}
    return Imported("vllm bench serve", [run], setup)


# ---------------------------------------------------------------- guidellm

def _guidellm_level(f: _File, bench: dict, where: str) -> int:
    strategy = None
    for holder in (bench.get("config"), bench.get("args"), bench):
        if isinstance(holder, dict) and isinstance(holder.get("strategy"), dict):
            strategy = holder["strategy"]
            break
    if strategy is None:
        raise f.fail(f"{where}config.strategy", "missing (expected a concurrent or synchronous strategy)")
    kind = strategy.get("type_") or strategy.get("type")
    if kind == "synchronous":
        return 1
    if kind != "concurrent":
        raise f.fail(f"{where}config.strategy.type_",
                     f"{kind!r} is not a fixed concurrency (accepted: concurrent, synchronous)")
    return f.level(strategy, "streams", f"{where}config.strategy.")


def _guidellm_dist(f: _File, metrics: dict, name: str, where: str, *, scale: float = 1.0,
                   required: bool = False) -> dict | None:
    dist = metrics.get(name)
    if not isinstance(dist, dict) or not isinstance(dist.get("successful"), dict):
        if required:
            raise f.fail(f"{where}metrics.{name}.successful", "missing")
        return None
    ok = dist["successful"]
    pct = ok.get("percentiles") if isinstance(ok.get("percentiles"), dict) else {}
    out = {"mean": f.num(ok, "mean", f"{where}metrics.{name}.successful.", required=required),
           "p50": f.num(ok, "median", f"{where}metrics.{name}.successful.", required=False),
           "p90": f.num(pct, "p90", f"{where}metrics.{name}.successful.percentiles.", required=False),
           "p99": f.num(pct, "p99", f"{where}metrics.{name}.successful.percentiles.", required=False)}
    return {k: (None if v is None else v * scale) for k, v in out.items()}


def read_guidellm(path: Path, data: Any = None) -> Imported:
    f = _File(path)
    doc = _load_json(path) if data is None else data
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list) or not doc["benchmarks"]:
        raise f.fail("benchmarks", "expected a non-empty list (guidellm benchmarks.json)")
    out = Imported("guidellm")
    for i, bench in enumerate(doc["benchmarks"]):
        where = f"benchmarks[{i}]."
        if not isinstance(bench, dict) or not isinstance(bench.get("metrics"), dict):
            raise f.fail(f"{where}metrics", "missing (expected an object of metric distributions)")
        metrics = bench["metrics"]
        tput = _guidellm_dist(f, metrics, "output_tokens_per_second", where, required=True)
        if tput["mean"] is None or tput["mean"] < 0:
            raise f.fail(f"{where}metrics.output_tokens_per_second.successful.mean", "expected a number >= 0")
        rps = _guidellm_dist(f, metrics, "requests_per_second", where)
        totals = bench.get("request_totals") if isinstance(bench.get("request_totals"), dict) else {}
        run = {
            "concurrency": _guidellm_level(f, bench, where),
            METRIC: tput["mean"],
            "requests_per_s": rps["mean"] if rps else None,
            "ttft_ms": _guidellm_dist(f, metrics, "time_to_first_token_ms", where),
            "itl_ms": _guidellm_dist(f, metrics, "inter_token_latency_ms", where),
            "tpot_ms": _guidellm_dist(f, metrics, "time_per_output_token_ms", where),
            "e2e_ms": _guidellm_dist(f, metrics, "request_latency", where, scale=1000.0),  # seconds
            "completed": _int_or_none(totals.get("successful")),
            "errors": _int_or_none(totals.get("errored")) or 0,
            "duration_s": f.num(bench, "duration", where, required=False),
        }
        out.runs.append(run)
        model = None
        for holder in (bench.get("config"), bench.get("args"), bench.get("worker"), bench.get("backend")):
            if isinstance(holder, dict):
                model = model or holder.get("model") or holder.get("backend_model")
        if isinstance(model, str):
            out.setup["model"] = model
    return out


# ---------------------------------------------------------------- aiperf

def read_aiperf(path: Path, data: Any = None) -> Imported:
    f = _File(path)
    doc = _load_json(path) if data is None else data
    if not isinstance(doc, dict):
        raise f.fail("(top level)", "expected one JSON object (aiperf profile_export_aiperf.json)")
    loadgen = ((doc.get("input_config") or {}).get("loadgen") or {}) if isinstance(doc.get("input_config"), dict) else {}
    tput = doc.get("output_token_throughput")
    if not isinstance(tput, dict):
        raise f.fail("output_token_throughput", "missing (expected a metric object with avg)")

    def stat(tag: str) -> dict | None:
        m = doc.get(tag)
        if not isinstance(m, dict):
            return None
        return _pct(m, {"mean": "avg", "p50": "p50", "p90": "p90", "p99": "p99"}, f, f"{tag}.")

    errors = 0
    erc = doc.get("error_request_count")
    if isinstance(erc, dict):
        errors = int(f.num(erc, "avg", "error_request_count.") or 0)
    elif isinstance(doc.get("error_summary"), list):
        errors = sum(int(e.get("count") or 0) for e in doc["error_summary"] if isinstance(e, dict))
    count = doc.get("request_count")
    run = {
        "concurrency": f.level(loadgen, "concurrency", "input_config.loadgen."),
        METRIC: f.num(tput, "avg", "output_token_throughput.", nonnegative=True),
        "requests_per_s": f.num(doc.get("request_throughput") or {}, "avg", "request_throughput.", required=False),
        "ttft_ms": stat("time_to_first_token"),
        "itl_ms": stat("inter_token_latency"),
        # aiperf's inter_token_latency is per request (latency - TTFT) / (output tokens - 1): a TPOT.
        "tpot_ms": stat("inter_token_latency"),
        "e2e_ms": stat("request_latency"),
        "completed": _int_or_none(count.get("avg")) if isinstance(count, dict) else None,
        "errors": errors,
        "duration_s": f.num(doc.get("benchmark_duration") or {}, "avg", "benchmark_duration.", required=False),
    }
    endpoint = (doc.get("input_config") or {}).get("endpoint") or {}
    prompt = ((doc.get("input_config") or {}).get("input") or {}).get("prompt") or {}
    setup: dict[str, Any] = {}
    if isinstance(endpoint.get("model_names"), list) and endpoint["model_names"]:
        setup["model"] = endpoint["model_names"][0]
    if endpoint.get("type") in ("chat", "completions"):
        setup["api"] = endpoint["type"]
    for key, name in (("input_len", "input_tokens"), ("output_len", "output_tokens")):
        part = prompt.get(name)
        if isinstance(part, dict) and _int_or_none(part.get("mean")) is not None:
            setup[key] = _int_or_none(part["mean"])
    if run["completed"] is not None:
        setup["requests_per_run"] = run["completed"]
    return Imported("aiperf", [run], setup)


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


READERS: dict[str, Callable[..., Imported]] = {
    "sglang": read_sglang, "vllm": read_vllm, "guidellm": read_guidellm, "aiperf": read_aiperf,
    "kernels": read_kernels,
}


def detect(path: Path, data: Any) -> str:
    """The format of an already-parsed file, or a UserError naming it."""
    if isinstance(data, list):
        if data and all(isinstance(r, dict) and ("output_throughput" in r or "max_concurrency" in r) for r in data):
            return "sglang"
    elif isinstance(data, dict):
        if isinstance(data.get("schema"), str) and data["schema"].startswith("knobkeeper.evidence/"):
            return "kernels"
        if isinstance(data.get("benchmarks"), list):
            return "guidellm"
        if isinstance(data.get("output_token_throughput"), dict):
            return "aiperf"
        vllm_keys = ("num_prompts", "burstiness", "request_goodput", "max_concurrent_requests", "tokenizer_id")
        if "output_throughput" in data or "max_concurrency" in data:
            if any(k in data for k in vllm_keys):
                return "vllm"
            return "sglang"
    raise UserError(f"{path}: unknown result format (accepted: sglang bench_serving JSONL, vllm bench serve JSON, "
                    f"guidellm benchmarks.json, aiperf profile_export_aiperf.json, kernels evidence JSON; "
                    f"or pass --format)")


def read(path: str | Path, fmt: str = "auto") -> tuple[str, Imported]:
    """(format, Imported) for one file."""
    path = Path(path)
    if fmt != "auto" and fmt not in READERS:
        raise UserError(f"--format {fmt!r}: expected auto or one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    data = _load_json(path)
    if fmt == "auto":
        fmt = detect(path, data)
    if fmt != "sglang" and isinstance(data, list):
        if len(data) == 1:
            data = data[0]
        else:
            raise UserError(f"{path}: (top level): {len(data)} JSON lines, but --format {fmt} expects one object")
    return fmt, READERS[fmt](path, data)
