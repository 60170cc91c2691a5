"""The PD bootstrap: how a decode worker learns that the prefill worker finished its request's room.

As SGLang PD: the router POSTs the same request to a prefill and a decode worker with
bootstrap_host/bootstrap_port/bootstrap_room added. The prefill worker prefills it (first token) and
marks the room done on its bootstrap server (`Bootstrap`, on --bootstrap-port). The decode worker
long-polls that server (`wait_prefill`):

    GET http://bootstrap_host:bootstrap_port/room/<room>?wait=<s>
      -> {"room": R, "done": true, "prefill_done_at": unix_s, "prompt_tokens": N}
         as soon as the room is done, or {"room": R, "done": false} after `wait` seconds

If the room is not done within SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds (wall clock, not
scaled), `wait_prefill` raises SimError(500) naming the room. `RoomLog` keeps the timestamps of the
last rooms each worker saw (GET /debug/rooms).
"""

from __future__ import annotations

import asyncio
import collections
import json
import time

from aiohttp import ClientSession, ClientTimeout, web

from .protocol import SimError, error_body

ROOM_LOG_SIZE = 2000


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
            return web.Response(status=400, content_type="application/json", body=error_body(
                400, "room must be an integer and wait a number of seconds", "BadRequestError"))
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


class RoomLog:
    """Timestamps (unix s) per bootstrap room, the last ROOM_LOG_SIZE rooms."""

    def __init__(self, role: str):
        self.role = role
        self.rooms: collections.OrderedDict[int, dict] = collections.OrderedDict()

    def record(self, room: int, data: dict) -> None:
        rec = self.rooms.get(room)
        if rec is None:
            rec = self.rooms[room] = {"room": room, "role": self.role}
            if len(self.rooms) > ROOM_LOG_SIZE:
                self.rooms.popitem(last=False)
        rec.update(data)

    def select(self, room: str | None) -> list[dict]:
        rooms = list(self.rooms.values())
        return rooms if room is None else [r for r in rooms if str(r["room"]) == room]


async def wait_prefill(session: ClientSession, room: int, host: str, port: int, timeout_s: float) -> dict:
    """Decode side: long-poll the prefill worker's bootstrap server until the room is done."""
    deadline = time.monotonic() + timeout_s
    url = f"http://{host}:{port}/room/{room}"
    last = "no answer yet"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SimError(
                500,
                f"sim decode: KV cache for bootstrap_room {room} was not ready: the prefill worker at "
                f"bootstrap {host}:{port} did not finish the room within "
                f"SGLANG_DISAGGREGATION_WAITING_TIMEOUT={timeout_s:g}s (last: {last})",
                "DisaggregationTimeoutError")
        wait = min(left, 10.0)
        try:
            async with session.get(url, params={"wait": f"{wait:.3f}"}, timeout=ClientTimeout(total=wait + 5)) as resp:
                if resp.status == 200:
                    data = json.loads(await resp.read())
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
