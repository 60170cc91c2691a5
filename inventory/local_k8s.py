"""The stack on the local Kubernetes control plane (a real kube-apiserver and kube-controller-manager on
this machine, knobkeeper/deploy/kube/localcluster.py; the tests start one): three Deployments in
namespace `knobkeeper-local`, applied from this machine (@local) with kubectl.

    knobkeeper render inventory/local_k8s.py            # the manifests, as Argo CD would get them
    knobkeeper deploy inventory/local_k8s.py            # applied role by role, each gated on its rollout
    knobkeeper plan inventory/local_k8s.py              # which role rolls, and why
    knobkeeper status inventory/local_k8s.py            # declared vs live pod templates

What this control plane cannot show: it has no scheduler, kubelet or container runtime, so no pod
ever runs (the image below is never pulled). A deploy sees each controller make the new ReplicaSet
of a changed role and none for the others, and its gates say "applied; rollout not observable: no
nodes" instead of passing. On a real cluster the same inventory, with a real image, waits for every
pod to be available.

The kubeconfig: KNOBKEEPER_KUBECONFIG, default <repo>/.knobkeeper-state/kube/kubeconfig.
"""

import os as _os
from pathlib import Path as _Path

from knobkeeper.deploy.kube.localcluster import kubectl_binary as _kubectl

_ROOT = _Path(__file__).resolve().parent.parent

_stack = {
    "prefix": str(_ROOT / ".knobkeeper-state" / "k8s-stack"),
    "service_manager": "kubernetes",
    "kube_namespace": "knobkeeper-local",
    "kubeconfig": _os.environ.get("KNOBKEEPER_KUBECONFIG") or str(_ROOT / ".knobkeeper-state" / "kube" / "kubeconfig"),
    "kubectl": str(_kubectl()),
    "kube_image": "lmsysorg/sglang:v0.5.23",
    "prefill_kube": {"replicas": 1},
    "decode_kube": {"replicas": 1},
    "router_kube": {"replicas": 1},
    "kube_timeout": 30,
    "kube_rollout_timeout": 120,
    "engines": {"prefill": "sglang==0.5.23", "decode": "sglang==0.5.23", "router": "sglang-router==0.3.2"},
    "python": "python3",
    "model": "/models/tiny",
    "served_model_name": "knobkeeper-tiny",
    "transfer_backend": "mooncake",
}

prefill = [("@local", _stack)]
decode = [("@local", _stack)]
router = [("@local", _stack)]
