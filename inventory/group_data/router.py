"""The router role: starts after prefill and decode, because sglang-router drops for good a worker
that is not up within --worker-startup-timeout-secs. Its gate is /readiness (503 until every worker
registered; /health is always 200) and /workers, where every worker must be reported healthy: after a
worker restart, a router that still considers the worker dead fails the first requests.
"""

role_router = {
    "services": ["knobkeeper-router"],
    "health": "/readiness",
    "workers": "/workers",
    "after": ["prefill", "decode"],
    "health_timeout": 300,
}
