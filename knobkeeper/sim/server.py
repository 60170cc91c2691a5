"""The SIMULATED engine's HTTP server: SGLang's worker API, served by a timing model, not a GPU.

The server is the routes and the glue: a request is parsed by `protocol` (three dialects), passes the
fault gate (`faults`), goes through the PD bootstrap when it carries bootstrap fields (`bootstrap`),
is scheduled by the engine (`engine`, the scheduler loop on a virtual clock), and is answered in its
dialect's shape (`protocol`); /metrics is `metrics` (prometheus-client, the engine's real names).

Server library: aiohttp. It is already a dependency (the load generator uses it too), its HTTP
parser is in C (llhttp), a handler is a plain coroutine with no validation layer, and a streamed
response is a `StreamResponse` whose `write()` goes straight to the transport. On 2 cores at
concurrency 96 the per-token cost is what matters: FastAPI/uvicorn would add pydantic models,
Starlette middleware and an async-generator hop per chunk, and uvloop is not installed. One process,
one event loop, no threads.

A request without bootstrap fields is served whole (prefill then decode) by the worker it reaches.
Timestamps (unix seconds) of each room are kept for the last 2,000 rooms at GET /debug/rooms and,
for /generate, in meta_info["sim"].
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import random
import signal
import sys
import time
from dataclasses import asdict

from aiohttp import ClientSession, TCPConnector, web

from .bootstrap import Bootstrap, RoomLog, wait_prefill
from .config import SimConfig
from .engine import Engine, Req
from .faults import Faults
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, Metrics
from .model import EffectsTable, PerfModel, knobs_from_env, load_effects
from .protocol import GenRequest, SimError, Stream, complete_body, error_body, filler_text, parse

# Names other modules and tests import from here.
__all__ = ["Engine", "Req", "SimConfig", "SimServer", "filler_text", "run", "serve"]

log = logging.getLogger("knobkeeper.sim")

SIM_VERSION = "0.1.0"


def error_response(status: int, message: str, type_: str) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, type_), content_type="application/json")


def _env_float(env: dict, name: str, default: float) -> float:
    try:
        return float(env.get(name, "") or default)
    except ValueError:
        raise SystemExit(f"knobkeeper.sim: {name}={env[name]!r} is not a number of seconds") from None


class SimServer:
    version = SIM_VERSION

    def __init__(self, cfg: SimConfig, table: EffectsTable | None = None, env: dict | None = None):
        self.cfg = cfg
        env = dict(os.environ if env is None else env)
        self.table = table or load_effects(cfg.effects)
        self.knobs = knobs_from_env(env, self.table)
        self.model = PerfModel(self.table, self.knobs)
        if cfg.seed is None:
            cfg.seed = int.from_bytes(os.urandom(4), "big")
        self.rng = random.Random(cfg.seed)
        noise = max(0.0, cfg.run_noise)
        self.run_factor = min(1.2, max(0.8, self.rng.gauss(1.0, noise))) if noise else 1.0
        self.waiting_timeout = _env_float(env, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0)
        self.started_at = time.time()
        self.faults = Faults(cfg, self.started_at, self.model.fail_fraction)
        self.engine: Engine | None = None
        self.bootstrap = Bootstrap(ttl_s=max(600.0, 2 * self.waiting_timeout)) if cfg.role == "prefill" else None
        self.rooms = RoomLog(cfg.role)
        self.counts = collections.Counter()
        self.waiting_bootstrap = 0
        self.session: ClientSession | None = None
        self.model_json = json.dumps(cfg.served_model_name)
        self.metrics = Metrics(self)

    # ---------- info ----------
    def server_info(self) -> dict:
        c = self.cfg
        e = self.engine
        return {
            # SGLang-shaped fields (never model_path/tokenizer_path: the router would fetch a tokenizer)
            "served_model_name": c.served_model_name,
            "disaggregation_mode": c.role,
            "disaggregation_bootstrap_port": c.bootstrap_port if c.role == "prefill" else None,
            "host": c.host,
            "port": c.port,
            "tp_size": 1,
            "dp_size": 1,
            "max_running_requests": c.max_running_requests,
            "chunked_prefill_size": c.chunked_prefill_size,
            "context_length": c.context_length,
            "stream_interval": c.stream_interval,
            "incremental_streaming_output": c.incremental_streaming_output,
            "version": f"knobkeeper-sim {SIM_VERSION}",
            # sim-specific
            "simulated": True,
            "role": c.role,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "ready_at": self.faults.ready_at,
            "knobs": self.knobs,
            "effects": [{"knob": k, "value": v, "case": case} for k, v, case in self.model.active],
            "effects_files": list(self.table.sources),
            "model": asdict(self.table.params),
            "sim": {
                "time_scale": c.time_scale, "seed": c.seed, "run_noise": c.run_noise,
                "run_factor": self.run_factor, "step_jitter": c.step_jitter,
                "waiting_timeout_s": self.waiting_timeout, "eos_after": c.eos_after,
                "faults": self.faults.settings(),
            },
            "stats": {
                "requests": dict(self.counts),
                "decode_steps": e.decode_steps if e else 0,
                "prefill_steps": e.prefill_steps if e else 0,
                "generated_tokens": e.generated_tokens if e else 0,
                "prompt_tokens": e.prompt_tokens if e else 0,
                "dropped_lag_s": e.dropped_lag_s if e else 0.0,
            },
        }

    def load(self) -> tuple[int, int, int]:
        """(running, waiting, tokens held by running requests)."""
        e = self.engine
        running = len(e.running)
        waiting = len(e.waiting_prefill) + len(e.waiting_decode) + self.waiting_bootstrap
        tokens = sum(r.prompt_tokens + r.generated for r in e.running)
        return running, waiting, tokens

    async def h_health(self, request: web.Request) -> web.Response:
        status, body = self.faults.health()
        return web.Response(text="") if body is None else web.json_response(body, status=status)

    async def h_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info())

    async def h_model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "served_model_name": self.cfg.served_model_name, "is_generation": True,
            "model_type": "knobkeeper-sim", "architectures": ["SimulatedForCausalLM"],
            "context_length": self.cfg.context_length, "simulated": True,
        })

    async def h_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.cfg.served_model_name, "object": "model", "created": int(self.started_at),
            "owned_by": "knobkeeper-sim", "root": self.cfg.served_model_name,
            "max_model_len": self.cfg.context_length}]})

    async def h_get_load(self, request: web.Request) -> web.Response:
        running, waiting, tokens = self.load()
        return web.json_response([{"dp_rank": 0, "num_reqs": running + waiting,
                                   "num_waiting_reqs": waiting, "num_tokens": tokens}])

    async def h_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def h_debug_rooms(self, request: web.Request) -> web.Response:
        return web.json_response({"role": self.cfg.role, "rooms": self.rooms.select(request.query.get("room"))})

    async def h_ok(self, request: web.Request) -> web.Response:
        return web.json_response({"success": True})

    # ---------- generation ----------
    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "generate")

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        if not self.faults.healthy():
            self.counts["unavailable"] += 1
            return error_response(503, "sim engine is not ready (loading)", "ServiceUnavailableError")
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, UnicodeDecodeError):
            self.counts["bad_request"] += 1
            return error_response(400, "request body is not valid JSON", "BadRequestError")
        try:
            p = parse(kind, body, self.cfg.context_length)
        except SimError as exc:
            self.counts["bad_request"] += 1
            return error_response(exc.status, exc.message, exc.type)
        fault = self.faults.gate()
        if fault == "fail":
            self.counts["injected_failure"] += 1
            self.metrics.aborted_one()  # as the engine counts a request it failed
            return error_response(500, self.faults.failure_message(), "InternalServerError")
        if fault == "hang":
            self.counts["hung"] += 1
            await asyncio.get_running_loop().create_future()  # until the client goes away
        loop = asyncio.get_running_loop()
        target, reason = p.max_new, "length"
        if not p.ignore_eos and 0 < self.cfg.eos_after < p.max_new:
            target, reason = self.cfg.eos_after, "stop"
        req = Req(p.rid, p.prompt_tokens, target, reason, loop)
        try:
            await self._schedule(req, p)
            if p.stream:
                resp = await self._stream(request, req, p)
            else:
                await req.done
                resp = web.Response(body=complete_body(kind, req, self.cfg.served_model_name, self.cfg.role),
                                    content_type="application/json")
        except SimError as exc:
            self.counts["error"] += 1
            if req.room is not None:
                self.rooms.record(req.room, {"error": exc.message, "failed_at": time.time()})
            return error_response(exc.status, exc.message, exc.type)
        except (asyncio.CancelledError, ConnectionError):
            self.counts["client_gone"] += 1
            self.metrics.aborted_one()
            raise
        finally:
            if not req.finished:
                req.cancelled = True
        self.counts["ok"] += 1
        self.metrics.finished(req, p.stream)
        if req.room is not None and not req.prefill_only:
            self.rooms.record(req.room, {k: req.t.get(k) for k in
                                         ("prefill_done_at", "kv_ready_at", "first_token_at", "finished_at")})
        if self.faults.crash_due(self.counts["ok"]):
            log.error("sim fault injection: crashing after %d requests (--crash-after)", self.counts["ok"])
            loop.call_later(0.05, self.faults.crash)
        return resp

    async def _schedule(self, req: Req, p: GenRequest) -> None:
        """Hand the request to the engine: prefill only (PD prefill), after its room's KV arrived (PD
        decode), or whole."""
        eng, boot = self.engine, p.bootstrap
        if boot is not None and self.cfg.role == "prefill":
            req.room = p.room
            req.prefill_only = True
            req.target = 1
            self.rooms.record(req.room, {"received_at": req.t["received_at"], "prompt_tokens": req.prompt_tokens})
            eng.submit_prefill(req)
            await req.done
            done_at = req.t["first_token_at"]
            self.rooms.record(req.room, {"prefill_done_at": done_at})
            self.bootstrap.complete(req.room, {"prefill_done_at": done_at, "prompt_tokens": req.prompt_tokens})
        elif boot is not None:
            req.room = p.room
            self.rooms.record(req.room, {"received_at": req.t["received_at"], "bootstrap": f"{boot[0]}:{boot[1]}"})
            self.waiting_bootstrap += 1
            try:
                info = await wait_prefill(self.session, req.room, *boot, self.waiting_timeout)
            finally:
                self.waiting_bootstrap -= 1
            req.t["prefill_done_at"] = info.get("prefill_done_at")
            req.t["kv_wait_done_at"] = time.time()
            await asyncio.sleep(self.model.kv_transfer_ms(req.prompt_tokens) * eng.scale_s)
            req.t["kv_ready_at"] = time.time()
            eng.join_decode(req)
        else:
            eng.submit_prefill(req)

    async def _stream(self, request: web.Request, req: Req, p: GenRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        interval = max(1, self.cfg.stream_interval)
        shape = Stream(p.kind, req, self.model_json, self.cfg.role, self.cfg.incremental_streaming_output)
        opening = shape.opening()
        if opening:
            await resp.write(opening.encode())
        sent = 0
        while True:
            n = req.generated
            if not req.finished and n - sent < interval:
                req.waiter = loop.create_future()
                await req.waiter
                continue
            if n > sent or req.finished:
                fin = req.finished and n == req.generated
                chunk = shape.chunk(sent, n, fin)
                sent = n
                await resp.write(chunk.encode())
                if fin:
                    break
        await resp.write(shape.closing(p.include_usage).encode())
        await resp.write_eof()
        return resp

    # ---------- app ----------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.h_health)
        r.add_get("/health_generate", self.h_health)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.h_server_info)
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self.h_model_info)
        r.add_get("/v1/models", self.h_models)
        r.add_get("/get_load", self.h_get_load)
        r.add_get("/metrics", self.h_metrics)
        r.add_get("/debug/rooms", self.h_debug_rooms)
        r.add_post("/generate", self.h_generate)
        r.add_post("/v1/chat/completions", self.h_chat)
        r.add_post("/v1/completions", self.h_completions)
        for path in ("/flush_cache", "/abort_request"):
            r.add_route("*", path, self.h_ok)
        return app


class _QuietBadMessage(logging.Filter):
    """The router probes workers for gRPC (an HTTP/2 preface, 'PRI * HTTP/2.0'); aiohttp logs it as a
    bad HTTP message with a traceback. It is harmless: keep one line, drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "PRI" in msg or "BadHttpMessage" in msg or "BadStatusLine" in msg or (
                record.exc_info and "BadHttpMessage" in repr(record.exc_info[1])):
            record.exc_info = None
            record.msg, record.args = "ignored a non-HTTP/1 probe (the router's gRPC check)", ()
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("aiohttp.server").isEnabledFor(logging.DEBUG)
        return True


async def serve(cfg: SimConfig, stop: asyncio.Event | None = None, ready: asyncio.Event | None = None,
                server: SimServer | None = None) -> None:
    """Run the sim until `stop` is set (or SIGTERM/SIGINT when run as the main program)."""
    srv = server or SimServer(cfg)
    loop = asyncio.get_running_loop()
    srv.engine = Engine(srv.model, cfg, srv.rng, srv.run_factor)
    srv.session = ClientSession(connector=TCPConnector(limit=0, ttl_dns_cache=300))
    tasks = [loop.create_task(srv.engine.run(), name="sim-engine")]
    logging.getLogger("aiohttp.server").addFilter(_QuietBadMessage())
    runners = []
    kw = {"handler_cancellation": True, "shutdown_timeout": 1.0}
    if not cfg.access_log:
        kw["access_log"] = None
    runner = web.AppRunner(srv.app(), **kw)
    await runner.setup()
    runners.append(runner)
    await web.TCPSite(runner, cfg.host, cfg.port, backlog=1024, reuse_address=True).start()
    if srv.bootstrap is not None:
        brunner = web.AppRunner(srv.bootstrap.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await brunner.setup()
        runners.append(brunner)
        await web.TCPSite(brunner, cfg.host, cfg.bootstrap_port, backlog=1024, reuse_address=True).start()
        tasks.append(loop.create_task(srv.bootstrap.sweep(), name="sim-bootstrap-sweep"))
    knobs_set = {k: v for k, v in srv.knobs.items() if v is not None}
    log.warning(
        "knobkeeper sim engine (SIMULATED, no GPU) pid=%d role=%s http://%s:%d%s model=%s time_scale=%g seed=%d "
        "run_factor=%.4f knobs=%s effects=%s",
        os.getpid(), cfg.role, cfg.host, cfg.port,
        f" bootstrap=:{cfg.bootstrap_port}" if srv.bootstrap else "", cfg.served_model_name, cfg.time_scale,
        cfg.seed, srv.run_factor, knobs_set, [f"{k}={v}:{c}" for k, v, c in srv.model.active])
    if ready is not None:
        ready.set()
    stop = stop or asyncio.Event()
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        try:
            await asyncio.wait_for(_cleanup(srv.session, runners), 3.0)
        except (asyncio.TimeoutError, Exception) as exc:  # exiting anyway
            log.debug("unclean shutdown: %r", exc)


async def _cleanup(session, runners) -> None:
    await session.close()
    for r in runners:
        await r.cleanup()


def run(cfg: SimConfig) -> None:
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await serve(cfg, stop)
        except OSError as exc:
            raise SystemExit(f"knobkeeper.sim: cannot listen: {exc}")

    asyncio.run(main())
