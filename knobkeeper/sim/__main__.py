"""`python -m knobkeeper.sim`: start one SIMULATED SGLang worker (prefill or decode). See --help."""

from __future__ import annotations

import argparse
import os
import sys

from .model import EffectsError, expected_throughput, knobs_from_env, load_effects, PerfModel
from .config import SimConfig
from .server import run

ENV_PREFIX = "KNOBKEEPER_SIM_"

DESCRIPTION = """\
knobkeeper sim engine - a SIMULATED stand-in for a GPU SGLang worker (no model, no GPU).

It speaks enough of SGLang's worker HTTP API for the real sglang-router (--pd-disaggregation) to
front it, and it takes the time a GPU engine would take according to a performance model whose
knob effects are data (effects.toml). Knobs are read from the environment at start-up only: a
restart is needed to change them, as in the real engine.
"""

EPILOG = """\
every option can also be set by environment: KNOBKEEPER_SIM_<OPTION> (upper case, '-' -> '_'),
e.g. KNOBKEEPER_SIM_TIME_SCALE=0.1, KNOBKEEPER_SIM_FAIL_REQUESTS=3, KNOBKEEPER_SIM_NEVER_HEALTHY=1,
KNOBKEEPER_SIM_EFFECTS=a.toml:b.toml. A flag on the command line wins over the environment.

knobs read from the environment at start-up (reported in /get_server_info "knobs" and /metrics sim_knob):
  SGLANG_SM120_MMA_TARGET_CTAS          decode-attention target CTAs; effect per effects.toml
                                        (default calibration: 512 vs unset = +12.8%% output
                                        throughput at concurrency 64, +5.7%% at 96; unset: 96 < 80)
  SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds a decode request waits for its prefill room (default
                                        300, wall clock, not scaled), then fails with HTTP 500
  SGLANG_DISAGGREGATION_QUEUE_SIZE      reported only
  KNOBKEEPER_SPLITKV_TARGET_CTAS        reported; no effect until effects.toml gives it one
  any knob of the effects table, and every SGLANG_*, NCCL_*, KNOBKEEPER_* variable (reported;
  names that look secret are redacted)

performance model (knobkeeper/sim/model.py; constants and knob effects in effects.toml):
  decode step  = (decode_base_ms + decode_per_seq_ms * running_batch) * knob multipliers
  prefill step = (prefill_base_ms + prefill_per_token_ms * prompt_tokens) * knob multipliers
  KV transfer  = kv_transfer_base_ms + kv_transfer_per_token_ms * prompt_tokens (decode side)
  each time x run factor (per process, N(1, --run-noise)) x per-step jitter (U(1 +- --step-jitter))
  x --time-scale. Continuous batching: each decode step gives every running request one token.
  Prompt tokens are approximated as characters / 4 (or len(input_ids)); chat adds 4 per message.
  Output: deterministic filler words, exactly max_tokens / max_new_tokens tokens (see --eos-after).

HTTP endpoints (port --port):
  GET  /health, /health_generate     503 {"status":"loading"} during --startup-delay, then 200
  GET  /get_server_info, /server_info served_model_name, disaggregation_mode, knobs, started_at,
                                      pid, sim settings, stats (never model_path/tokenizer_path)
  GET  /get_model_info, /model_info   served_model_name, is_generation
  GET  /v1/models
  GET  /get_load                      [{"dp_rank":0,"num_reqs":N,"num_waiting_reqs":W,"num_tokens":T}]
  GET  /metrics                       Prometheus (prometheus-client): sglang 0.5.23 names, types and
                                      buckets (sglang:*), the sim's own sim_* (sim_knob, sim_info)
  GET  /debug/rooms[?room=R]          per bootstrap room timestamps (unix s), last 2000 rooms
  POST /generate                      SGLang native (text|input_ids, sampling_params, stream)
  POST /v1/completions, /v1/chat/completions  OpenAI shapes, stream + stream_options.include_usage
  POST /flush_cache, /abort_request   accepted, no-op

disaggregation (bootstrap protocol, port --bootstrap-port on the prefill worker):
  A request carrying bootstrap_host/bootstrap_port/bootstrap_room (added by the router) is prefilled
  by the prefill worker, which then marks the room done. The decode worker long-polls
  GET http://bootstrap_host:bootstrap_port/room/<room>?wait=<s> -> {"room":R,"done":true,
  "prefill_done_at":unix_s,"prompt_tokens":N} (or {"done":false} after wait s), pays the KV transfer,
  emits the first token and decodes the rest. A request without bootstrap fields is served whole.

examples:
  python -m knobkeeper.sim --role prefill --port 30001 --bootstrap-port 8998
  SGLANG_SM120_MMA_TARGET_CTAS=512 python -m knobkeeper.sim --role decode --port 30002
  python -m knobkeeper.sim --role decode --explain        # print the model's numbers and exit
"""


def _bool(s: str) -> bool:
    v = str(s).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (1/0, true/false), got {s!r}")


def _nonneg_float(s: str) -> float:
    v = float(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s!r}")
    return v


def _pos_float(s: str) -> float:
    v = float(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {s!r}")
    return v


def _port(s: str) -> int:
    v = int(s)
    if not 0 < v < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {s!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    class Fmt(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    p = argparse.ArgumentParser(prog="python -m knobkeeper.sim", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=Fmt)
    g = p.add_argument_group("server")
    g.add_argument("--role", "--disaggregation-mode", dest="role", choices=("prefill", "decode"), required=True,
                   help="worker role; a prefill worker also serves --bootstrap-port")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (HTTP API and bootstrap)")
    g.add_argument("--port", type=_port, default=30000, help="HTTP API port")
    g.add_argument("--bootstrap-port", "--disaggregation-bootstrap-port", dest="bootstrap_port", type=_port,
                   default=8998, help="prefill role: port of the bootstrap server that decode workers poll")
    g.add_argument("--served-model-name", default="knobkeeper-sim",
                   help="model id reported to the router and clients (no model_path is ever reported)")
    g.add_argument("--max-running-requests", type=int, default=256,
                   help="decode batch cap; further requests wait for a slot")
    g.add_argument("--chunked-prefill-size", type=int, default=8192, help="prompt tokens per prefill batch")
    g.add_argument("--context-length", type=int, default=32768,
                   help="prompt + max tokens above this are rejected with 400")
    g.add_argument("--stream-interval", type=int, default=1, help="tokens per streamed chunk (as SGLang)")
    g.add_argument("--incremental-streaming-output", type=_bool, nargs="?", const=True, default=False,
                   help="/generate streams text deltas instead of SGLang's cumulative text")
    g.add_argument("--eos-after", type=int, default=0,
                   help="requests without ignore_eos stop with finish_reason 'stop' after this many tokens "
                        "(0 = never: output length is always max tokens)")
    g.add_argument("--access-log", type=_bool, nargs="?", const=True, default=False,
                   help="log every HTTP request (costs CPU)")
    g.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")

    m = p.add_argument_group("performance model")
    m.add_argument("--time-scale", type=_pos_float, default=1.0,
                   help="multiply every modelled time (e.g. 0.1 for tests); throughput ratios do not change. "
                        "Keep decode steps >= ~3 ms wall: asyncio timers have ~1 ms resolution")
    m.add_argument("--seed", type=int, default=None, help="seed of the run factor and the step jitter "
                                                          "(default: random, reported in /get_server_info)")
    m.add_argument("--run-noise", type=_nonneg_float, default=0.02,
                   help="std-dev of the per-process multiplicative factor on step times (run-to-run noise)")
    m.add_argument("--step-jitter", type=_nonneg_float, default=0.05,
                   help="half-width of the uniform per-step jitter on step times")
    m.add_argument("--effects", action="append", default=None, metavar="TOML",
                   help="merge this knob-effect table over the shipped effects.toml (repeatable; env: "
                        "KNOBKEEPER_SIM_EFFECTS with ':' between files)")
    m.add_argument("--explain", action="store_true",
                   help="print the model for the knobs in the environment (step times, expected closed-loop "
                        "throughput) and exit")

    f = p.add_argument_group("fault injection (for tests)")
    f.add_argument("--startup-delay", type=_nonneg_float, default=0.0,
                   help="seconds /health answers 503 'loading' after start (slow start)")
    f.add_argument("--never-healthy", type=_bool, nargs="?", const=True, default=False,
                   help="/health always answers 503")
    f.add_argument("--fail-requests", type=int, default=0,
                   help="the first N generation requests fail with HTTP 500")
    f.add_argument("--hang-after", type=int, default=-1,
                   help="generation requests after the first N are accepted and never answered "
                        "(0 = all hang; -1 = off); /health stays 200")
    f.add_argument("--crash-after", type=int, default=-1,
                   help="exit abruptly (status 70) after N generation requests were answered (-1 = off)")
    return p


def _apply_env(parser: argparse.ArgumentParser, env) -> None:
    """Defaults from KNOBKEEPER_SIM_<DEST>; parsed with the option's own type."""
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "explain"):
            continue
        name = ENV_PREFIX + action.dest.upper()
        if name not in env:
            continue
        raw = env[name]
        if action.dest == "effects":
            action.default = [x for x in raw.split(":") if x]
            continue
        try:
            val = action.type(raw) if action.type else raw
        except (ValueError, argparse.ArgumentTypeError) as exc:
            parser.error(f"{name}={raw!r}: {exc}")
        if action.choices and val not in action.choices:
            parser.error(f"{name}={raw!r}: choose from {', '.join(action.choices)}")
        action.default = val
        action.required = False


def parse_config(argv=None, env=None) -> tuple[SimConfig, bool]:
    parser = build_parser()
    _apply_env(parser, os.environ if env is None else env)
    a = parser.parse_args(argv)
    explain = a.explain
    d = vars(a)
    d.pop("explain")
    d["effects"] = d["effects"] or []
    return SimConfig(**d), explain


def explain(cfg: SimConfig) -> str:
    table = load_effects(cfg.effects)
    knobs = knobs_from_env(os.environ, table)
    model = PerfModel(table, knobs)
    lines = [f"role={cfg.role} time_scale={cfg.time_scale} effects files: {', '.join(table.sources)}",
             "knob cases:"]
    lines += [f"  {k} = {v!r}: {case}" for k, v, case in model.active]
    lines.append("decode step (ms, time scale 1) and expected closed-loop output tokens/s "
                 "(PD, input 1024, output 512, time scale 1, no noise):")
    for b in (1, 8, 16, 32, 48, 64, 72, 80, 88, 96, 112, 128):
        e = expected_throughput(b, knobs, 1024, 512, table=table)
        lines.append(f"  batch {b:4d}: step {model.decode_step_ms(b):7.3f} ms   concurrency {b:4d}: "
                     f"{e.output_tokens_per_s:9.1f} tok/s")
    lines.append(f"prefill step for 1024 tokens: {model.prefill_step_ms(1024):.3f} ms; "
                 f"KV transfer: {model.kv_transfer_ms(1024):.3f} ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    cfg, want_explain = parse_config(argv)
    try:
        if want_explain:
            print(explain(cfg))
            return 0
        load_effects(cfg.effects)  # fail fast with a one-line message
    except EffectsError as exc:
        print(f"knobkeeper.sim: {exc}", file=sys.stderr)
        return 2
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
