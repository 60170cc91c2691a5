"""An example production inventory for vLLM: two prefill hosts, two decode hosts, one router host,
systemd, the official vLLM build in a venv under each host's prefix, prefill/decode over NIXL
(NixlConnector, KV buffers in GPU memory, one NIXL side channel per instance), vllm-router in front.
Tests render and check every service of it (the launch commands through vLLM 0.32.0's own `serve`
parser); no host is contacted. Copy it, change the addresses and the model, then:

    pyinfra -y inventory/example_prod_vllm.py deploy.py

Its stack is "vllm": this repo also holds an SGLang stack with the same role names (example_prod.py,
local.py), so this one's knobs are inventory/knobs.toml's [vllm.prefill], [vllm.decode] and
[vllm.router] tables (`knobkeeper set ... --stack vllm --role decode`).
"""

_ssh = {
    "ssh_user": "deploy",
    "ssh_port": 22,
    "ssh_key": "~/.ssh/knobkeeper_ed25519",
    "ssh_known_hosts_file": "~/.ssh/known_hosts",
    "_sudo": True,
}

_stack = {
    "stack": "vllm",
    "prefix": "/opt/knobkeeper",
    "service_manager": "systemd",
    "service_user": "vllm",
    "python": "{prefix}/venv/bin/python",
    # Engine and version per role, in one place (the venv gets vllm==0.32.0 and vllm-router==0.1.17).
    "engines": {"prefill": "vllm==0.32.0", "decode": "vllm==0.32.0", "router": "vllm-router==0.1.17"},
    "model": "/models/Qwen3-32B",
    "served_model_name": "qwen3-32b",
    "tp_size": 4,
    "kv_connector": "NixlConnector",
    "kv_buffer_device": "cuda",
    "engine_args": {
        "prefill": ["--block-size", "16", "--gpu-memory-utilization", "0.90", "--max-model-len", "32768"],
        "decode": ["--block-size", "16", "--gpu-memory-utilization", "0.90", "--max-model-len", "32768"],
        "router": ["--worker-startup-timeout-secs", "1800", "--health-check-interval-secs", "10"],
    },
    "stop_timeout": 120,
    "environment": {"HF_HOME": "/models/hf-cache"},
    **_ssh,
}


def _host(name, address):
    return (name, {**_stack, "ssh_hostname": address, "advertise_host": address})


prefill = [_host("vllm-prefill-1", "10.0.1.11"), _host("vllm-prefill-2", "10.0.1.12")]
decode = [_host("vllm-decode-1", "10.0.1.21"), _host("vllm-decode-2", "10.0.1.22")]
router = [_host("vllm-router-1", "10.0.1.31")]
