"""The decode role: starts after prefill (its KV cache comes from prefill's bootstrap server)."""

role_decode = {
    "services": ["knobkeeper-decode"],
    "health": "/health",
    "after": ["prefill"],
    "health_timeout": 900,
}
