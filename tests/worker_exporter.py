"""A stand-in engine worker for the restart tests: a real process that serves SGLang's serving
metrics at steady rates (100 tokens/s, 2 requests/s, 8 requests in flight) in the text exposition,
with prometheus-client's process collector (a real process_start_time_seconds). Killing it by PID
and starting another on the same port is a worker crash that supervisord restarted: a new PID, a
new start time, counters from 0.

    python tests/worker_exporter.py PORT
"""

from __future__ import annotations

import http.server
import sys
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

TICK_S = 0.05


def main(port: int) -> None:
    tokens = Counter("sglang:generation_tokens", "output tokens")
    requests = Counter("sglang:num_requests", "finished requests")
    Counter("sglang:num_aborted_requests", "aborted requests")
    Gauge("sglang:num_running_reqs", "requests running").set(8)
    itl = Histogram("sglang:inter_token_latency_seconds", "inter-token latency", buckets=(0.05, 0.1, 0.2))

    def feed() -> None:
        while True:
            tokens.inc(5)                  # 100 tokens/s
            requests.inc(0.1)              # 2 requests/s
            for _ in range(5):
                itl.observe(0.08)          # 8 generating requests x 12.5 tokens/s each
            time.sleep(TICK_S)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(REGISTRY)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    threading.Thread(target=feed, daemon=True).start()
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
