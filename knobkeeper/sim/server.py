"""The SIMULATED engine's HTTP server: SGLang's worker API, served by a timing model, not a GPU.

Server library: aiohttp. It is already a dependency (the load generator uses it too), its HTTP
parser is in C (llhttp), a handler is a plain coroutine with no validation layer, and a streamed
response is a `StreamResponse` whose `write()` goes straight to the transport. On 2 cores at
concurrency 96 the per-token cost is what matters: FastAPI/uvicorn would add pydantic models,
Starlette middleware and an async-generator hop per chunk, and uvloop is not installed. One process,
one event loop, no threads.

Engine: one asyncio task per process runs the scheduler (`Engine.run`), like SGLang's scheduler loop:
each iteration either runs one prefill batch (waiting prompts, up to --chunked-prefill-size tokens) or
one decode step for the whole running batch; it sleeps the modelled step time until an absolute
deadline (so timer overshoot does not accumulate), then gives every running request one token. The
CPU cost is one timer per step plus one task wake-up per streamed chunk.

Disaggregation (as SGLang PD): the router POSTs the same request to a prefill and a decode worker
with bootstrap_host/bootstrap_port/bootstrap_room added. The prefill worker prefills it (first token)
and marks the room done on its bootstrap server (--bootstrap-port). The decode worker long-polls that
bootstrap server, `GET http://bootstrap_host:bootstrap_port/room/<room>?wait=<s>`, answered
`{"room": R, "done": true, "prefill_done_at": unix_s, "prompt_tokens": N}` as soon as the room is
done (or `{"done": false}` after `wait` seconds); it then pays the KV-transfer time, emits the first
token and decodes the rest. If the room is not done within SGLANG_DISAGGREGATION_WAITING_TIMEOUT
seconds (wall clock, not scaled) the decode request fails with HTTP 500 and a message naming the room.
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
import uuid
from dataclasses import dataclass, field, asdict
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from .model import EffectsTable, PerfModel, knobs_from_env, load_effects

log = logging.getLogger("knobkeeper.sim")

SIM_VERSION = "0.1.0"
ROOM_LOG_SIZE = 2000

# Deterministic filler output: token i is WORDS[i % len(WORDS)] with a leading space. Plain ASCII
# letters, so they go into JSON strings without escaping.
WORDS = (
    "the quick brown fox jumps over a lazy dog while simulated engines keep their knobs in git and "
    "every change carries evidence so that reverts can be audited and lost throughput reclaimed by "
    "one command with prefill decode router and sim playing the parts of a real serving stack today"
).split()
_TOK = tuple(" " + w for w in WORDS)
_NW = len(_TOK)
_CYCLE = "".join(_TOK)
_OFF = [0]
for _t in _TOK:
    _OFF.append(_OFF[-1] + len(_t))


def filler_text(start: int, end: int) -> str:
    """Text of output tokens [start, end)."""
    if end <= start:
        return ""
    if end - start == 1:
        return _TOK[start % _NW]
    a, b = start % _NW, end - start
    head = _CYCLE[_OFF[a]:]
    if b <= _NW - a:
        return _CYCLE[_OFF[a]:_OFF[a + b]]
    b -= _NW - a
    return head + _CYCLE * (b // _NW) + _CYCLE[:_OFF[b % _NW]]


def approx_tokens(text: str) -> int:
    """Prompt-token approximation: one token per 4 characters (at least 1)."""
    return max(1, (len(text) + 3) // 4)


@dataclass
class SimConfig:
    role: str = "decode"
    host: str = "127.0.0.1"
    port: int = 30000
    bootstrap_port: int = 8998
    served_model_name: str = "knobkeeper-sim"
    time_scale: float = 1.0
    seed: int | None = None
    run_noise: float = 0.02
    step_jitter: float = 0.05
    startup_delay: float = 0.0
    never_healthy: bool = False
    fail_requests: int = 0
    hang_after: int = -1
    crash_after: int = -1
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    context_length: int = 32768
    stream_interval: int = 1
    incremental_streaming_output: bool = False
    eos_after: int = 0
    effects: list[str] = field(default_factory=list)
    access_log: bool = False
    log_level: str = "info"


class SimError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


def error_response(status: int, message: str, type_: str) -> web.Response:
    body = {"error": {"message": message, "type": type_, "code": status}, "object": "error",
            "message": message, "code": status}
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


class Req:
    __slots__ = ("rid", "prompt_tokens", "target", "generated", "finished", "finish_reason", "waiter",
                 "done", "cancelled", "prefill_only", "room", "t")

    def __init__(self, rid: str, prompt_tokens: int, target: int, finish_reason: str, loop):
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.target = target
        self.finish_reason = finish_reason
        self.generated = 0
        self.finished = False
        self.cancelled = False
        self.prefill_only = False
        self.room: int | None = None
        self.waiter: asyncio.Future | None = None
        self.done: asyncio.Future = loop.create_future()
        self.t: dict[str, float] = {"received_at": time.time()}

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class Engine:
    """Continuous-batching scheduler loop driven by the performance model."""

    def __init__(self, model: PerfModel, cfg: SimConfig, rng: random.Random, run_factor: float):
        self.model = model
        self.cfg = cfg
        self.rng = rng
        self.scale_s = cfg.time_scale * run_factor / 1000.0  # model ms -> wall s
        self.jitter = max(0.0, min(0.9, cfg.step_jitter))
        self.waiting_prefill: collections.deque[Req] = collections.deque()
        self.waiting_decode: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self._wake = asyncio.Event()
        self.decode_steps = 0
        self.prefill_steps = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.busy_s = 0.0

    def submit_prefill(self, req: Req) -> None:
        self.waiting_prefill.append(req)
        self._wake.set()

    def submit_decode(self, req: Req) -> None:
        self.waiting_decode.append(req)
        self._wake.set()

    def join_decode(self, req: Req) -> None:
        """Decode side of PD: the KV cache arrived with the first token; decode the rest."""
        self._first_token(req)
        self._wake.set()

    def _finish(self, req: Req) -> None:
        req.finished = True
        req.t["finished_at"] = time.time()
        req.wake()
        if not req.done.done():
            req.done.set_result(None)

    def _first_token(self, req: Req) -> None:
        req.generated = 1
        self.generated_tokens += 1
        req.t["first_token_at"] = time.time()
        if req.generated >= req.target or req.prefill_only:
            self._finish(req)
        else:
            req.wake()
            self.waiting_decode.append(req)

    def _jit(self) -> float:
        j = self.jitter
        return 1.0 + (2.0 * self.rng.random() - 1.0) * j if j else 1.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        sleep = asyncio.sleep
        while True:
            if not (self.waiting_prefill or self.waiting_decode or self.running):
                self._wake.clear()
                await self._wake.wait()
                deadline = None
            now = loop.time()
            if deadline is None or deadline < now - 0.05:
                deadline = now  # idle, or the CPU fell behind: do not try to catch up
            if self.waiting_prefill:
                batch: list[Req] = []
                tokens = 0
                while self.waiting_prefill:
                    r = self.waiting_prefill[0]
                    if batch and tokens + r.prompt_tokens > self.cfg.chunked_prefill_size:
                        break
                    self.waiting_prefill.popleft()
                    if r.cancelled:
                        continue
                    batch.append(r)
                    tokens += r.prompt_tokens
                if not batch:
                    continue
                dt = self.model.prefill_step_ms(tokens) * self._jit() * self.scale_s
                deadline += dt
                self.busy_s += dt
                await sleep(deadline - loop.time())
                self.prefill_steps += 1
                self.prompt_tokens += tokens
                for r in batch:
                    if not r.cancelled:
                        self._first_token(r)
                continue
            running = self.running
            if self.waiting_decode:
                cap = self.cfg.max_running_requests
                while self.waiting_decode and len(running) < cap:
                    r = self.waiting_decode.popleft()
                    if not r.cancelled:
                        running.append(r)
            if not running:
                continue
            dt = self.model.decode_step_ms(len(running)) * self._jit() * self.scale_s
            deadline += dt
            self.busy_s += dt
            await sleep(deadline - loop.time())
            self.decode_steps += 1
            keep = []
            n = 0
            for r in running:
                if r.cancelled:
                    continue
                r.generated += 1
                n += 1
                if r.generated >= r.target:
                    self._finish(r)
                else:
                    r.wake()
                    keep.append(r)
            self.generated_tokens += n
            self.running = keep


class Bootstrap:
    """Prefill side: which rooms are done. Served on --bootstrap-port."""

    def __init__(self, ttl_s: float):
        self.rooms: dict[int, list] = {}  # room -> [future, created_monotonic]
        self.ttl_s = ttl_s

    def _entry(self, room: int) -> list:
        e = self.rooms.get(room)
        if e is None:
            e = self.rooms[room] = [asyncio.get_running_loop().create_future(), time.monotonic()]
        return e

    def complete(self, room: int, info: dict) -> None:
        fut = self._entry(room)[0]
        if not fut.done():
            fut.set_result(info)

    async def handle_room(self, request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
            wait = min(60.0, max(0.0, float(request.query.get("wait", "10"))))
        except ValueError:
            return error_response(400, "room must be an integer and wait a number of seconds", "BadRequestError")
        fut = self._entry(room)[0]
        if not fut.done():
            try:
                await asyncio.wait_for(asyncio.shield(fut), wait)
            except asyncio.TimeoutError:
                return web.json_response({"room": room, "done": False})
        self.rooms.pop(room, None)
        return web.json_response({"room": room, "done": True, **fut.result()})

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(30)
            cutoff = time.monotonic() - self.ttl_s
            for room in [r for r, e in self.rooms.items() if e[1] < cutoff]:
                self.rooms.pop(room, None)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/room/{room}", self.handle_room)
        app.router.add_get("/health", lambda r: web.json_response({"status": "ok", "rooms": len(self.rooms)}))
        return app


def _env_float(env: dict, name: str, default: float) -> float:
    try:
        return float(env.get(name, "") or default)
    except ValueError:
        raise SystemExit(f"knobkeeper.sim: {name}={env[name]!r} is not a number of seconds") from None


class SimServer:
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
        self.ready_at = self.started_at + max(0.0, cfg.startup_delay)
        self.engine: Engine | None = None
        self.bootstrap = Bootstrap(ttl_s=max(600.0, 2 * self.waiting_timeout)) if cfg.role == "prefill" else None
        self.rooms: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self.counts = collections.Counter()
        self.req_seq = 0
        self.waiting_bootstrap = 0
        self.session: ClientSession | None = None
        self.model_json = json.dumps(cfg.served_model_name)

    # ---------- info ----------
    def healthy(self) -> bool:
        return not self.cfg.never_healthy and time.time() >= self.ready_at

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
            "ready_at": self.ready_at,
            "knobs": self.knobs,
            "effects": [{"knob": k, "value": v, "case": case} for k, v, case in self.model.active],
            "effects_files": list(self.table.sources),
            "model": asdict(self.table.params),
            "sim": {
                "time_scale": c.time_scale, "seed": c.seed, "run_noise": c.run_noise,
                "run_factor": self.run_factor, "step_jitter": c.step_jitter,
                "waiting_timeout_s": self.waiting_timeout, "eos_after": c.eos_after,
                "faults": {"startup_delay": c.startup_delay, "never_healthy": c.never_healthy,
                           "fail_requests": c.fail_requests, "hang_after": c.hang_after,
                           "crash_after": c.crash_after},
            },
            "stats": {
                "requests": dict(self.counts),
                "decode_steps": e.decode_steps if e else 0,
                "prefill_steps": e.prefill_steps if e else 0,
                "generated_tokens": e.generated_tokens if e else 0,
                "prompt_tokens": e.prompt_tokens if e else 0,
            },
        }

    async def h_health(self, request: web.Request) -> web.Response:
        if self.cfg.never_healthy:
            return web.json_response({"status": "unhealthy", "reason": "--never-healthy"}, status=503)
        if not self.healthy():
            return web.json_response({"status": "loading", "ready_in_s": round(self.ready_at - time.time(), 3)},
                                     status=503)
        return web.Response(text="")

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

    def _load(self) -> tuple[int, int, int]:
        e = self.engine
        running = len(e.running)
        waiting = len(e.waiting_prefill) + len(e.waiting_decode) + self.waiting_bootstrap
        tokens = sum(r.prompt_tokens + r.generated for r in e.running)
        return running, waiting, tokens

    async def h_get_load(self, request: web.Request) -> web.Response:
        running, waiting, tokens = self._load()
        return web.json_response([{"dp_rank": 0, "num_reqs": running + waiting,
                                   "num_waiting_reqs": waiting, "num_tokens": tokens}])

    async def h_metrics(self, request: web.Request) -> web.Response:
        running, waiting, tokens = self._load()
        e = self.engine
        lbl = f'model_name="{_prom_escape(self.cfg.served_model_name)}"'
        lines = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{{{labels}}} {value}")

        metric("sglang:num_running_reqs", "gauge", "Running decode requests.", [(lbl, running)])
        metric("sglang:num_queue_reqs", "gauge", "Waiting requests (prefill, decode admission, KV).",
               [(lbl, waiting)])
        metric("sglang:num_used_tokens", "gauge", "Tokens held by running requests.", [(lbl, tokens)])
        metric("sglang:prompt_tokens_total", "counter", "Prefilled prompt tokens.", [(lbl, e.prompt_tokens)])
        metric("sglang:generation_tokens_total", "counter", "Generated tokens.", [(lbl, e.generated_tokens)])
        metric("sglang:num_requests_total", "counter", "Finished generation requests.",
               [(lbl, self.counts.get("ok", 0))])
        metric("sim_requests_total", "counter", "Generation requests by outcome.",
               [(f'{lbl},outcome="{k}"', v) for k, v in sorted(self.counts.items())] or [(f'{lbl},outcome="ok"', 0)])
        metric("sim_decode_steps_total", "counter", "Decode steps run.", [(lbl, e.decode_steps)])
        metric("sim_prefill_steps_total", "counter", "Prefill steps run.", [(lbl, e.prefill_steps)])
        metric("sim_busy_seconds_total", "counter", "Modelled engine busy time (scaled).", [(lbl, round(e.busy_s, 6))])
        metric("sim_knob", "gauge", "Knob values read from the environment at start-up (1 = set, 0 = unset).",
               [(f'name="{_prom_escape(k)}",value="{_prom_escape(v or "")}"', 1 if v is not None else 0)
                for k, v in self.knobs.items()])
        metric("sim_info", "gauge", "Simulated engine (not a GPU).",
               [(f'{lbl},role="{self.cfg.role}",version="{SIM_VERSION}",seed="{self.cfg.seed}",'
                 f'time_scale="{self.cfg.time_scale}"', 1)])
        metric("sim_run_factor", "gauge", "Per-process multiplicative noise on step times.", [(lbl, self.run_factor)])
        metric("sim_started_at_seconds", "gauge", "Process start (unix time).", [(lbl, self.started_at)])
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def h_debug_rooms(self, request: web.Request) -> web.Response:
        rooms = list(self.rooms.values())
        q = request.query.get("room")
        if q is not None:
            rooms = [r for r in rooms if str(r["room"]) == q]
        return web.json_response({"role": self.cfg.role, "rooms": rooms})

    async def h_ok(self, request: web.Request) -> web.Response:
        return web.json_response({"success": True})

    # ---------- generation ----------
    def _parse(self, kind: str, body: dict) -> dict:
        if not isinstance(body, dict):
            raise SimError(400, "request body must be a JSON object")
        p: dict[str, Any] = {"stream": bool(body.get("stream", False))}
        if kind == "generate":
            sp = body.get("sampling_params") or {}
            if not isinstance(sp, dict):
                raise SimError(400, "sampling_params must be an object")
            text, ids = body.get("text"), body.get("input_ids")
            if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
                raise SimError(400, "batched /generate (a list of prompts) is not supported by the sim")
            if isinstance(text, str):
                p["prompt_tokens"] = approx_tokens(text)
            elif isinstance(ids, list):
                p["prompt_tokens"] = max(1, len(ids))
            else:
                raise SimError(400, "/generate needs 'text' (a string) or 'input_ids' (a list of ints)")
            p["max_new"] = sp.get("max_new_tokens", 128)
            p["ignore_eos"] = bool(sp.get("ignore_eos", False))
            p["include_usage"] = False
        else:
            if kind == "chat":
                msgs = body.get("messages")
                if not isinstance(msgs, list) or not msgs:
                    raise SimError(400, "'messages' must be a non-empty list")
                n = 0
                for m in msgs:
                    content = m.get("content") if isinstance(m, dict) else None
                    if isinstance(content, list):
                        content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
                    n += approx_tokens(content or "") + 4  # + chat-template overhead per message
                p["prompt_tokens"] = n
                p["max_new"] = body.get("max_completion_tokens", body.get("max_tokens")) or 128
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                    prompt = prompt[0]
                if isinstance(prompt, str):
                    p["prompt_tokens"] = approx_tokens(prompt)
                elif isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
                    p["prompt_tokens"] = max(1, len(prompt))
                else:
                    raise SimError(400, "'prompt' must be a string or a list of token ids (batches are not supported by the sim)")
                p["max_new"] = body.get("max_tokens")
                if p["max_new"] is None:
                    p["max_new"] = 16  # OpenAI's default for completions
            p["ignore_eos"] = bool(body.get("ignore_eos", False))
            so = body.get("stream_options") or {}
            p["include_usage"] = bool(isinstance(so, dict) and so.get("include_usage"))
        try:
            p["max_new"] = int(p["max_new"])
        except (TypeError, ValueError):
            raise SimError(400, f"max tokens must be an integer, got {p['max_new']!r}") from None
        if p["max_new"] < 1:
            raise SimError(400, f"max tokens must be >= 1, got {p['max_new']}")
        if p["prompt_tokens"] + p["max_new"] > self.cfg.context_length:
            raise SimError(400, f"prompt ({p['prompt_tokens']} tokens) + max tokens ({p['max_new']}) exceeds "
                                f"the context length {self.cfg.context_length}")
        room = body.get("bootstrap_room")
        if room is not None:
            try:
                p["room"] = int(room)
                p["bootstrap"] = (str(body.get("bootstrap_host") or "127.0.0.1"), int(body["bootstrap_port"]))
            except (KeyError, TypeError, ValueError):
                raise SimError(400, "bootstrap_room needs bootstrap_host and an integer bootstrap_port") from None
        p["rid"] = str(body.get("rid") or uuid.uuid4().hex)
        return p

    def _record_room(self, room: int, data: dict) -> None:
        rec = self.rooms.get(room)
        if rec is None:
            rec = self.rooms[room] = {"room": room, "role": self.cfg.role}
            if len(self.rooms) > ROOM_LOG_SIZE:
                self.rooms.popitem(last=False)
        rec.update(data)

    async def _wait_prefill(self, req: Req, host: str, port: int) -> dict:
        """Decode side: long-poll the prefill worker's bootstrap server until the room is done."""
        room = req.room
        deadline = time.monotonic() + self.waiting_timeout
        url = f"http://{host}:{port}/room/{room}"
        last = "no answer yet"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SimError(
                    500,
                    f"sim decode: KV cache for bootstrap_room {room} was not ready: the prefill worker at "
                    f"bootstrap {host}:{port} did not finish the room within "
                    f"SGLANG_DISAGGREGATION_WAITING_TIMEOUT={self.waiting_timeout:g}s (last: {last})",
                    "DisaggregationTimeoutError")
            wait = min(left, 10.0)
            try:
                async with self.session.get(url, params={"wait": f"{wait:.3f}"},
                                            timeout=ClientTimeout(total=wait + 5)) as resp:
                    if resp.status == 200:
                        data = await resp.json()
                        if data.get("done"):
                            return data
                        last = "room not done"
                        continue
                    last = f"bootstrap answered HTTP {resp.status}"
            except (OSError, asyncio.TimeoutError) as exc:
                last = f"bootstrap unreachable: {type(exc).__name__}: {exc}"
            except Exception as exc:  # aiohttp.ClientError and friends
                last = f"bootstrap error: {type(exc).__name__}: {exc}"
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _fault_gate(self) -> str | None:
        """Apply injected faults to one generation request; returns 'fail', 'hang' or None."""
        c = self.cfg
        self.req_seq += 1
        n = self.req_seq
        if n <= c.fail_requests:
            return "fail"
        if c.hang_after >= 0 and n > c.hang_after:
            return "hang"
        return None

    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "generate")

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        if not self.healthy():
            self.counts["unavailable"] += 1
            return error_response(503, "sim engine is not ready (loading)", "ServiceUnavailableError")
        try:
            body = json.loads(await request.read() or b"null")
        except (ValueError, UnicodeDecodeError):
            self.counts["bad_request"] += 1
            return error_response(400, "request body is not valid JSON", "BadRequestError")
        try:
            p = self._parse(kind, body)
        except SimError as exc:
            self.counts["bad_request"] += 1
            return error_response(exc.status, exc.message, exc.type)
        fault = self._fault_gate()
        if fault == "fail":
            self.counts["injected_failure"] += 1
            return error_response(500, f"sim fault injection: request {self.req_seq} of the first "
                                       f"{self.cfg.fail_requests} fails (--fail-requests)", "InternalServerError")
        if fault == "hang":
            self.counts["hung"] += 1
            await asyncio.get_running_loop().create_future()  # until the client goes away
        loop = asyncio.get_running_loop()
        max_new = p["max_new"]
        target, reason = max_new, "length"
        if not p["ignore_eos"] and 0 < self.cfg.eos_after < max_new:
            target, reason = self.cfg.eos_after, "stop"
        req = Req(p["rid"], p["prompt_tokens"], target, reason, loop)
        eng = self.engine
        boot = p.get("bootstrap")
        try:
            if boot is not None and self.cfg.role == "prefill":
                req.room = p["room"]
                req.prefill_only = True
                req.target = 1
                self._record_room(req.room, {"received_at": req.t["received_at"], "prompt_tokens": req.prompt_tokens})
                eng.submit_prefill(req)
                await req.done
                done_at = req.t["first_token_at"]
                self._record_room(req.room, {"prefill_done_at": done_at})
                self.bootstrap.complete(req.room, {"prefill_done_at": done_at, "prompt_tokens": req.prompt_tokens})
            elif boot is not None:
                req.room = p["room"]
                self._record_room(req.room, {"received_at": req.t["received_at"],
                                             "bootstrap": f"{boot[0]}:{boot[1]}"})
                self.waiting_bootstrap += 1
                try:
                    info = await self._wait_prefill(req, *boot)
                finally:
                    self.waiting_bootstrap -= 1
                req.t["prefill_done_at"] = info.get("prefill_done_at")
                req.t["kv_wait_done_at"] = time.time()
                await asyncio.sleep(self.model.kv_transfer_ms(req.prompt_tokens) * eng.scale_s)
                req.t["kv_ready_at"] = time.time()
                eng.join_decode(req)
            else:
                eng.submit_prefill(req)
            if p["stream"]:
                resp = await self._stream(request, kind, req, p)
            else:
                await req.done
                resp = self._complete(kind, req, p)
        except SimError as exc:
            self.counts["error"] += 1
            if req.room is not None:
                self._record_room(req.room, {"error": exc.message, "failed_at": time.time()})
            return error_response(exc.status, exc.message, exc.type)
        except (asyncio.CancelledError, ConnectionError):
            self.counts["client_gone"] += 1
            raise
        finally:
            if not req.finished:
                req.cancelled = True
        self.counts["ok"] += 1
        if req.room is not None and not req.prefill_only:
            self._record_room(req.room, {k: req.t.get(k) for k in
                                         ("prefill_done_at", "kv_ready_at", "first_token_at", "finished_at")})
        c = self.cfg
        if c.crash_after >= 0 and self.counts["ok"] >= c.crash_after:
            log.error("sim fault injection: crashing after %d requests (--crash-after)", self.counts["ok"])
            loop.call_later(0.05, os._exit, 70)
        return resp

    def _usage(self, req: Req) -> dict:
        return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.generated,
                "total_tokens": req.prompt_tokens + req.generated}

    def _meta(self, req: Req, finished: bool) -> dict:
        fr = None
        if finished:
            fr = {"type": "length", "length": req.generated} if req.finish_reason == "length" \
                else {"type": "stop", "matched": "<eos>"}
        m = {"id": req.rid, "finish_reason": fr, "prompt_tokens": req.prompt_tokens,
             "completion_tokens": req.generated, "cached_tokens": 0}
        if finished:
            m["e2e_latency"] = req.t.get("finished_at", time.time()) - req.t["received_at"]
            m["sim"] = {"role": self.cfg.role, "bootstrap_room": req.room, **req.t}
        return m

    def _complete(self, kind: str, req: Req, p: dict) -> web.Response:
        text = filler_text(0, req.generated)
        if kind == "generate":
            out = {"text": text, "meta_info": self._meta(req, True)}
        elif kind == "chat":
            out = {"id": f"chatcmpl-{req.rid}", "object": "chat.completion", "created": int(time.time()),
                   "model": self.cfg.served_model_name,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": req.finish_reason}],
                   "usage": self._usage(req)}
        else:
            out = {"id": f"cmpl-{req.rid}", "object": "text_completion", "created": int(time.time()),
                   "model": self.cfg.served_model_name,
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason}],
                   "usage": self._usage(req)}
        return web.Response(body=json.dumps(out).encode(), content_type="application/json")

    async def _stream(self, request: web.Request, kind: str, req: Req, p: dict) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        interval = max(1, self.cfg.stream_interval)
        created = int(time.time())
        rid_json = json.dumps(req.rid)
        if kind == "chat":
            head = (f'data: {{"id":"chatcmpl-{rid_json[1:-1]}","object":"chat.completion.chunk",'
                    f'"created":{created},"model":{self.model_json},"choices":[{{"index":0,')
            await resp.write((head + '"delta":{"role":"assistant","content":""},"logprobs":null,'
                                     '"finish_reason":null}]}\n\n').encode())
        elif kind == "completions":
            head = (f'data: {{"id":"cmpl-{rid_json[1:-1]}","object":"text_completion",'
                    f'"created":{created},"model":{self.model_json},"choices":[{{"index":0,')
        else:
            head = ""
        cumulative = kind == "generate" and not self.cfg.incremental_streaming_output
        sent = 0
        while True:
            n = req.generated
            if not req.finished and n - sent < interval:
                req.waiter = loop.create_future()
                await req.waiter
                continue
            if n > sent or req.finished:
                fin = req.finished and n == req.generated
                if kind == "generate":
                    text = filler_text(0, n) if cumulative else filler_text(sent, n)
                    chunk = "data: " + json.dumps({"text": text, "meta_info": self._meta(req, fin)}) + "\n\n"
                elif kind == "chat":
                    chunk = ""
                    if n > sent:
                        chunk = (head + '"delta":{"content":"' + filler_text(sent, n) +
                                 '"},"logprobs":null,"finish_reason":null}]}\n\n')
                    if fin:
                        chunk += head + f'"delta":{{}},"logprobs":null,"finish_reason":"{req.finish_reason}"}}]}}\n\n'
                else:
                    fr = f'"{req.finish_reason}"' if fin else "null"
                    chunk = head + '"text":"' + filler_text(sent, n) + f'","logprobs":null,"finish_reason":{fr}}}]}}\n\n'
                sent = n
                await resp.write(chunk.encode())
                if fin:
                    break
        tail = ""
        if p["include_usage"] and kind != "generate":
            tail = head.split('"choices"')[0] + '"choices":[],"usage":' + json.dumps(self._usage(req)) + "}\n\n"
        await resp.write((tail + "data: [DONE]\n\n").encode())
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


def _prom_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


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
