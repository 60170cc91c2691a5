"""Closed-loop streaming load generator: `concurrency` workers, each sending its next request as
soon as the previous one ends, against OpenAI chat/completions or SGLang /generate.

Measurement (so that neither the ramp-up nor the tail biases throughput):

* warm-up: the first `warmup` completions (default: one per worker) are excluded. The window
  opens at t0, the moment the warm-up quota completes; load is already at `concurrency`.
* the window closes at t1: when `requests` requests that STARTED after t0 have ended, or at
  t0 + `duration`. Workers keep the load at `concurrency` until t1; requests still in flight at t1
  are cancelled and not counted (they are neither completions nor errors).
* output tokens/s = tokens whose chunk ARRIVED in [t0, t1] / (t1 - t0). Each streamed chunk
  carries usage_tokens / chunks of its request (usage from the final usage chunk for OpenAI,
  `meta_info.completion_tokens` for /generate; without usage each content chunk counts as 1).
  So requests that straddle t0 or t1 contribute exactly their share inside the window: no
  drain-tail or ramp bias, at any request count.
* requests/s = requests that ended successfully in the window / window.
* TTFT, ITL, end-to-end: from requests that started after t0 and ended by t1.
* errors: every failed request (HTTP status, connection error, timeout, bad stream) is counted
  by kind — in the window (`errors`) and in warm-up (`warmup_errors`) — never dropped. A failed
  request counts towards `requests`, so a dead endpoint ends the run instead of spinning.

Connections: by default every request opens a fresh connection (`force_close`). sglang-router
0.3.2 delays a streamed response on a reused keep-alive connection by ~42 ms (fresh: ~2.7 ms;
docs/platform-notes.md, "The routers"): with keep-alive that delay would land in every TTFT.
`keepalive=True` reuses connections (for endpoints without that quirk).

The client's own CPU time is reported (`client_cpu_s`, `client_cpu_util` = share of one core
over the run), so a result can show the load generator was not the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

APIS = ("chat", "completions", "generate")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


@dataclass
class RequestTrace:
    """One request as the client saw it: when it started, its chunks, how it ended."""

    start: float
    end: float = 0.0
    ok: bool = False
    error: str | None = None
    ttft: float | None = None
    chunk_times: list[float] = field(default_factory=list)   # arrival of each content chunk
    tokens: int = 0
    measured: bool = False      # started after t0
    cancelled: bool = False


def prompt_text(input_len: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, input_len)))


def request_body(api: str, model: str, prompt: str, output_len: int) -> dict[str, Any]:
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": output_len,
                "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if api == "completions":
        return {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
    return {"text": prompt, "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True},
            "stream": True}


def _has_content(api: str, obj: dict) -> tuple[bool, int | None]:
    """(does this chunk carry output, completion tokens it reports if any)."""
    if api == "generate":
        meta = obj.get("meta_info") or {}
        tokens = meta.get("completion_tokens")
        return bool(obj.get("text") is not None or obj.get("token_ids")), tokens
    usage = obj.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    for choice in obj.get("choices") or ():
        if api == "chat":
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                return True, tokens
        elif choice.get("text"):
            return True, tokens
    return False, tokens


async def _one(session, url: str, api: str, body: dict, rec: RequestTrace, timeout) -> None:
    rec.start = time.perf_counter()
    usage_tokens = None
    try:
        async with session.post(url, json=body, timeout=timeout) as resp:
            if resp.status != 200:
                text = (await resp.text())[:80].replace("\n", " ")
                rec.error = f"HTTP {resp.status}" + (f": {text}" if text else "")
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.perf_counter()
                try:
                    obj = json.loads(payload)
                except ValueError:
                    rec.error = "bad stream: chunk is not JSON"
                    return
                if isinstance(obj, dict) and obj.get("error"):
                    err = obj["error"]
                    rec.error = "stream error: " + str(err.get("message") if isinstance(err, dict) else err)[:80]
                    return
                content, tokens = _has_content(api, obj)
                if tokens is not None:
                    usage_tokens = tokens
                if content:
                    if rec.ttft is None:
                        rec.ttft = now - rec.start
                    rec.chunk_times.append(now)
        rec.end = time.perf_counter()
        if not rec.chunk_times:
            rec.error = "empty stream: no output chunk"
            return
        rec.tokens = usage_tokens if usage_tokens is not None else len(rec.chunk_times)
        rec.ok = True
    except asyncio.TimeoutError:
        rec.error = "timeout"
    except asyncio.CancelledError:
        rec.cancelled = True
        raise
    except Exception as exc:  # aiohttp.ClientError, OSError, payload errors: all are counted
        rec.error = type(exc).__name__
    finally:
        if not rec.end:
            rec.end = time.perf_counter()


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    xs = sorted(values)

    def q(p: float) -> float:
        k = (len(xs) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"mean": sum(xs) / len(xs), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


async def run_load_async(endpoint: str, concurrency: int, *, requests: int | None = None,
                         duration: float | None = None, api: str = "chat", model: str | None = None,
                         input_len: int = 128, output_len: int = 64, output_range: float = 0.0,
                         warmup: int | None = None, timeout_s: float = 120.0, keepalive: bool = False, seed: int = 0,
                         keep_records: bool = False) -> dict[str, Any]:
    """Run one closed-loop load at `concurrency`; returns the summary dict (see module doc)."""
    # here, not at the top: aiohttp costs ~105 ms, and the summary's readers (report, ab import) never send
    import aiohttp

    if api not in APIS:
        raise ValueError(f"api {api!r}: expected one of {', '.join(APIS)}")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if (requests is None) == (duration is None):
        raise ValueError("give exactly one of requests or duration")
    warmup = concurrency if warmup is None else warmup
    url = endpoint.rstrip("/") + PATHS[api]
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
    connector = aiohttp.TCPConnector(limit=concurrency + 8, force_close=not keepalive)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    records: list[RequestTrace] = []
    state = {"warm_done": 0, "t0": None, "measured_done": 0}
    warm_event = asyncio.Event()
    stop_event = asyncio.Event()
    if warmup == 0:
        state["t0"] = time.perf_counter()
        warm_event.set()
    async with aiohttp.ClientSession(connector=connector, headers={"Accept": "text/event-stream"}) as session:
        if model is None:
            model = await _discover_model(session, endpoint)
        prompts = [prompt_text(input_len, seed * 100003 + i) for i in range(16)]
        # output_range r: max tokens drawn from [L(1-r), L(1+r)] (sglang's random_range_ratio, two-
        # sided). Varied lengths keep closed-loop streams from finishing in lock-step.
        lengths = random.Random(seed)
        lo, hi = max(1, round(output_len * (1 - output_range))), max(1, round(output_len * (1 + output_range)))
        counter = [0]

        async def worker(wid: int) -> None:
            while not stop_event.is_set():
                i = counter[0]
                counter[0] += 1
                rec = RequestTrace(start=time.perf_counter())
                rec.measured = state["t0"] is not None
                records.append(rec)
                body = request_body(api, model, prompts[i % len(prompts)], lengths.randint(lo, hi) if hi > lo else lo)
                await _one(session, url, api, body, rec, timeout)
                if not rec.measured:
                    state["warm_done"] += 1
                    if state["warm_done"] >= warmup and state["t0"] is None:
                        state["t0"] = time.perf_counter()
                        warm_event.set()
                else:
                    state["measured_done"] += 1
                    if requests is not None and state["measured_done"] >= requests:
                        state["t1"] = time.perf_counter()
                        stop_event.set()

        tasks = [asyncio.create_task(worker(w)) for w in range(concurrency)]
        try:
            await warm_event.wait()
            if duration is not None:
                try:
                    await asyncio.wait_for(stop_event.wait(), timeout=duration)
                except asyncio.TimeoutError:
                    state["t1"] = time.perf_counter()
                    stop_event.set()
            else:
                await stop_event.wait()
        finally:
            stop_event.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    t0, t1 = state["t0"], state.get("t1") or time.perf_counter()
    asked = {"concurrency": concurrency, "api": api, "model": model, "input_len": input_len, "output_len": output_len,
             "output_range": output_range, "warmup_requests": warmup, "keepalive": keepalive,
             "requests_target": requests, "duration_target_s": duration}
    return {**asked, **_summarise(records, t0, t1, cpu=cpu, wall=wall, keep_records=keep_records)}


async def _discover_model(session, endpoint: str) -> str:
    """The first id of GET /v1/models, else "default" (SGLang accepts any name)."""
    try:
        async with session.get(endpoint.rstrip("/") + "/v1/models", timeout=5) as resp:
            if resp.status == 200:
                data = await resp.json(content_type=None)
                if data.get("data"):
                    return data["data"][0]["id"]
    except Exception:
        pass
    return "default"


def _tokens_in_window(rec: RequestTrace, per_chunk: float, t0: float, t1: float, mean_gap: float | None) -> float:
    """Output tokens of one request produced inside [t0, t1].

    A chunk's tokens are spread evenly over the gap since the previous chunk (the first chunk's
    over the time since the request started): they were generated step by step in that gap. So
    the count does not jump by whole chunks as the window edges move (counting chunk arrivals
    alone is off by up to one chunk per stream, which with long chunks and a short window is
    several percent). A request still in flight at t1 also gets the part of its next chunk
    generated since its last one, at its own chunk rate (capped at one chunk).
    """
    ct = rec.chunk_times
    prev = rec.start
    total = 0.0
    for b in ct:
        if b <= prev:
            total += per_chunk if t0 <= b <= t1 else 0.0
        else:
            overlap = min(b, t1) - max(prev, t0)
            if overlap > 0:
                total += per_chunk * overlap / (b - prev)
        prev = b
    if rec.cancelled and prev < t1:
        gap = (ct[-1] - rec.start) / len(ct) if ct else mean_gap
        if gap:
            total += per_chunk * min(1.0, (t1 - max(prev, t0)) / gap)
    return total


def _summarise(records: list[RequestTrace], t0: float, t1: float, *, cpu: float, wall: float,
               keep_records: bool) -> dict[str, Any]:
    """What the requests measured over the window (t0, t1]: throughput, latencies, errors, the client's CPU."""
    window = max(t1 - t0, 1e-9)
    tokens_in_window = 0.0
    completed_in_window = 0
    ttfts, itls, e2es, tpots = [], [], [], []
    errors: dict[str, int] = {}
    warmup_errors: dict[str, int] = {}
    n_measured = 0
    ok = [r for r in records if r.ok]
    ok_chunks = sum(len(r.chunk_times) for r in ok)
    tokens_per_chunk = sum(r.tokens for r in ok) / ok_chunks if ok_chunks else 1.0
    gaps = [(r.chunk_times[-1] - r.chunk_times[0]) / (len(r.chunk_times) - 1) for r in ok if len(r.chunk_times) > 1]
    mean_gap = sum(gaps) / len(gaps) if gaps else None
    for rec in records:
        if rec.cancelled:
            # In flight at t1: its chunks were real output, but it never got its final usage
            # chunk, so each chunk counts as the run's average tokens per chunk.
            tokens_in_window += _tokens_in_window(rec, tokens_per_chunk, t0, t1, mean_gap)
            continue
        if rec.error is not None:
            bucket = errors if rec.measured else warmup_errors
            bucket[rec.error] = bucket.get(rec.error, 0) + 1
            if rec.measured:
                n_measured += 1
            continue
        if rec.chunk_times:
            tokens_in_window += _tokens_in_window(rec, rec.tokens / len(rec.chunk_times), t0, t1, mean_gap)
        if t0 <= rec.end <= t1:
            completed_in_window += 1
        if rec.measured:
            n_measured += 1
            ttfts.append(rec.ttft * 1000)
            e2es.append((rec.end - rec.start) * 1000)
            ct = rec.chunk_times
            itls.extend((b - a) * 1000 for a, b in zip(ct, ct[1:]))
            if rec.tokens > 1:
                # TPOT as sglang/vllm bench define it: (latency - TTFT) / (output tokens - 1).
                tpots.append((rec.end - rec.start - rec.ttft) * 1000 / (rec.tokens - 1))
    out: dict[str, Any] = {
        "output_tokens_per_s": tokens_in_window / window,
        "requests_per_s": completed_in_window / window,
        "window_s": window,
        "completed": len(ttfts),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "warmup_errors": sum(warmup_errors.values()),
        "warmup_errors_by_kind": warmup_errors,
        "ttft_ms": _percentiles(ttfts), "itl_ms": _percentiles(itls), "e2e_ms": _percentiles(e2es),
        "tpot_ms": _percentiles(tpots),
        "client_cpu_s": cpu, "client_wall_s": wall, "client_cpu_util": cpu / wall if wall else None,
        "measured_requests": n_measured,
    }
    if keep_records:
        out["records"] = [{"start": r.start - t0, "end": r.end - t0, "ok": r.ok, "error": r.error,
                           "ttft_ms": None if r.ttft is None else r.ttft * 1000, "tokens": r.tokens,
                           "measured": r.measured, "cancelled": r.cancelled} for r in records]
    return out


def run_load(endpoint: str, concurrency: int, **kwargs: Any) -> dict[str, Any]:
    """Synchronous wrapper of `run_load_async` (its own event loop)."""
    return asyncio.run(run_load_async(endpoint, concurrency, **kwargs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m knobkeeper.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--concurrency", type=int, default=64)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--requests", type=int)
    group.add_argument("--duration", type=float, help="seconds of measurement after warm-up")
    parser.add_argument("--api", choices=APIS, default="chat")
    parser.add_argument("--model")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--output-range", type=float, default=0.0,
                        help="vary max tokens uniformly in [L(1-r), L(1+r)] (default 0: fixed)")
    parser.add_argument("--warmup", type=int, help="warm-up requests excluded (default: concurrency)")
    parser.add_argument("--keepalive", action="store_true", help="reuse connections (default: fresh per request)")
    args = parser.parse_args(argv)
    requests = args.requests if args.requests or args.duration else 10 * args.concurrency
    summary = run_load(args.endpoint, args.concurrency, requests=requests if not args.duration else None,
                       duration=args.duration, api=args.api, model=args.model, input_len=args.input_len,
                       output_len=args.output_len, output_range=args.output_range, warmup=args.warmup,
                       keepalive=args.keepalive)
    print(json.dumps(summary, indent=2))
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
