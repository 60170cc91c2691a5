"""knobkeeper-kernels: engine-side Triton split-KV decode attention.

The split count follows KNOBKEEPER_SPLITKV_TARGET_CTAS (see splitkv.num_splits); the
combine of the splits is the exact log-sum-exp one. Installed into the engine's venv on
GPU hosts; the knobkeeper controller never imports this package (nor torch, nor triton).

Names are loaded lazily so that importing the package (e.g. `python -m
knobkeeper_kernels.bench --smoke`) does not import triton before the caller has had the
chance to set TRITON_INTERPRET.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "decode_attention": "splitkv",
    "num_splits": "splitkv",
    "split_bounds": "splitkv",
    "target_ctas_from_env": "splitkv",
    "TARGET_CTAS_ENV": "splitkv",
    "DEFAULT_TARGET_CTAS": "splitkv",
    "LaunchConfig": "splitkv",
    "launch_config": "splitkv",
    "CANDIDATE_CONFIGS": "splitkv",
    "decode_attention_ref": "reference",
    "combine_ref": "reference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
