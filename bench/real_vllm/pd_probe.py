"""Measure the real PD stack by hand and write what was seen to a JSON file in bench/real_vllm/results/ (--out).

    flock /tmp/kk-heavy.lock .venv/bin/python bench/real_vllm/pd_probe.py --model /tmp/tiny [--out FILE]

1. prefill and decode started together (one core each), the router started at once beside them: every
   0.5 s the status of /health, /v1/models on each worker and /health, /liveness, /readiness,
   /v1/models, /workers on the router, until all answer (the start-up timeline: what each endpoint
   means while the engines load);
2. the first requests through the router (the first after start vs the next ones);
3. one request through the router: prompt_tokens_by_source{source="external_kv_transfer"} on decode
   before/after, and the same greedy text as prefill alone gives;
4. a streamed chat completion through the router with the official openai client;
5. the vllm:* metric names and types on decode, the router's vllm_router_* names;
6. RSS per process;
7. decode restarted (SIGTERM, start again): a request every 0.5 s through the router and the router's
   /readiness and /workers, until requests succeed again; then the same with a CPU hog running
   (a loaded start-up).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from stack import (SERVED, Hog, Worker, complete, free_port, http, kv_external, metric_samples, metric_types,
                   start_router, wait_health)

ENDPOINTS_WORKER = ("/health", "/v1/models")
ENDPOINTS_ROUTER = ("/health", "/liveness", "/readiness", "/v1/models", "/workers")


def timeline(procs: dict, until: float, every: float = 0.5) -> list[dict]:
    """Poll every endpoint of every process; one row per change of any status."""
    rows, last = [], None
    t0 = min(p.started for p in procs.values())
    while time.monotonic() < until:
        row = {}
        for name, proc in procs.items():
            paths = ENDPOINTS_ROUTER if name == "router" else ENDPOINTS_WORKER
            for path in paths:
                status, text = http(proc.url + path, timeout=1.0)
                row[f"{name}{path}"] = status if path != "/workers" or status != 200 else f"200 {text[:160]}"
        if row != last:
            rows.append({"t": round(time.monotonic() - t0, 1), **row})
            last = row
        if all(v == 200 or str(v).startswith("200") for v in row.values()):
            break
        time.sleep(every)
    return rows


LIVE: list = []        # every process started, stopped at the end whatever happens


def restart_watch(decode_worker: Worker, old, router, model: Path, work: Path, tag: str,
                  seconds: float = 400.0) -> dict:
    """Stop decode, start it again at once; a request through the router every 0.5 s until 3 in a row succeed."""
    load0 = os.getloadavg()
    events = []
    t0 = time.monotonic()
    old.stop()
    stopped = time.monotonic() - t0
    new = decode_worker.start(model, work, tag=tag)
    LIVE.append(new)
    last_kind, ok_run, first_ok, health_ok = None, 0, None, None
    while time.monotonic() - t0 < seconds:
        if new.popen.poll() is not None:
            events.append({"t": round(time.monotonic() - t0, 1), "decode exited": new.popen.returncode,
                           "tail": new.tail()})
            break
        if health_ok is None and http(new.url + "/health", timeout=1.0)[0] == 200:
            health_ok = round(time.monotonic() - t0, 1)
        status, body, wall = complete(router.url, max_tokens=4, timeout=10.0)
        ready = http(router.url + "/readiness", timeout=1.0)
        workers = http(router.url + "/workers", timeout=1.0)
        kind = (status, ready[0], str(body)[:120] if status != 200 else "ok")
        if kind != last_kind:
            events.append({"t": round(time.monotonic() - t0, 1), "request": status,
                           "body": str(body)[:200] if status != 200 else None, "request_s": round(wall, 2),
                           "router /readiness": ready[0], "router /readiness body": ready[1][:200],
                           "router /workers": workers[1][:300]})
            last_kind = kind
        if status == 200:
            first_ok = first_ok or round(time.monotonic() - t0, 1)
            ok_run += 1
            if ok_run >= 3:
                break
        else:
            ok_run = 0
        time.sleep(0.5)
    return {"loadavg_at_restart": load0, "stop_s": round(stopped, 1), "decode_health_200_s": health_ok, "first_ok_request_s": first_ok,
            "events": events, "proc": new}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "pd_probe.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kk-real-vllm-probe"))
    ap.add_argument("--router-args", default="", help="extra router flags, e.g. the health-check tuning")
    ap.add_argument("--hog-restart", action="store_true", help="also restart decode once with a CPU hog running")
    args = ap.parse_args()
    # `timeout` sends SIGTERM: stop the engines as Ctrl-C does (they run in their own sessions)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict = {"when": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": "2 cores, shared with other helpers"}
    prefill = Worker("prefill", free_port(), free_port(), "0")
    decode = Worker("decode", free_port(), free_port(), "1")
    rport, mport = free_port(), free_port()
    procs = {}
    try:
        procs["prefill"] = prefill.start(args.model, args.work)
        procs["decode"] = decode.start(args.model, args.work)
        procs["router"] = start_router([procs["prefill"].url], [procs["decode"].url], rport, mport, args.work,
                                       extra=args.router_args.split())
        result["router_args"] = args.router_args
        result["loadavg_at_start"] = os.getloadavg()
        LIVE.extend(procs.values())
        result["startup_timeline"] = timeline(procs, time.monotonic() + 400)
        result["startup_s"] = {n: wait_health(p, timeout=30) for n, p in procs.items() if n != "router"}
        result["router_readiness_s"] = wait_health(procs["router"], "/readiness", timeout=60)
        router = procs["router"]

        first = []
        for i in range(4):
            status, body, wall = complete(router.url, max_tokens=16)
            first.append({"i": i, "status": status, "wall_s": round(wall, 3)})
        result["first_requests_through_router"] = first

        before = kv_external(procs["decode"].url)
        before_p = metric_samples(procs["prefill"].url)
        prompt = " ".join(["alpha bravo charlie delta echo foxtrot golf hotel"] * 25)
        status, body, wall = complete(router.url, prompt=prompt, max_tokens=16)
        after = kv_external(procs["decode"].url)
        direct = complete(procs["prefill"].url.replace(str(prefill.port), str(prefill.port)), prompt=prompt,
                          max_tokens=16)
        usage = body.get("usage") if isinstance(body, dict) else None
        result["kv_transfer"] = {
            "status": status, "prompt_tokens": (usage or {}).get("prompt_tokens"),
            "decode_external_kv_transfer_before": before, "after": after, "delta": after - before,
            "decode_samples_by_source": {k: v for k, v in metric_samples(procs["decode"].url).items()
                                         if k.startswith("vllm:prompt_tokens_by_source")},
            "prefill_prompt_tokens_before": {k: v for k, v in before_p.items() if k.startswith("vllm:prompt_tokens_total")},
            "text_via_router": body["choices"][0]["text"] if isinstance(body, dict) else None,
            "text_prefill_alone": direct[1]["choices"][0]["text"] if isinstance(direct[1], dict) else None,
        }

        from openai import OpenAI

        client = OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=60)
        t0 = time.monotonic()
        chunks, text, usage, ttft = 0, "", None, None
        for chunk in client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hello"}],
                                                    max_tokens=24, stream=True, temperature=0,
                                                    stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or time.monotonic() - t0
                text += chunk.choices[0].delta.content
                chunks += 1
            if chunk.usage:
                usage = chunk.usage.model_dump()
        result["openai_stream"] = {"chunks": chunks, "text": text, "usage": usage, "ttft_s": round(ttft or -1, 3),
                                   "wall_s": round(time.monotonic() - t0, 3)}

        result["metric_types_decode"] = metric_types(procs["decode"].url)
        result["router_metric_types"] = metric_types(f"http://127.0.0.1:{mport}", prefix="vllm_router")
        result["rss_mib"] = {n: p.rss_mib() for n, p in procs.items()}

        quiet = restart_watch(decode, procs["decode"], router, args.model, args.work, "-r1")
        procs["decode"] = quiet.pop("proc")
        result["decode_restart_quiet"] = quiet
        if args.hog_restart:
            with Hog(1):
                loaded = restart_watch(decode, procs["decode"], router, args.model, args.work, "-r2")
            procs["decode"] = loaded.pop("proc")
            result["decode_restart_with_hog"] = loaded
        result["kv_after_restarts"] = {"delta": None}
        before = kv_external(procs["decode"].url)
        status, body, wall = complete(router.url, prompt=prompt, max_tokens=16)
        result["kv_after_restarts"] = {"status": status, "delta": kv_external(procs["decode"].url) - before}
    finally:
        for p in LIVE:
            p.stop()
        result["logs"] = {n: str(p.log) for n, p in procs.items()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k not in ("startup_timeline", "metric_types_decode",
                                                                         "router_metric_types")}, indent=1,
                         default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
