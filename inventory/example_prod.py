"""An example production inventory: two prefill hosts, two decode hosts, one router host, systemd,
real SGLang engines in a venv under each host's prefix. Tests render every service of it; no host
is contacted. Copy it, change the addresses and the model, then:

    pyinfra -y inventory/example_prod.py deploy.py
"""

_ssh = {
    "ssh_user": "deploy",
    "ssh_port": 22,
    "ssh_key": "~/.ssh/knobkeeper_ed25519",
    "ssh_known_hosts_file": "~/.ssh/known_hosts",
    "_sudo": True,
}

_stack = {
    "prefix": "/opt/knobkeeper",
    "service_manager": "systemd",
    "service_user": "sglang",
    "python": "{prefix}/venv/bin/python",
    # Engine and version per role, in one place (the venv gets sglang[all]==0.5.23 and sglang-router==0.3.2).
    "engines": {"prefill": "sglang==0.5.23", "decode": "sglang==0.5.23", "router": "sglang-router==0.3.2"},
    "model": "/models/DeepSeek-V3",
    "served_model_name": "deepseek-v3",
    "transfer_backend": "mooncake",
    "tp_size": 8,
    "engine_args": {
        "prefill": ["--trust-remote-code", "--mem-fraction-static", "0.85"],
        "decode": ["--trust-remote-code", "--mem-fraction-static", "0.85", "--cuda-graph-max-bs-decode", "128"],
        "router": ["--worker-startup-timeout-secs", "1800", "--health-check-interval-secs", "10"],
    },
    "stop_timeout": 120,
    "environment": {"HF_HOME": "/models/hf-cache"},
    **_ssh,
}


def _host(name, address):
    return (name, {**_stack, "ssh_hostname": address, "advertise_host": address})


prefill = [_host("prefill-1", "10.0.0.11"), _host("prefill-2", "10.0.0.12")]
decode = [_host("decode-1", "10.0.0.21"), _host("decode-2", "10.0.0.22")]
router = [_host("router-1", "10.0.0.31")]
