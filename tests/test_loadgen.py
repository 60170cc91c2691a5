"""knobkeeper.loadgen against a tiny aiohttp streaming stub (a real process, stopped by PID).

The stub (this file run as a script) streams `max_tokens` chunks, one every ITL_MS, after
TTFT_MS, in OpenAI chat/completions SSE (final usage chunk when asked) or SGLang /generate
shape (cumulative meta_info.completion_tokens). STUB_FAIL_EVERY=k answers every k-th request 500;
STUB_NO_USAGE=1 omits usage; STUB_TOKENS_PER_CHUNK packs several tokens per chunk.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

if __name__ != "__main__":
    from knobkeeper import loadgen
    from tests.procs import free_port, start, stop, wait_http

TTFT_MS = 20.0
ITL_MS = 10.0


def serve(port: int) -> None:
    import asyncio
    import json

    from aiohttp import web

    ttft, itl = float(os.environ.get("TTFT_MS", TTFT_MS)) / 1000, float(os.environ.get("ITL_MS", ITL_MS)) / 1000
    fail_every = int(os.environ.get("STUB_FAIL_EVERY", "0"))
    no_usage = os.environ.get("STUB_NO_USAGE") == "1"
    per_chunk = int(os.environ.get("STUB_TOKENS_PER_CHUNK", "1"))
    count = [0]

    async def health(request):
        return web.json_response({"ok": True})

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def stream(request):
        count[0] += 1
        if fail_every and count[0] % fail_every == 0:
            return web.json_response({"error": {"message": "injected"}}, status=500)
        body = await request.json()
        path = request.path
        n = body.get("max_tokens") or body.get("sampling_params", {}).get("max_new_tokens", 16)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(ttft)
        sent, text = 0, ""
        while sent < n:
            k = min(per_chunk, n - sent)
            sent += k
            piece = " tok" * k
            text += piece
            if path == "/generate":
                chunk = {"text": text, "meta_info": {"completion_tokens": sent, "prompt_tokens": 8}}
            elif path == "/v1/completions":
                chunk = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": piece}]}
            else:
                chunk = {"id": "c", "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if sent < n:
                await asyncio.sleep(itl)
        if path != "/generate" and not no_usage and body.get("stream_options", {}).get("include_usage"):
            usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n,
                                                         "total_tokens": n + 8}}
            await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    for p in ("/v1/chat/completions", "/v1/completions", "/generate"):
        app.router.add_post(p, stream)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@pytest.fixture
def stub(tmp_path):
    procs = []

    def launch(**env) -> str:
        port = free_port()
        proc = start([sys.executable, str(Path(__file__).resolve()), str(port)], tmp_path / f"stub{port}.log",
                     env={k: str(v) for k, v in env.items()}, cwd=str(Path(__file__).resolve().parent.parent))
        procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/health", timeout=20, proc=proc)
        return f"http://127.0.0.1:{port}"

    yield launch
    for proc in procs:
        stop(proc)


def test_chat_stream_throughput_latencies_and_usage(stub):
    url = stub()
    s = loadgen.run_load(url, 8, requests=40, api="chat", output_len=16)
    assert s["errors"] == 0 and s["completed"] >= 40 - 8 and s["measured_requests"] >= 40
    assert s["model"] == "stub-model"
    # What holds however busy the machine is (the stub's sleeps are lower bounds; how much longer each
    # one takes depends on the load): no faster than the stub can stream (8 streams x one token per
    # ITL_MS after TTFT_MS per request of 16 tokens), latencies no shorter than its sleeps, and the
    # window's throughput what Little's law says of a closed loop of 8: 8 x 16 tokens per mean
    # request latency (the loadgen's tokens and its clocks agree with each other).
    fastest = 8 * 16 / ((TTFT_MS + 15 * ITL_MS) / 1000)
    assert 0 < s["output_tokens_per_s"] < 1.1 * fastest
    assert s["ttft_ms"]["p50"] > TTFT_MS * 0.9 and s["itl_ms"]["p50"] > ITL_MS * 0.9
    # TPOT (a guard metric): (latency - TTFT) / (tokens - 1); the stub sleeps ITL_MS per token at least
    assert s["tpot_ms"]["p50"] >= ITL_MS * 0.9 and s["tpot_ms"]["p99"] >= s["tpot_ms"]["p50"]
    assert s["e2e_ms"]["p50"] > TTFT_MS + 15 * ITL_MS
    little = 8 * 16 / (s["e2e_ms"]["mean"] / 1000)
    assert abs(s["output_tokens_per_s"] - little) / little < 0.25, (s["output_tokens_per_s"], little)
    assert abs(s["requests_per_s"] * 16 - s["output_tokens_per_s"]) / s["output_tokens_per_s"] < 0.25


def test_generate_api_counts_tokens_from_meta_info(stub):
    url = stub(STUB_TOKENS_PER_CHUNK=4)
    s = loadgen.run_load(url, 4, requests=12, api="generate", output_len=16, keep_records=True)
    assert s["errors"] == 0
    done = [r for r in s["records"] if r["ok"]]
    assert done and all(r["tokens"] == 16 for r in done)     # 4 chunks, 16 tokens by meta_info


def test_completions_without_usage_falls_back_to_chunks(stub):
    url = stub(STUB_NO_USAGE=1, STUB_TOKENS_PER_CHUNK=2)
    s = loadgen.run_load(url, 4, requests=12, api="completions", output_len=16, keep_records=True)
    done = [r for r in s["records"] if r["ok"]]
    assert done and all(r["tokens"] == 8 for r in done)      # 8 chunks, usage absent


def test_errors_are_counted_by_kind_never_dropped(stub):
    url = stub(STUB_FAIL_EVERY=5)
    s = loadgen.run_load(url, 4, requests=40, output_len=8)
    total_errors = s["errors"] + s["warmup_errors"]
    assert s["errors"] >= 5 and set(s["errors_by_kind"]) == {"HTTP 500: {\"error\": {\"message\": \"injected\"}}"}
    assert s["measured_requests"] >= 40 and total_errors >= 8


def test_dead_endpoint_terminates_with_all_errors():
    port = free_port()
    t = time.monotonic()
    s = loadgen.run_load(f"http://127.0.0.1:{port}", 4, requests=10, model="m")
    assert time.monotonic() - t < 10
    assert s["errors"] >= 10 and s["completed"] == 0 and s["output_tokens_per_s"] == 0
    assert "ClientConnectorError" in s["errors_by_kind"]


def test_duration_mode_window(stub):
    url = stub()
    s = loadgen.run_load(url, 6, duration=1.0, output_len=16)
    assert 0.95 < s["window_s"] < 1.3 and s["errors"] == 0 and s["completed"] > 0


def test_capacity_concurrency_96_with_cpu_to_spare(stub):
    """Little's law: requests/s x mean e2e = the concurrency actually held; client CPU well below a core."""
    url = stub(TTFT_MS=30, ITL_MS=20)
    s = loadgen.run_load(url, 96, requests=288, output_len=32)
    held = s["requests_per_s"] * s["e2e_ms"]["mean"] / 1000
    print(f"held {held:.1f} of 96, client CPU {s['client_cpu_util']:.0%} of one core, "
          f"{s['output_tokens_per_s']:.0f} tok/s")
    assert s["errors"] == 0
    assert held > 96 * 0.9
    assert s["client_cpu_util"] < 0.6


if __name__ == "__main__":
    serve(int(sys.argv[1]))
