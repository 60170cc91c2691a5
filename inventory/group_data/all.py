"""Defaults for every host of every inventory (host data, inventory group data and --data win).

The keys are documented in knobkeeper/deploy/stack.py. Role topology lives in <role>.py.
"""

service_manager = "systemd"
listen_host = "0.0.0.0"
served_model_name = "knobkeeper-sim"
router_policy = "round_robin"
stop_timeout = 60
systemd_unit_dir = "/etc/systemd/system"

# Ports of each role's first service on a host (the n-th service of a role on one host: +n).
prefill_port = 30000
prefill_bootstrap_port = 8998
decode_port = 30001
router_port = 30080
router_metrics_port = 29080

# vLLM's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT), one per instance like the ports above:
# prefill and decode on one host must not share one (knobkeeper/engine/vllm.py).
prefill_side_channel_port = 5600
decode_side_channel_port = 5700
