"""The prefill role: its service, how its health is judged, what it starts after (nothing)."""

role_prefill = {
    "services": ["knobkeeper-prefill"],
    "health": "/health",
    "after": [],
    "health_timeout": 900,
}
