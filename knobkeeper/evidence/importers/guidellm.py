"""guidellm benchmarks.json: its reader, its command line, its BenchTool row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from knobkeeper.evidence.importers.common import (
    OFFLINE, BenchTool, File, Imported, Load, clean, int_or_none, load_json, not_recorded, requests_per_run,
    str_or_none, with_counts,
)
from knobkeeper.evidence.model import METRIC


def _guidellm_level(f: File, bench: dict, where: str) -> int:
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


def _guidellm_dist(f: File, metrics: dict, name: str, where: str, *, scale: float = 1.0,
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
            name = str_or_none(holder.get("model")) or str_or_none(holder.get("backend_model"))
            if name:
                return name
    requests = bench.get("requests") if isinstance(bench.get("requests"), dict) else {}
    for req in requests.get("successful") or []:
        try:
            body = json.loads(req.get("request_args") or "{}").get("body") or {}
        except (AttributeError, TypeError, json.JSONDecodeError):
            continue
        if str_or_none(body.get("model")):
            return body["model"]
    return None


def read_guidellm(path: Path, data: Any = None) -> Imported:
    doc = load_json(path) if data is None else data
    f = File(path, "guidellm")
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list) or not doc["benchmarks"]:
        raise f.fail("benchmarks", "expected a non-empty list (guidellm benchmarks.json)")
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = str_or_none(meta.get("guidellm_version"))
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
        out.runs.append(with_counts({
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
        out.notes.append(not_recorded(tool, "no request_totals in metrics or at the benchmark's top level"))
    spec = (doc.get("config") or {}).get("spec") if isinstance(doc.get("config"), dict) else None
    spec = spec if isinstance(spec, dict) else {}
    data_specs = [d for d in spec.get("data") or [] if isinstance(d, dict)]
    synthetic = data_specs[0] if len(data_specs) == 1 and data_specs[0].get("kind") == "synthetic_text" else {}
    backend = spec.get("backend") if isinstance(spec.get("backend"), dict) else {}
    request_format = str_or_none(backend.get("request_format"))
    out.setup.update(clean({
        "api": {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(request_format),
        "request_format": request_format,
        "dataset": str_or_none(data_specs[0].get("kind")) if data_specs else None,
        "input_len": int_or_none(synthetic.get("prompt_tokens")),
        "output_len": int_or_none(synthetic.get("output_tokens")),
        "requests_per_run": requests_per_run(out.runs),
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
