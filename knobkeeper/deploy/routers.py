"""The router families moved to knobkeeper.engine.routers (one module per engine family); this name
stays only for imports written before that move (other branches of the same wave): remove it once
nothing imports it."""

from knobkeeper.engine.routers import ROUTERS, SGLANG_ROUTER, SMG, VLLM_ROUTER, RouterFamily, workers_healthy

RouterEngine = RouterFamily


def router(engine: str) -> RouterFamily:
    return ROUTERS[engine]


__all__ = ["ROUTERS", "SGLANG_ROUTER", "SMG", "VLLM_ROUTER", "RouterEngine", "router", "workers_healthy"]
