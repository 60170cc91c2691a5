"""Fault injection, for tests of what sits in front of the sim (gates, router, load generator):

    --startup-delay S   /health answers 503 "loading" for S seconds after start (a slow start)
    --never-healthy     /health always answers 503
    --fail-requests N   the first N generation requests fail with HTTP 500
    --hang-after N      generation requests after the first N are accepted and never answered
    --crash-after N     the process exits (status 70) once N requests were answered

and by knob value: a case of the effects table (effects.toml) with `fail_fraction = F` makes each
generation request fail with HTTP 500 with probability F (several active cases: 1 - product of
(1 - F)), drawn from a generator seeded by --seed, so a run with the same seed fails the same
requests. A candidate value that breaks the engine, for the canary's rollback. Every failed
generation request, either way, counts in sglang:num_aborted_requests_total (what a canary reads).
"""

from __future__ import annotations

import os
import random
import time

from .config import SimConfig

CRASH_STATUS = 70


class Faults:
    def __init__(self, cfg: SimConfig, started_at: float, fail_fraction: float = 0.0):
        self.cfg = cfg
        self.ready_at = started_at + max(0.0, cfg.startup_delay)
        self.seq = 0  # generation requests seen
        self.fail_fraction = fail_fraction
        # Its own generator: drawing failures leaves the run factor and step jitter of a seed as they were.
        self.rng = random.Random(f"fail_fraction:{cfg.seed}")
        self.reason = ""

    def healthy(self) -> bool:
        return not self.cfg.never_healthy and time.time() >= self.ready_at

    def health(self) -> tuple[int, dict | None]:
        """(HTTP status, JSON body or None for an empty 200) of GET /health."""
        if self.cfg.never_healthy:
            return 503, {"status": "unhealthy", "reason": "--never-healthy"}
        if not self.healthy():
            return 503, {"status": "loading", "ready_in_s": round(self.ready_at - time.time(), 3)}
        return 200, None

    def gate(self) -> str | None:
        """Count one generation request; 'fail', 'hang' or None (serve it)."""
        self.seq += 1
        if self.seq <= self.cfg.fail_requests:
            self.reason = f"request {self.seq} of the first {self.cfg.fail_requests} fails (--fail-requests)"
            return "fail"
        if self.fail_fraction and self.rng.random() < self.fail_fraction:
            self.reason = (f"request {self.seq} fails (fail_fraction {self.fail_fraction:g} of the knob "
                           f"values' effects)")
            return "fail"
        if self.cfg.hang_after >= 0 and self.seq > self.cfg.hang_after:
            return "hang"
        return None

    def failure_message(self) -> str:
        return f"sim fault injection: {self.reason}"

    def crash_due(self, answered: int) -> bool:
        return self.cfg.crash_after >= 0 and answered >= self.cfg.crash_after

    @staticmethod
    def crash() -> None:
        os._exit(CRASH_STATUS)

    def settings(self) -> dict:
        c = self.cfg
        return {"startup_delay": c.startup_delay, "never_healthy": c.never_healthy,
                "fail_requests": c.fail_requests, "fail_fraction": self.fail_fraction,
                "hang_after": c.hang_after, "crash_after": c.crash_after}
