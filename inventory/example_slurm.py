"""An example production inventory for a Slurm cluster: the login node is the pyinfra host (over SSH;
`@local` when the deploy runs on the login node itself), the stack is ONE heterogeneous job: two
prefill and two decode SGLang workers (one H200 node of 8 GPUs each) and one router, each component
with exactly its role's knobs. Tests render it; no host is contacted. Copy it, change the names, then:

    knobkeeper plan inventory/example_slurm.py       # "new job" and why, or "keep job N"
    pyinfra -y inventory/example_slurm.py deploy.py  # submit, gate each component where Slurm put it,
                                                     # then cancel the job it replaces
    knobkeeper status inventory/example_slurm.py

The engine runs from a venv on the shared filesystem ({prefix} is on it: the login node and every
compute node see the same path); the job writes its components' scripts, logs and placements under
{prefix}/slurm/. Data keys: knobkeeper/deploy/slurm/job.py.
"""

_login = (
    "login-1",
    {
        "ssh_hostname": "login-1.cluster.example.com",
        "ssh_user": "svc-llm",
        "ssh_key": "~/.ssh/knobkeeper_ed25519",
        "ssh_known_hosts_file": "~/.ssh/known_hosts",
        "prefix": "/lustre/serving/knobkeeper/deepseek-v3",
        "service_manager": "slurm",
        "slurm_partition": "h200",
        "slurm_account": "llm-serving",
        "slurm_time_limit": "7-00:00:00",
        "slurm_pending_timeout": 1800,
        "slurm_sbatch": ["--requeue"],
        "prefill_workers": 2,
        "decode_workers": 2,
        "prefill_slurm": {"cpus": 96, "mem": "1800G", "gpus": 8, "sbatch": ["--exclusive"]},
        "decode_slurm": {"cpus": 96, "mem": "1800G", "gpus": 8, "sbatch": ["--exclusive"]},
        "router_slurm": {"cpus": 8, "mem": "32G", "partition": "cpu"},
        "python": "{prefix}/venv/bin/python",
        "engines": {"prefill": "sglang==0.5.23", "decode": "sglang==0.5.23", "router": "sglang-router==0.3.2"},
        "model": "/lustre/models/DeepSeek-V3",
        "served_model_name": "deepseek-v3",
        "transfer_backend": "mooncake",
        "tp_size": 8,
        "engine_args": {
            "prefill": ["--trust-remote-code", "--mem-fraction-static", "0.85"],
            "decode": ["--trust-remote-code", "--mem-fraction-static", "0.85", "--cuda-graph-max-bs-decode", "128"],
            "router": ["--worker-startup-timeout-secs", "1800", "--health-check-interval-secs", "10"],
        },
        "environment": {"HF_HOME": "/lustre/models/hf-cache"},
        "stop_timeout": 120,
    },
)

prefill = [_login]
decode = [_login]
router = [_login]
