"""The Kubernetes deploy target (deploy/target.py's third kind): each role a Deployment in one
namespace, applied from the host where kubectl runs, a change rolling only the role whose pod template
it changes. Layer: deploy (its targets); nothing outside deploy/target.py names this package.

    settings.py      the inventory's data of the kubectl host, checked (one line per problem)
    manifests.py     the manifests per role, rendered from what deploy/render.py rendered per service
    validate.py      strict offline validation (kubernetes-validate's schemas; CRDs' own)
    client.py        kubectl on that host, with timeouts, its answers parsed, its errors one line
    ops.py           the deploy run: preflight, upload, apply role by role, gate each rollout, rollback
    live.py          the live workloads: plan (which role rolls, why), status and drift, started knobs
    target.py        the Target the rest of the controller calls
    build.py         kube-apiserver and kube-controller-manager built once per machine (for tests, demos)
    localcluster.py  a local control plane: etcd, the apiserver, the controller-manager
"""
