"""A real Prometheus (Debian's `prometheus`) for tests: loopback, a temp tsdb, stopped by its PID."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from tests.procs import free_port, start, stop, wait_http


class Prometheus:
    def __init__(self, tmp: Path, config_text: str):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus: not installed (it is in system-packages.txt: run bash scripts/system-deps.sh)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "prometheus.yml"
        self.config.write_text(config_text)
        self.log = tmp / "prometheus.log"
        self.proc = start([binary, f"--config.file={self.config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                           f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"], self.log)
        try:
            wait_http(self.url + "/-/ready", timeout=60, proc=self.proc)
        except Exception:
            self.stop()
            raise AssertionError(f"prometheus not up: {self.log.read_text()[-2000:]}")

    def wait_scraped(self, count: int, timeout: float = 60) -> None:
        """Until `count` targets were scraped healthy: Prometheus's discovery hands new targets to the
        scraper only every 5 s, so the first samples come 5..6 s after start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(self.url + "/api/v1/targets", timeout=5) as resp:
                active = json.loads(resp.read())["data"]["activeTargets"]
            if sum(1 for t in active if t["health"] == "up") >= count:
                return
            time.sleep(0.2)
        raise AssertionError(f"prometheus: fewer than {count} targets up after {timeout} s: {active}")

    def stop(self) -> None:
        stop(self.proc)
