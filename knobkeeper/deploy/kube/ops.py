"""The deploy of a Kubernetes stack, inside pyinfra: deploy.py calls `run.target_run.operations(plan)`,
a KubeRun for the kubectl host (deploy/kube/target.py), instead of the per-host restarts.

    preflight     while deploy.py loads: the API server answers, the kubeconfig's user may apply in
                  the namespace, the CRDs the shape needs are installed (one line naming what is
                  missing; nothing applied)
    upload        each role's manifest to {prefix}/kubernetes/<role>.yaml on the kubectl host
    namespace     created when absent; the role's secret knobs as a Secret (values never in a manifest)
    apply ROLE    per role in deploy order: `kubectl apply --server-side` of its manifest. The API
                  server, not knobkeeper, decides what rolls: a changed pod template makes a new
                  ReplicaSet, an unchanged one makes nothing (scaling included). Recorded: the
                  generation and revision before and after, the ReplicaSet of the new revision
    gate ROLE     the Deployment's controller saw the applied generation (observedGeneration), then
                  every replica updated and available with no old pod left (the router's pods are
                  available when its readiness probe passes). A cluster with no node cannot run a
                  pod: the gate says "applied; rollout not observable: no nodes" instead of passing,
                  and the run goes on. A rollout that does not complete within kube_rollout_timeout,
                  or that its controller declares stuck (ProgressDeadlineExceeded), fails the gate:
                  the old ReplicaSet keeps serving (maxUnavailable 0), and with --data rollback=true
                  `kubectl rollout undo` puts the previous revision back (recorded). The run stops:
                  nothing downstream is applied.

restart=none uploads only; restart=co rolls every role (`kubectl rollout restart`) in order, gated;
only=ROLE applies that role's manifest and gates it and the roles after it; batch=N does not apply
(a Deployment rolls one surge pod at a time).
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

from pyinfra import host as current_host
from pyinfra.operations import files, python

from knobkeeper.changelog.secrets import secret_path
from knobkeeper.deploy.health import PROGRESS_EVERY_S, QUIET_S
from knobkeeper.deploy.kube.client import Kubectl, KubeError
from knobkeeper.deploy.kube.live import Live, container_of, env_of, observe, role_plan, wanted_deployment
from knobkeeper.deploy.kube.manifests import CONTAINER, knob_secret_name, required_crds
from knobkeeper.deploy.kube.settings import settings_of
from knobkeeper.deploy.onhost import GateFailed, on_host, say
from knobkeeper.deploy.record import KubeApply, KubeRecord, Rollback
from knobkeeper.errors import UserError
from knobkeeper.timeutil import iso, utcnow

POLL_S = 0.5
NO_NODES = "applied; rollout not observable: no nodes"
DECISIONS = {"restart": "rolls", "start": "created", "unchanged": "unchanged"}
ACTIONS = {"restart": "restarted", "start": "started", "unchanged": "unchanged"}


class KubeRun:
    """The Kubernetes target's part of one deploy run (KubeTarget.begin, while deploy.py loads)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.stack = run.stack
        self.settings = settings_of(self.stack)
        if run.options.batch:
            raise UserError(f"--data batch={run.options.batch}: a Kubernetes role rolls one surge pod at a time "
                            f"(maxSurge 1, maxUnavailable 0); batches do not apply")
        self.kube: Kubectl | None = None
        self.record = KubeRecord(namespace=self.settings.namespace, shape=self.settings.shape)
        run.record.kubernetes = self.record
        self.before: dict[str, Live] = {}
        for svc in self.stack.services:
            self.record.applies.append(KubeApply(role=svc.role, service=svc.name))
        if run.options.restart != "none":
            self.preflight()

    def _kube(self) -> Kubectl:
        if self.kube is None:
            self.kube = Kubectl(self.settings, lambda command: on_host()(command))
        return self.kube

    def preflight(self) -> None:
        kube = self._kube()
        kube.reachable()
        for crd in required_crds(self.settings.shape):
            if not kube.crd_present(crd):
                raise UserError(f"kubernetes: the CRD {crd} is not installed on the API server of {self.settings.host} "
                                f"(install it: `knobkeeper kube crds | kubectl apply -f -`, or LWS's own release); "
                                f"nothing was applied")

    # --- the operations ------------------------------------------------------------------------------

    def operations(self, plan: Any) -> None:
        s = self.settings
        files.directory(name="knobkeeper: kubernetes manifests folder", path=s.upload_dir, present=True)
        for role in current_host.loop(self.run.order):
            text = self._manifest(role)
            files.put(name=f"knobkeeper: {s.upload_dir}/{role}.yaml", src=io.StringIO(text),
                      dest=f"{s.upload_dir}/{role}.yaml", mode="644", create_remote_dir=True)
            # A secret knob's value travels as a file (0600), never on a command line (`ps` shows those).
            for knob, (local, remote) in current_host.loop(sorted(self._secret_files(role).items())):
                files.put(name=f"knobkeeper: secret {knob} of {role}", src=str(local), dest=remote, mode="600",
                          create_remote_dir=True)
        python.call(name=f"knobkeeper: namespace {s.namespace}", function=self.namespace)
        for role in current_host.loop(self.run.order):
            python.call(name=f"knobkeeper: apply {role} (kubernetes)", function=self.apply, role=role)
            python.call(name=f"knobkeeper: gate {role} (kubernetes)", function=self.gate, role=role)
        python.call(name="knobkeeper: kubernetes: the calls", function=self._note_calls)

    def _manifest(self, role: str) -> str:
        svc = next(s for s in self.stack.services if s.role == role)
        return next(iter(self.run.rendered[(svc.host, svc.name)].files.values()))

    def namespace(self) -> None:
        if self.run.options.restart == "none":
            return
        kube = self._kube()
        try:
            if kube.ensure_namespace():
                say(f"created namespace {self.settings.namespace}")
            self.record.nodes = kube.nodes()
            for role in self.run.order:
                self._secrets(kube, role)
        except KubeError as exc:
            self._fail(str(exc))

    def _secret_files(self, role: str) -> dict[str, tuple[Any, str]]:
        """{knob: (the value's file in the local store, its path on the kubectl host)} of the role's secret knobs."""
        out: dict[str, tuple[Any, str]] = {}
        for svc in self.stack.services:
            rendered = self.run.rendered[(svc.host, svc.name)]
            if svc.role != role:
                continue
            for _, (scope, knob) in sorted(rendered.secrets.items()):
                local = secret_path(self.run.project, scope, knob, rendered.knobs[knob])
                out[knob] = (local, f"{self.settings.upload_dir}/secrets/{role}/{knob}")
        return out

    def _secrets(self, kube: Kubectl, role: str) -> None:
        """The role's secret knobs as one Secret, from the files uploaded (0600) beside the manifests."""
        files = {knob: remote for knob, (_, remote) in self._secret_files(role).items()}
        if files:
            kube.secret_from_files(knob_secret_name(self.stack, role), files)

    # --- apply -----------------------------------------------------------------------------------------

    def apply(self, role: str) -> None:
        options = self.run.options
        services = [s for s in self.stack.services if s.role == role]
        for svc in services:
            self.run.row(svc).reason = "not run"
        if options.restart == "none" or role not in self.run.scope:
            for svc in services:
                row = self.run.row(svc)
                row.action = "unchanged"
                row.reason = ("restart=none: manifest uploaded, nothing applied" if options.restart == "none"
                              else f"not in only={options.only}")
            return
        kube = self._kube()
        try:
            self.before.update(observe(kube, self.stack, services))
            decided = role_plan(self.before, services, self.run.rendered, options.restart)
            for svc in services:
                action, reason, changes = decided[svc.name]
                row, rec, live = self.run.row(svc), self.record.apply_of(svc.name), self.before[svc.name]
                row.action, row.reason, row.changes = ACTIONS[action], reason, changes
                row.previous_digest = live.digest
                rec.decision = "co-restart" if options.restart == "co" and live.deployment else DECISIONS[action]
                rec.generation_before, rec.revision_before = (live.generation or None), live.revision
            issued = iso(utcnow())
            lines = kube.apply(f"{self.settings.upload_dir}/{role}.yaml")
            if options.restart == "co":
                for svc in services:
                    if self.before[svc.name].deployment is not None:
                        kube.call("rollout", "restart", f"deployment/{svc.name}", "-n", self.settings.namespace)
            for svc in services:
                self._put_back_env(kube, svc)
        except KubeError as exc:
            self._fail(str(exc))
        for svc in services:
            row, rec = self.run.row(svc), self.record.apply_of(svc.name)
            rec.applied_at = issued
            if row.acted:
                row.restart_issued_at = issued
        say(f"applied {role}: " + "; ".join(" ".join(line.split()) for line in lines))

    def _put_back_env(self, kube: Kubectl, svc: Any) -> None:
        """A variable another field manager added (`kubectl set env` by hand) survives a server-side
        apply, which removes only what its own manager set before: the declared env is put back whole
        (a JSON patch of the container's env), so the pods get exactly what knobs.toml says."""
        live = observe(kube, self.stack, [svc])[svc.name]
        want = wanted_deployment(self.run.rendered[(svc.host, svc.name)])["spec"]["template"]
        if live.deployment is None or env_of(live.template) == env_of(want):
            return
        containers = (live.template.get("spec") or {}).get("containers") or []
        index = next((i for i, c in enumerate(containers) if c.get("name") == CONTAINER), 0)
        patch = [{"op": "replace", "path": f"/spec/template/spec/containers/{index}/env",
                  "value": container_of(want).get("env") or []}]
        kube.call("patch", f"deployment/{svc.name}", "-n", self.settings.namespace, "--type=json",
                  "-p", json.dumps(patch))
        say(f"{svc.name}: put back the declared env (a variable set by hand survived the apply)")

    # --- gates -----------------------------------------------------------------------------------------

    def gate(self, role: str) -> None:
        for svc in self.stack.services:
            if svc.role != role:
                continue
            row = self.run.row(svc)
            if self.run.options.restart == "none" or role not in self.run.gated:
                row.gate.result = "skipped"
                continue
            started = time.monotonic()
            try:
                status, result = self._wait(svc)
            except _GateError as exc:
                row.gate.result, row.gate.status = "failed", str(exc)
                row.gate.seconds, row.gate.checked_at = round(time.monotonic() - started, 3), iso(utcnow())
                self.record.apply_of(svc.name).rollout = f"failed: {exc}"
                error = f"gate failed: {role}: Deployment {svc.name} in namespace {self.settings.namespace}: {exc}"
                self._fail(error + self._roll_back(svc), gate=True)
            row.gate.result, row.gate.status = result, status
            row.gate.seconds, row.gate.checked_at = round(time.monotonic() - started, 3), iso(utcnow())
            if row.acted and result == "passed":
                row.healthy_at = row.gate.checked_at
            say(f"{role}: Deployment {svc.name}: {status}")

    def _wait(self, svc: Any) -> tuple[str, str]:
        """(status words, gate result) once the rollout of `svc` is complete or cannot be observed."""
        kube = self._kube()
        rec = self.record.apply_of(svc.name)
        began = time.monotonic()
        deadline = began + self.settings.rollout_timeout
        next_say = began + QUIET_S
        last = "not checked"
        while True:
            try:
                live = observe(kube, self.stack, [svc])[svc.name]
            except KubeError as exc:
                raise _GateError(str(exc)) from None
            now = time.monotonic()
            if live.deployment is None:
                raise _GateError("the Deployment is gone (deleted while the run waited?)")
            if live.observed >= live.generation:
                if rec.observed_at is None:
                    rec.observed_at, rec.generation, rec.revision = iso(utcnow()), live.generation, live.revision
                    rs = live.replica_set(live.revision)
                    rec.replica_set = (rs or {}).get("metadata", {}).get("name")
                if rec.replica_set is None:  # the controller names the new ReplicaSet right after observing
                    rs = live.replica_set(live.revision)
                    rec.replica_set = (rs or {}).get("metadata", {}).get("name")
                if not self.record.nodes:
                    rec.rollout = NO_NODES
                    return f"{NO_NODES} (generation {live.generation} observed, revision {live.revision}, "\
                           f"ReplicaSet {rec.replica_set})", "unobservable"
                spec, status = live.deployment["spec"], live.deployment.get("status") or {}
                want = int(spec.get("replicas", 1))
                done = (int(status.get("updatedReplicas") or 0) >= want and int(status.get("availableReplicas") or 0)
                        >= want and int(status.get("replicas") or 0) == want)
                stuck = [c for c in status.get("conditions") or []
                         if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"]
                if done:
                    rec.rollout = "complete"
                    return f"rolled out: {want}/{want} available at revision {live.revision}", "passed"
                if stuck:
                    raise _GateError(f"its controller says the rollout is stuck: {stuck[0].get('message')}")
                last = (f"{status.get('updatedReplicas') or 0} updated, {status.get('availableReplicas') or 0} "
                        f"available of {want}")
            else:
                last = f"controller has not seen generation {live.generation} yet (observed {live.observed})"
            if now >= deadline:
                raise _GateError(f"rollout not complete after {self.settings.rollout_timeout:g} s "
                                 f"(data kube_rollout_timeout): {last}")
            if now >= next_say:
                say(f"waiting for {svc.name} ({now - began:.0f} s of {self.settings.rollout_timeout:g} s): {last}")
                next_say = now + PROGRESS_EVERY_S
            time.sleep(POLL_S)

    def _roll_back(self, svc: Any) -> str:
        """With --data rollback=true: `rollout undo` to the revision that served before the apply."""
        row, rec = self.run.row(svc), self.record.apply_of(svc.name)
        previous = rec.revision_before
        if not row.acted or previous is None:
            return "; nothing to roll back to (the Deployment is new)" if row.acted else ""
        if not self.run.options.rollback:
            return (f"; revision {previous}'s pods keep serving (maxUnavailable 0); `--data rollback=true` "
                    f"or `kubectl rollout undo deployment/{svc.name} -n {self.settings.namespace}` puts it back")
        row.rollback = Rollback(restart_issued_at=iso(utcnow()))
        try:
            self._kube().undo(svc.name, previous)
        except KubeError as exc:
            row.rollback.status = str(exc)
            return f"; rollback to revision {previous} failed: {exc}"
        row.rollback.result, row.rollback.digest = "rolled back", row.previous_digest
        row.rollback.status = f"rollout undo to revision {previous}"
        rec.rolled_back_to = previous
        return f"; rolled back: `kubectl rollout undo` to revision {previous} (recorded)"

    def _note_calls(self) -> None:
        if self.kube is not None:
            self.record.client_calls = len(self.kube.calls)
            self.record.client_seconds = round(sum(t for _, t in self.kube.calls), 3)

    def _fail(self, error: str, gate: bool = False) -> None:
        self._note_calls()
        self.run.error = self.run.error or error
        raise GateFailed(error) if gate else UserError(error)


class _GateError(Exception):
    pass

