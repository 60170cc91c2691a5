"""The sim's scheduler loop: continuous batching driven by the performance model, on a virtual clock.

One asyncio task per process runs `Engine.run`, like SGLang's scheduler loop: each iteration either
runs one prefill batch (waiting prompts, up to --chunked-prefill-size tokens) or one decode step for
the whole running batch, then gives every request of it one token.

Time model: step k of a busy period ends at t0 + (the sum of the modelled times of steps 1..k), a
virtual clock; the loop sleeps until that instant, and when the event loop wakes it late (a timer
overshoot, a blocking call, a CPU hog descheduling the process) the next steps start at once until the
clock is caught up. The loop's lateness is never added to the model, so the throughput measured over
any window follows the model whenever the process gets the CPU its per-step work needs on average,
however unevenly it gets it. Only a lag above MAX_LAG_S is dropped: a process that far behind is
saturated (the model asks for more CPU than there is), and catching up would only turn it into a
burst. The clock restarts when the engine goes idle.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time

from .config import SimConfig
from .model import PerfModel

#: A lag of the event loop behind the virtual clock above this (seconds, wall) is saturation, dropped.
MAX_LAG_S = 1.0
#: Decode steps per gen_throughput sample (SGLang logs decode stats every 40 steps by default).
THROUGHPUT_INTERVAL_STEPS = 40


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
        self.dropped_lag_s = 0.0  # lateness given up (saturation beyond MAX_LAG_S)
        self.gen_throughput = 0.0  # tokens/s over the last THROUGHPUT_INTERVAL_STEPS decode steps
        self._tp_mark: tuple[float, int] | None = None

    def submit_prefill(self, req: Req) -> None:
        self.waiting_prefill.append(req)
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

    def _sample_throughput(self, now: float) -> None:
        mark = self._tp_mark
        if mark is None:
            self._tp_mark = (now, self.generated_tokens)
        elif self.decode_steps % THROUGHPUT_INTERVAL_STEPS == 0 and now > mark[0]:
            self.gen_throughput = (self.generated_tokens - mark[1]) / (now - mark[0])
            self._tp_mark = (now, self.generated_tokens)

    async def _step(self, clock: float, dt: float, loop) -> float:
        """End a step of modelled length dt on the virtual clock; returns the clock after it."""
        clock += dt
        self.busy_s += dt
        delay = clock - loop.time()
        await asyncio.sleep(delay if delay > 0 else 0)  # late: go on at once (but let others run)
        return clock

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock: float | None = None
        while True:
            if not (self.waiting_prefill or self.waiting_decode or self.running):
                self._wake.clear()
                self._tp_mark, self.gen_throughput = None, 0.0
                await self._wake.wait()
                clock = None
            now = loop.time()
            if clock is None:
                clock = now  # a busy period starts now
            elif clock < now - MAX_LAG_S:
                self.dropped_lag_s += now - clock
                clock = now
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
                clock = await self._step(clock, self.model.prefill_step_ms(tokens) * self._jit() * self.scale_s, loop)
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
            clock = await self._step(clock, self.model.decode_step_ms(len(running)) * self._jit() * self.scale_s, loop)
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
            self._sample_throughput(loop.time())
