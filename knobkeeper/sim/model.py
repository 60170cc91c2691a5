"""Performance model of the SIMULATED engine: pure functions of batch, tokens and knobs; no I/O.

The sim stands in for a GPU engine (SGLang) so the stack runs on machines without GPUs. It does not
compute anything; it *waits* the time a GPU engine would take, according to this model:

    decode step   t_d(B) = (decode_base_ms + decode_per_seq_ms * B) * M_d(B)
    prefill step  t_p(T) = (prefill_base_ms + prefill_per_token_ms * T) * M_p(T)
    KV transfer   t_x(I) = kv_transfer_base_ms + kv_transfer_per_token_ms * I     (decode side)

B is the running decode batch (continuous batching: each step gives every running request one
token), T the prompt tokens in one prefill batch, I a request's prompt tokens. M_d and M_p are the
products of the multipliers of the knobs found in the environment at start-up (effects.toml: a knob
value selects a case whose multiplier is a constant or a curve over B / T). A change of knob needs a
restart, as in the real engine. Every time is further multiplied by

    run_factor  one draw per process from N(1, run_noise), clipped to [0.8, 1.2] (run-to-run noise)
    jitter      one draw per step from U(1 - step_jitter, 1 + step_jitter) (mean exactly 1)
    time_scale  --time-scale; throughput *ratios* between knob settings do not depend on it.

Calibration (the default effects.toml): with SGLANG_SM120_MMA_TARGET_CTAS=512 decode steps follow the
base line; unset, the step is 12.8% slower up to B=64, fine near B=80 and 5.7% slower above 80.
In a closed loop with a fixed output length (decode-bound, so B ~ concurrency) this gives the field
numbers: 512/unset output throughput = 1.128 at concurrency 64 and 1.057 at 96, and unset
throughput at 96 below 80 (the scaling anomaly), which 512 removes. `expected_throughput` is the
closed-form steady state used by the calibration test and by the bench to judge the sim's fidelity.

Not modelled: context length (step time does not grow with it), KV-cache capacity (only
--max-running-requests bounds the batch), chunked prefill across steps (a long prompt is one step),
speculative decoding, EOS (outputs have exactly max_tokens unless --eos-after is set).
"""

from __future__ import annotations

import bisect
import math
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable, Mapping

#: Knobs the sim always reads and reports, besides those of the effects table.
KNOWN_KNOBS = (
    "SGLANG_SM120_MMA_TARGET_CTAS",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "SGLANG_DISAGGREGATION_QUEUE_SIZE",
    "KNOBKEEPER_SPLITKV_TARGET_CTAS",
)
#: Environment prefixes reported as knobs (KNOBKEEPER_SIM_* are the sim's own options, not knobs).
KNOB_PREFIXES = ("SGLANG_", "NCCL_", "KNOBKEEPER_")
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")

MODEL_KEYS = (
    "decode_base_ms", "decode_per_seq_ms", "prefill_base_ms", "prefill_per_token_ms",
    "kv_transfer_base_ms", "kv_transfer_per_token_ms",
)
EFFECT_KEYS = ("decode_step", "prefill_step")
#: Not a multiplier: the fraction of generation requests the engine fails (fault injection by value).
FAULT_KEYS = ("fail_fraction",)


class EffectsError(ValueError):
    """A malformed effects table; the message names the file and the field."""


class Curve:
    """A multiplier: a constant, or [x, y] points linearly interpolated and clamped at the ends."""

    __slots__ = ("xs", "ys", "const")

    def __init__(self, spec, where: str = "multiplier"):
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            if spec <= 0:
                raise EffectsError(f"{where}: multiplier must be > 0, got {spec!r}")
            self.const, self.xs, self.ys = float(spec), (), ()
            return
        try:
            pts = sorted((float(x), float(y)) for x, y in spec)
        except (TypeError, ValueError):
            raise EffectsError(f"{where}: expected a number or a list of [x, multiplier] pairs, got {spec!r}") from None
        if not pts or any(y <= 0 for _, y in pts):
            raise EffectsError(f"{where}: need at least one point and multipliers > 0, got {spec!r}")
        self.const = None
        self.xs = tuple(p[0] for p in pts)
        self.ys = tuple(p[1] for p in pts)

    def __call__(self, x: float) -> float:
        if self.const is not None:
            return self.const
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def to_data(self):
        return self.const if self.const is not None else [list(p) for p in zip(self.xs, self.ys)]


ONE = Curve(1.0)


@dataclass(frozen=True)
class Effect:
    decode_step: Curve = ONE
    prefill_step: Curve = ONE
    fail_fraction: float = 0.0

    @classmethod
    def parse(cls, data, where: str) -> "Effect":
        if not isinstance(data, dict):
            raise EffectsError(f"{where}: expected a table, got {data!r}")
        extra = set(data) - set(EFFECT_KEYS) - set(FAULT_KEYS) - {"doc"}
        if extra:
            raise EffectsError(f"{where}: unknown key(s) {sorted(extra)}; accepted: {list(EFFECT_KEYS + FAULT_KEYS)}")
        fail = data.get("fail_fraction", 0.0)
        if isinstance(fail, bool) or not isinstance(fail, (int, float)) or not 0.0 <= fail <= 1.0:
            raise EffectsError(f"{where}.fail_fraction: expected a number from 0 to 1, got {fail!r}")
        return cls(**{k: Curve(data[k], f"{where}.{k}") for k in EFFECT_KEYS if k in data},
                   fail_fraction=float(fail))


@dataclass(frozen=True)
class KnobEffect:
    name: str
    doc: str = ""
    source: str = ""
    unset: Effect | None = None
    values: dict[str, Effect] = field(default_factory=dict)
    other: Effect | None = None

    def case(self, value: str | None) -> tuple[str, Effect | None]:
        """Which case applies to `value` (None or "" = unset): ("unset"|"values.V"|"other", effect)."""
        if value is None or value.strip() == "":
            return "unset", self.unset
        for key, eff in self.values.items():
            if _same_value(key, value):
                return f"values.{key}", eff
        return "other", self.other


def _same_value(a: str, b: str) -> bool:
    a, b = a.strip(), b.strip()
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return a.lower() == b.lower()


@dataclass(frozen=True)
class ModelParams:
    decode_base_ms: float = 4.0
    decode_per_seq_ms: float = 0.4
    prefill_base_ms: float = 4.0
    prefill_per_token_ms: float = 0.05
    kv_transfer_base_ms: float = 1.0
    kv_transfer_per_token_ms: float = 0.002


@dataclass(frozen=True)
class EffectsTable:
    params: ModelParams
    knobs: dict[str, KnobEffect]
    sources: tuple[str, ...]


def shipped_effects_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("effects.toml")))


def load_effects(extra: Iterable[str | os.PathLike] = ()) -> EffectsTable:
    """The shipped table with `extra` TOML files merged over it, in order."""
    files = [shipped_effects_path(), *[Path(p) for p in extra]]
    params: dict[str, float] = {}
    knobs: dict[str, KnobEffect] = {}
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise EffectsError(f"{path}: cannot read effects table ({exc.strerror})") from None
        except tomllib.TOMLDecodeError as exc:
            raise EffectsError(f"{path}: not valid TOML ({exc})") from None
        extra_top = set(data) - {"model", "knobs"}
        if extra_top:
            raise EffectsError(f"{path}: unknown top-level table(s) {sorted(extra_top)}; accepted: model, knobs")
        for key, val in data.get("model", {}).items():
            if key not in MODEL_KEYS:
                raise EffectsError(f"{path}: [model].{key} is not a model constant; accepted: {list(MODEL_KEYS)}")
            if not isinstance(val, (int, float)) or isinstance(val, bool) or val < 0:
                raise EffectsError(f"{path}: [model].{key} must be a number >= 0, got {val!r}")
            params[key] = float(val)
        for name, spec in data.get("knobs", {}).items():
            knobs[name] = _parse_knob(name, spec, f"{path}: [knobs.{name}]")
    return EffectsTable(ModelParams(**params), knobs, tuple(str(f) for f in files))


def _parse_knob(name: str, spec, where: str) -> KnobEffect:
    if not isinstance(spec, dict):
        raise EffectsError(f"{where}: expected a table")
    extra = set(spec) - {"doc", "source", "unset", "values", "other"}
    if extra:
        raise EffectsError(f"{where}: unknown key(s) {sorted(extra)}; accepted: doc, source, unset, values, other")
    values = spec.get("values", {})
    if not isinstance(values, dict):
        raise EffectsError(f"{where}.values: expected a table of value -> effect")
    return KnobEffect(
        name=name,
        doc=str(spec.get("doc", "")),
        source=str(spec.get("source", "")),
        unset=Effect.parse(spec["unset"], f"{where}.unset") if "unset" in spec else None,
        values={str(k): Effect.parse(v, f"{where}.values.{k}") for k, v in values.items()},
        other=Effect.parse(spec["other"], f"{where}.other") if "other" in spec else None,
    )


def knobs_from_env(env: Mapping[str, str], table: EffectsTable) -> dict[str, str | None]:
    """The knob values a process starts with: table and known knobs (None = unset) plus any
    SGLANG_*/NCCL_*/KNOBKEEPER_* variable (the sim's own KNOBKEEPER_SIM_* options excluded).
    Values of names that look secret are redacted."""
    names = set(table.knobs) | set(KNOWN_KNOBS)
    names |= {k for k in env if k.startswith(KNOB_PREFIXES) and not k.startswith("KNOBKEEPER_SIM_")}
    out: dict[str, str | None] = {}
    for name in sorted(names):
        val = env.get(name)
        if val is not None and val.strip() == "":
            val = None
        if val is not None and any(m in name.upper() for m in _SECRET_MARKERS):
            val = "<redacted>"
        out[name] = val
    return out


class PerfModel:
    """Step times (milliseconds, time scale 1, no noise) for one set of knob values."""

    def __init__(self, table: EffectsTable, knobs: Mapping[str, str | None]):
        self.params = table.params
        self.knobs = dict(knobs)
        self.active: list[tuple[str, str | None, str]] = []  # (knob, value, case)
        dec: list[Curve] = []
        pre: list[Curve] = []
        served = 1.0  # the fraction of generation requests no active case fails
        for name, ke in sorted(table.knobs.items()):
            value = self.knobs.get(name)
            case, eff = ke.case(value)
            self.active.append((name, value, case if eff is not None else f"{case} (no effect)"))
            if eff is not None:
                if eff.decode_step is not ONE:
                    dec.append(eff.decode_step)
                if eff.prefill_step is not ONE:
                    pre.append(eff.prefill_step)
                served *= 1.0 - eff.fail_fraction
        #: The fraction of generation requests the knob values make fail (faults.Faults draws them).
        self.fail_fraction = 1.0 - served
        self._dec = tuple(dec)
        self._pre = tuple(pre)

    def decode_step_ms(self, batch: float) -> float:
        p = self.params
        t = p.decode_base_ms + p.decode_per_seq_ms * batch
        for c in self._dec:
            t *= c(batch)
        return t

    def prefill_step_ms(self, tokens: float) -> float:
        p = self.params
        t = p.prefill_base_ms + p.prefill_per_token_ms * tokens
        for c in self._pre:
            t *= c(tokens)
        return t

    def kv_transfer_ms(self, prompt_tokens: float) -> float:
        p = self.params
        return p.kv_transfer_base_ms + p.kv_transfer_per_token_ms * prompt_tokens


@dataclass(frozen=True)
class Expected:
    output_tokens_per_s: float
    requests_per_s: float
    mean_batch: float
    decode_step_ms: float
    cycle_s: float


def expected_throughput(
    concurrency: int,
    knobs: Mapping[str, str | None],
    input_len: int,
    output_len: int,
    *,
    mode: str = "pd",
    table: EffectsTable | None = None,
    time_scale: float = 1.0,
    run_factor: float = 1.0,
    chunked_prefill_size: int = 8192,
    max_running_requests: int = 1024,
) -> Expected:
    """Closed-loop steady state: `concurrency` clients, each sending the next request when the last
    finished, fixed prompt and output lengths, no noise.

    mode "pd": prefill and decode on separate workers; a request spends P = t_p(I) in prefill,
    t_x(I) in KV transfer, then (L-1) decode steps; the decode batch B follows Little's law,
    B = C * D / cycle, solved by fixed-point iteration. mode "unified": one worker, clients move in
    lock-step (equal lengths): per wave, ceil(C*I / chunk) prefill steps, then L-1 decode steps at B=C.
    """
    if table is None:
        table = load_effects()
    model = PerfModel(table, knobs)
    c = max(1, int(concurrency))
    scale = time_scale * run_factor / 1000.0  # ms -> s
    steps = max(0, output_len - 1)
    if mode == "unified":
        total = c * input_len
        n_chunks = max(1, math.ceil(total / chunked_prefill_size))
        prefill = sum(model.prefill_step_ms(min(chunked_prefill_size, total - i * chunked_prefill_size))
                      for i in range(n_chunks))
        b = min(c, max_running_requests)
        step = model.decode_step_ms(b)
        cycle = (prefill + steps * step) * scale * math.ceil(c / b)
        return Expected(c * output_len / cycle, c / cycle, b, step, cycle)
    if mode != "pd":
        raise ValueError(f"mode must be 'pd' or 'unified', got {mode!r}")
    pre = (model.prefill_step_ms(input_len) + model.kv_transfer_ms(input_len)) * scale
    b = float(min(c, max_running_requests))
    for _ in range(200):
        d = steps * model.decode_step_ms(b) * scale
        cycle = pre + d
        nb = min(float(max_running_requests), c * d / cycle if cycle > 0 else 0.0)
        if abs(nb - b) < 1e-9:
            break
        b = 0.5 * (b + nb)
    step = model.decode_step_ms(b)
    cycle = pre + steps * step * scale
    return Expected(c * output_len / cycle, c / cycle, b, step, cycle)
