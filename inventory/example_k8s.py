"""An example Kubernetes inventory: the SGLang PD stack as three Deployments (prefill, decode, the
router) in namespace `llm`, applied from the machine kubectl runs on. Tests render and validate it;
no cluster is contacted. Copy it, change the image, the model and the resources, then either

    knobkeeper render inventory/example_k8s.py --write   # manifests/example_k8s/*.yaml for Argo CD or Flux
    knobkeeper deploy inventory/example_k8s.py           # or apply them here: role by role, each gated

A knob change on decode changes decode's pod template only: only decode rolls (`knobkeeper plan` says so).
"""

_stack = {
    "prefix": "/var/lib/knobkeeper",
    "service_manager": "kubernetes",
    "kube_namespace": "llm",
    # "kubeconfig": "~/.kube/prod.yaml", "kube_context": "prod",   # default: kubectl's own
    "kube_image": {"prefill": "lmsysorg/sglang:v0.5.23", "decode": "lmsysorg/sglang:v0.5.23",
                   "router": "lmsysorg/sglang:v0.5.23"},
    "kube_shape": "deployments",
    "prefill_kube": {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}},
    "decode_kube": {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}},
    "router_kube": {"replicas": 1, "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
    "kube_rollout_timeout": 1800,
    # The engine and its version per role, in one place (the image above carries them).
    "engines": {"prefill": "sglang==0.5.23", "decode": "sglang==0.5.23", "router": "sglang-router==0.3.2"},
    "python": "python3",   # the image's interpreter
    "model": "/models/DeepSeek-V3",
    "served_model_name": "deepseek-v3",
    "transfer_backend": "mooncake",
    "tp_size": 8,
    "prefill_port": 30000,
    "prefill_bootstrap_port": 8998,
    "decode_port": 30001,
    "router_port": 8000,
    "router_metrics_port": 29000,
    "engine_args": {
        "prefill": ["--trust-remote-code", "--mem-fraction-static", "0.85"],
        "decode": ["--trust-remote-code", "--mem-fraction-static", "0.85", "--cuda-graph-max-bs-decode", "128"],
        "router": ["--worker-startup-timeout-secs", "1800", "--health-check-interval-secs", "10"],
    },
    "stop_timeout": 120,
    "environment": {"HF_HOME": "/models/hf-cache"},
}

# One host, in every role's group: the machine kubectl runs on (@local, or a bastion over SSH).
prefill = [("@local", _stack)]
decode = [("@local", _stack)]
router = [("@local", _stack)]
