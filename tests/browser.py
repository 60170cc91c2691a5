"""A small driver for a real headless Chromium over the DevTools protocol (no driver download:
Debian's `chromium` binary, a websocket from aiohttp). The report's tests and its benchmark open
the page with it: JavaScript errors, network requests, the DOM, a screenshot, load timing.

    with Chromium() as browser:
        page = browser.open(path.as_uri())
        page.errors, page.requests, page.evaluate("document.title"), page.screenshot(png), page.timing()

Chromium runs in its own process group and is stopped by that group's id.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError

# Flags that keep a headless Chromium from reaching out on its own (updates, sync, field trials):
# on a closed network those connections fail, and the only request we want is the page's.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise UserError("chromium: not installed (Debian: apt-get install chromium; `make test` installs it)")


class Page:
    """One tab: what it logged and requested since it was opened, and commands to it."""

    def __init__(self, browser: "Chromium", session: str):
        self.browser = browser
        self.session = session
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.loaded = False

    def call(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        return self.browser._run(self.browser._call(method, params or {}, self.session), timeout)

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression (JSON-able), or an AssertionError with the exception."""
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                          timeout)
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression!r} threw: {reply['exceptionDetails'].get('text')} "
                                 f"{reply['exceptionDetails'].get('exception', {}).get('description', '')}")
        return reply.get("result", {}).get("value")

    def screenshot(self, path: str | os.PathLike) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    def timing(self) -> dict[str, float]:
        """Milliseconds from the start of navigation: domInteractive, domContentLoaded, load."""
        nav = self.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0] || {})")
        data = json.loads(nav or "{}")
        return {"dom_interactive_ms": data.get("domInteractive"),
                "dom_content_loaded_ms": data.get("domContentLoadedEventEnd"),
                "load_ms": data.get("loadEventEnd"), "transfer_bytes": data.get("decodedBodySize")}


class Chromium:
    """A headless Chromium started on entry and stopped (its whole process group) on exit."""

    def __init__(self, width: int = 1280, height: int = 800, binary: str | None = None):
        self.width, self.height = width, height
        self.binary = binary or find_chromium()
        self.proc: subprocess.Popen | None = None
        self.profile: str | None = None
        self.loop = asyncio.new_event_loop()
        self._ws = None
        self._http = None
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._pages: dict[str, Page] = {}
        self._reader: asyncio.Task | None = None
        self.stderr_tail: list[str] = []

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Chromium":
        self.profile = tempfile.mkdtemp(prefix="kk-chromium-")
        self.proc = subprocess.Popen(
            [self.binary, *FLAGS, f"--window-size={self.width},{self.height}", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            url = self._devtools_url(timeout=60)
            self._run(self._connect(url), 30)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _devtools_url(self, timeout: float) -> str:
        found: list[str] = []
        ready = threading.Event()

        def drain() -> None:  # keeps reading, so Chromium never blocks on a full stderr pipe
            for line in self.proc.stderr:
                self.stderr_tail = (self.stderr_tail + [line.rstrip()])[-40:]
                if "DevTools listening on " in line and not found:
                    found.append(line.split("DevTools listening on ", 1)[1].strip())
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(timeout)
        if not found:
            raise RuntimeError(f"chromium printed no DevTools address within {timeout:.0f} s: "
                               + " | ".join(self.stderr_tail[-5:]))
        return found[0]

    def __exit__(self, *exc) -> None:
        try:
            if self._ws is not None:
                self._run(self._close(), 10)
        except Exception:  # noqa: BLE001 - the process group is killed below whatever happened
            pass
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        elif self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)   # helpers left in the group
            except ProcessLookupError:
                pass
        self.loop.close()
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)

    # ------------------------------------------------------------------ protocol
    def _run(self, coro, timeout: float):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    async def _connect(self, url: str) -> None:
        import aiohttp

        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._reader = self.loop.create_task(self._read())

    async def _close(self) -> None:
        try:
            await asyncio.wait_for(self._call("Browser.close", {}), 5)
        except (asyncio.TimeoutError, RuntimeError, ConnectionError):
            pass
        if self._reader:
            self._reader.cancel()
        await self._ws.close()
        await self._http.close()

    async def _call(self, method: str, params: dict, session: str | None = None) -> dict:
        self._next += 1
        ident = self._next
        future = self.loop.create_future()
        self._waiting[ident] = future
        message = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        await self._ws.send_str(json.dumps(message))
        reply = await future
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    async def _read(self) -> None:
        import aiohttp

        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            page = self._pages.get(data.get("sessionId", ""))
            if page is not None:
                self._event(page, data.get("method", ""), data.get("params", {}))
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("chromium closed the DevTools connection"))

    @staticmethod
    def _event(page: Page, method: str, params: dict) -> None:
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            page.errors.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}".strip())
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            page.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                             for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            page.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            page.requests.append(params.get("request", {}).get("url", ""))
        elif method == "Page.loadEventFired":
            page.loaded = True

    # ------------------------------------------------------------------ pages
    def open(self, url: str, timeout: float = 60) -> Page:
        """A new tab at width x height that has loaded `url` (its load event fired)."""
        target = self._run(self._call("Target.createTarget", {"url": "about:blank"}), 30)["targetId"]
        session = self._run(self._call("Target.attachToTarget", {"targetId": target, "flatten": True}), 30)["sessionId"]
        page = Page(self, session)
        self._pages[session] = page
        for method in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
            page.call(method)
        page.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False})
        page.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        while not page.loaded:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: no load event within {timeout:.0f} s")
            self._run(asyncio.sleep(0.05), 5)
        return page
