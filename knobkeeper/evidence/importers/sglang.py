"""sglang `python -m sglang.bench_serving` JSONL: its reader, its command line, its BenchTool row."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from knobkeeper.evidence.importers.common import (
    ITL, OFFLINE, TPOT, TTFT, BenchTool, File, Imported, Load, clean, int_or_none, load_json, not_recorded,
    one_value, pct, requests_per_run, server_env, str_or_none, tokenizer, with_counts,
)
from knobkeeper.evidence.model import METRIC


_SGLANG_API = {"sglang": "generate", "sglang-native": "generate", "sglang-oai": "completions",
               "sglang-oai-chat": "chat", "vllm": "completions", "vllm-chat": "chat"}
# sglang's own name for a result file when --output-file is not given (benchmark/serving.py)
_SGLANG_DEFAULT_NAME = re.compile(r"^(?P<backend>[a-z0-9-]+)_\d{4}_(?P<n>\d+)_(?P<input>\d+)_(?P<output>\d+)\.jsonl$")
SGLANG_0_5_23_KEYS = ("server_info", "total_input_text_tokens")


def _sglang_shape(rec: dict) -> str:
    return "0.5.23" if all(k in rec for k in SGLANG_0_5_23_KEYS) else "before 0.5.23"


def _sglang_counts(f: File, rec: dict, where: str, completed: int | None) -> tuple[int | None, int | None, str | None]:
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
    f = File(path, "sglang bench_serving")
    data = load_json(path) if data is None else data
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
        run = with_counts({
            "concurrency": f.level(rec, "max_concurrency", where),
            METRIC: f.num(rec, "output_throughput", where, nonnegative=True),
            "requests_per_s": f.num(rec, "request_throughput", where, required=False),
            "ttft_ms": pct(rec, TTFT, f, where),
            "tpot_ms": pct(rec, TPOT, f, where),
            "itl_ms": pct(rec, ITL, f, where),
            "e2e_ms": pct(rec, {"mean": "mean_e2e_latency_ms", "p50": "median_e2e_latency_ms",
                                 "p90": "p90_e2e_latency_ms", "p99": "p99_e2e_latency_ms"}, f, where),
            "output_tokens": int_or_none(rec.get("total_output_tokens")),
            "duration_s": f.num(rec, "duration", where, required=False),
            "measured_concurrency": f.num(rec, "concurrency", where, required=False),
        }, completed=completed, errors=failed, requested=requested)
        env = server_env(rec.get("server_info"))
        if env is not None:
            run["server_env"] = env
        if isinstance(rec.get("server_info"), dict):
            server = rec["server_info"]
        runs.append(run)
    version = "0.5.23" if shapes == {"0.5.23"} else None
    tool = "sglang bench_serving" + (f" {version}" if version else "")
    out = Imported(tool, runs, tool_version=version, shape=f"sglang bench_serving JSONL ({', '.join(sorted(shapes))})")
    if None in how_found:
        out.notes.append(not_recorded(tool, "its JSONL line has no failed and no num_prompts; run it with "
                                             "--output-details to record each request's error"))
    for how in sorted(h for h in how_found if h):
        out.notes.append(f"errors: counted from {how}")
    first = records[0]
    dataset = str_or_none(first.get("dataset_name"))
    random_lengths = bool(dataset and dataset.startswith("random"))
    out.setup = clean({
        "api": _SGLANG_API.get(first.get("backend")),
        "backend": str_or_none(first.get("backend")),
        "dataset": dataset,
        "input_len": int_or_none(one_value(r.get("random_input_len") for r in records)) if random_lengths else None,
        "output_len": (int_or_none(one_value(r.get("random_output_len") for r in records)) if random_lengths
                       else int_or_none(first.get("sharegpt_output_len"))),
        "requests_per_run": requests_per_run(runs),
        "model": str_or_none(first.get("model_id")) or str_or_none(first.get("model"))
                 or str_or_none(server.get("served_model_name")),
        "served_model_name": str_or_none(server.get("served_model_name")),
        "engine": ("sim" if server.get("simulated") else "sglang") if server else None,
        "engine_version": str_or_none(server.get("version")),
        "tool": "sglang bench_serving", "tool_version": version,
    })
    return out


_SGLANG_BACKEND = {"generate": "sglang", "completions": "sglang-oai", "chat": "sglang-oai-chat"}


def sglang_command(load: Load) -> list[str]:
    """`python -m sglang.bench_serving` for one level: random-ids prompts of exactly input_len tokens,
    --output-details so that the JSONL line records each request's error (the errors gate applies)."""
    return ["--backend", _SGLANG_BACKEND[load.api], "--base-url", load.endpoint, "--model", load.model,
            *tokenizer(load), "--dataset-name", "random-ids", "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len), "--random-range-ratio", "1.0",
            "--num-prompts", str(load.requests), "--max-concurrency", str(load.concurrency),
            "--seed", str(load.seed), "--output-details", "--output-file", str(load.out)]


SGLANG = BenchTool("sglang", "sglang bench_serving", ("-m", "sglang.bench_serving"), "python3", ("sglang",),
                   sglang_command, env=OFFLINE, apis=("generate", "completions", "chat"))
