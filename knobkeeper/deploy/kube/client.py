"""kubectl, run on the stack's kubectl host, every call with a timeout, its answers parsed: the CLI
users already have and trust is the API (the kubeconfig, its contexts and credentials stay theirs).

    kube = Kubectl(settings, run)                    # run(command) -> output lines, on that host
    kube.apply("/opt/kk/kubernetes/decode.yaml")     # server-side apply, field manager "knobkeeper"
    kube.get("deployment", "knobkeeper-decode")      # the live object (dict), or None when absent
    kube.objects("replicaset", selector)             # [dict]
    kube.undo("knobkeeper-decode", revision=2)       # kubectl rollout undo --to-revision
    kube.nodes()                                     # how many nodes the cluster has (a rollout needs one)

A failed call raises KubeError with one line: kubectl's own words and what to fix (the API server
unreachable: data kubeconfig / kube_context; unauthorised: the credentials; a CRD missing: its name).
stdout and stderr are told apart on the host (stderr lines are prefixed), so a warning on stderr
never breaks the JSON of stdout.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Any, Callable

from knobkeeper.deploy.kube.settings import Settings
from knobkeeper.errors import UserError

RunOnHost = Callable[[str], list[str]]
RC = "knobkeeper-rc="
ERR = "knobkeeper-err: "
FIELD_MANAGER = "knobkeeper"


def split_output(lines: list[str]) -> tuple[int, list[str], list[str]]:
    """(exit status, stdout lines, stderr lines) of a command wrapped by Kubectl.command."""
    rc, out, err = 255, [], []
    for line in lines:
        if line.startswith(RC):
            rc = int(line[len(RC):]) if line[len(RC):].isdigit() else 255
        elif line.startswith(ERR):
            err.append(line[len(ERR):])
        else:
            out.append(line)
    return rc, out, err


class KubeError(UserError):
    """A kubectl call failed or the API server refused what was asked: one line, naming what to fix."""


class Kubectl:
    def __init__(self, settings: Settings, run: RunOnHost) -> None:
        self.settings = settings
        self.run = run
        self.calls: list[tuple[str, float]] = []

    def command(self, *args: str) -> str:
        s = self.settings
        base = [s.kubectl]
        if s.kubeconfig:
            base += ["--kubeconfig", s.kubeconfig]
        if s.context:
            base += ["--context", s.context]
        base += [f"--request-timeout={max(1, int(s.timeout))}s"]
        line = shlex.join([*base, *args])
        return (f"e=$(mktemp); timeout -k 2 {s.timeout:g} {line} 2>\"$e\"; rc=$?; "
                f"sed 's/^/{ERR}/' \"$e\"; rm -f \"$e\"; echo \"{RC}$rc\"")

    def call(self, *args: str, check: bool = True) -> tuple[int, list[str], list[str]]:
        started = time.monotonic()
        lines = self.run(self.command(*args))
        self.calls.append((args[0] if args else "", time.monotonic() - started))
        rc, out, err = split_output(lines)
        if check and rc != 0:
            raise KubeError(self.explain(args, rc, out, err))
        return rc, out, err

    def explain(self, args: tuple[str, ...], rc: int, out: list[str], err: list[str]) -> str:
        s = self.settings
        words = " ".join(" ".join(err or out).split()) or f"exit {rc}"
        what = "kubectl " + " ".join(a for a in args[:2] if not a.startswith("-"))
        where = f"on {s.host}" + (f" (kubeconfig {s.kubeconfig})" if s.kubeconfig else "")
        if rc in (124, 137):
            return f"kubernetes: {what} {where} did not answer within {s.timeout:g} s (data kube_timeout, kubeconfig)"
        if rc == 127:
            return f"kubernetes: {s.kubectl} not found on {s.host} (install kubectl there, or set data kubectl)"
        if any(w in words for w in ("Unauthorized", "must be logged in", "provide credentials")) \
                or "forbidden" in words.lower():
            return (f"kubernetes: the API server refused the credentials {where}: {words} (the kubeconfig's "
                    f"user and token; data kubeconfig, kube_context)")
        if any(w in words for w in ("connection refused", "was refused", "no such host", "Unable to connect",
                                    "dial tcp", "i/o timeout")):
            return f"kubernetes: the API server is unreachable {where}: {words} (data kubeconfig, kube_context)"
        return f"kubernetes: {what} {where}: {words}"

    def json(self, *args: str) -> Any:
        _, out, _ = self.call(*args, "-o", "json")
        try:
            return json.loads("\n".join(out))
        except ValueError:
            raise KubeError(f"kubernetes: kubectl {' '.join(args[:2])}: not JSON: {' '.join(out)[:200]}") from None

    # --- what the deploy, plan and status ask ------------------------------------------------------

    def reachable(self) -> None:
        """The API server answers and the credentials may read and apply in the namespace (one line if not)."""
        self.call("version", "-o", "json")
        ns = self.settings.namespace
        for verb, resource in (("get", "deployments"), ("patch", "deployments"), ("create", "services")):
            rc, out, err = self.call("auth", "can-i", verb, resource, "-n", ns, check=False)
            if rc != 0 or (out and out[-1].strip() != "yes"):
                raise KubeError(f"kubernetes: the kubeconfig's user may not {verb} {resource} in namespace {ns} "
                                f"on {self.settings.host} ({' '.join(err or out) or 'no'}): nothing was applied")

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        rc, out, err = self.call("get", kind, name, "-n", self.settings.namespace, "-o", "json", "--ignore-not-found",
                                 check=False)
        if rc != 0:
            raise KubeError(self.explain(("get", kind), rc, out, err))
        text = "\n".join(out).strip()
        return json.loads(text) if text else None

    def objects(self, kind: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return list(self.json("get", kind, "-n", self.settings.namespace, "-l", labels).get("items") or [])

    def ensure_namespace(self) -> bool:
        """Create the namespace when it is absent; True when it was created."""
        rc, out, err = self.call("get", "namespace", self.settings.namespace, "-o", "name", check=False)
        if rc == 0:
            return False
        if not any("NotFound" in line or "not found" in line for line in err):
            raise KubeError(self.explain(("get", "namespace"), rc, out, err))
        self.call("create", "namespace", self.settings.namespace)
        return True

    def apply(self, path: str, *, dry_run: str | None = None) -> list[str]:
        """Server-side apply of the file on the host: the lines kubectl printed ("deployment.apps/x configured")."""
        args = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts", "-f", path]
        if dry_run:
            args.append(f"--dry-run={dry_run}")
        return self.call(*args)[1]

    def undo(self, name: str, revision: int | None) -> list[str]:
        args = ["rollout", "undo", f"deployment/{name}", "-n", self.settings.namespace]
        if revision:
            args.append(f"--to-revision={revision}")
        return self.call(*args)[1]

    def nodes(self) -> int:
        return len(self.json("get", "nodes").get("items") or [])

    def crd_present(self, name: str) -> bool:
        rc, _, _ = self.call("get", "crd", name, "-o", "name", check=False)
        return rc == 0

    def secret_from_files(self, name: str, files: dict[str, str]) -> None:
        """Create or replace the Secret `name` from {key: path on the host} (values never in a manifest)."""
        args = ["create", "secret", "generic", name, "-n", self.settings.namespace]
        args += [f"--from-file={key}={path}" for key, path in sorted(files.items())]
        rc, out, err = self._pipe(args)
        if rc != 0:
            raise KubeError(self.explain(("create", "secret"), rc, out, err))

    def _pipe(self, create: list[str]) -> tuple[int, list[str], list[str]]:
        """`kubectl create ... --dry-run=client -o yaml | kubectl apply --server-side -f -`, its status checked."""
        s = self.settings
        base = [s.kubectl] + (["--kubeconfig", s.kubeconfig] if s.kubeconfig else []) + (
            ["--context", s.context] if s.context else [])
        first = shlex.join([*base, *create, "--dry-run=client", "-o", "yaml"])
        second = shlex.join([*base, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts",
                             "-f", "-"])
        lines = self.run(f"e=$(mktemp); {{ {first} | timeout -k 2 {s.timeout:g} {second}; }} 2>\"$e\"; rc=$?; "
                         f"sed 's/^/{ERR}/' \"$e\"; rm -f \"$e\"; echo \"{RC}$rc\"")
        return split_output(lines)
