"""The sim's settings (one worker process): server, performance model and fault injection options.
`python -m knobkeeper.sim --help` documents each; KNOBKEEPER_SIM_<OPTION> sets it by environment."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimConfig:
    role: str = "decode"
    host: str = "127.0.0.1"
    port: int = 30000
    bootstrap_port: int = 8998
    served_model_name: str = "knobkeeper-sim"
    time_scale: float = 1.0
    seed: int | None = None
    run_noise: float = 0.02
    step_jitter: float = 0.05
    startup_delay: float = 0.0
    never_healthy: bool = False
    fail_requests: int = 0
    hang_after: int = -1
    crash_after: int = -1
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    context_length: int = 32768
    stream_interval: int = 1
    incremental_streaming_output: bool = False
    eos_after: int = 0
    effects: list[str] = field(default_factory=list)
    access_log: bool = False
    log_level: str = "info"
