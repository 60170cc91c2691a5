"""A SIMULATED SGLang engine for machines without a GPU: prefill and decode workers that speak
SGLang's worker HTTP API (OpenAI chat and completions, /generate, PD bootstrap, /metrics under the
engine's own names) well enough for the real router to front them, with a performance model that
reads the knobs from the environment at start-up (model.py, effects.toml).

Parts: protocol.py (the three request/response dialects), bootstrap.py (prefill/decode pairing by
room), engine.py (continuous batching on a virtual clock: immune to scheduler delay), faults.py,
metrics.py (prometheus-client, per-server registry), server.py (the routes), __main__.py.

May import: nothing of knobkeeper outside this package (it runs where the controller does not).
"""
