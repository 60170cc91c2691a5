"""An experiment that switches the stack's arms (`ab run`, `sweep`), marked while it runs, so that
neither a crash nor a kill leaves a candidate running unseen (knobkeeper.deploy.experiment_state).

`Experiment(project, ...)` is a context manager around the measuring:

- entering refuses to start while an earlier experiment is abandoned (its marker names it), takes
  the experiments' lock and writes the marker BEFORE the first switch;
- `marked(harness)` is the harness whose switches stamp the arm in the marker before deploying it
  (a kill during that deploy leaves the arm named) and whose restore says "put-back" while it runs;
- `journal(searched, **more)` keeps the runs measured so far in the marker (after every arm's block);
- leaving with success clears the marker; leaving by Ctrl-C or SIGTERM (KeyboardInterrupt under
  `terminate_as_interrupt`) puts the declared state back at once if the measuring had not, writes the
  runs measured so far as evidence marked "interrupted" (`interrupted` in the file: by, at, blocks)
  and raises `Interrupted` with one line saying what was done; leaving by an error puts the stack back
  too. A put-back that fails leaves the marker: the next command says "abandoned".
- SIGKILL runs none of this: the marker stays with its lock free, and `knobkeeper ab abort` (`abort`)
  deploys the role back to the declared state and writes the journal's runs as interrupted evidence.

`partial(journal, by, at) -> Evidence | None` is the experiment kind's own: it builds the evidence of
the runs in a journal (knobkeeper.evidence.ab.partial_doc, knobkeeper.evidence.sweep.partial_doc),
the same for an interrupted run and for an abort after a kill.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from typing import Any, Callable, Mapping

from knobkeeper.deploy import api as deploy_api, experiment_state
from knobkeeper.deploy.experiment_state import ExperimentMarker
from knobkeeper.errors import UserError
from knobkeeper.evidence.model import Arm, Evidence
from knobkeeper.evidence.search import Harness, Searched
from knobkeeper.timeutil import iso, utcnow

Partial = Callable[[Mapping[str, Any], str, str], "Evidence | None"]


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped an experiment: `line` says what was put back and what was written."""

    def __init__(self, line: str, doc: Evidence | None = None):
        super().__init__(line)
        self.line, self.doc = line, doc


def refuse_if_abandoned(project) -> None:
    """UserError naming an abandoned experiment (the stack may still run one of its arms)."""
    line = experiment_state.abandoned_line(project)
    if line:
        raise UserError(line)


def interrupted_by(stop: BaseException) -> str:
    return "SIGTERM" if str(stop) == f"signal {signal.SIGTERM}" else "Ctrl-C" if not str(stop) else str(stop)


class Experiment:
    """See the module doc. `context`: the journal's fixed part (what `partial` needs besides the runs);
    `write(doc) -> path`: how the kind writes its evidence (store.write, committed)."""

    def __init__(self, project, *, kind: str, knob: str, role: str, scope: str, inventory: str | None,
                 arms: Mapping[str, Mapping], context: Mapping[str, Any], partial: Partial,
                 write: Callable[[Evidence], Any], plan: str | None = None):
        self.project, self.kind, self.partial, self.write = project, kind, partial, write
        self.marker = ExperimentMarker(kind=kind, knob=knob, role=role, scope=scope, inventory=inventory,
                                       arms={k: Arm.of(dict(v)) for k, v in arms.items()}, plan=plan,
                                       pid=os.getpid(), journal={**context, "searched": None})
        self.restored = False
        self.handle = None
        self.harness: Harness | None = None

    def __enter__(self) -> "Experiment":
        refuse_if_abandoned(self.project)
        self.handle = experiment_state.hold(self.project)
        now = iso(utcnow())
        self.marker.started_at = self.marker.seen_at = now
        experiment_state.write_marker(self.project, self.marker)
        return self

    def marked(self, harness: Harness) -> Harness:
        """`harness` whose switches name their arm in the marker first and whose restore is tracked."""
        self.harness = harness

        def switch_arm(arm: dict) -> None:
            name = next((k for k, v in self.marker.arms.items() if dict(v.knobs) == dict(arm["knobs"])), None)
            self._stamp(arm=name, phase="measuring")
            self.restored = False
            harness.switch_arm(arm)

        def restore() -> None:
            self._stamp(phase="put-back")
            harness.restore()
            self.restored = True
            self._stamp(arm=None, phase="restored")

        return replace(harness, switch_arm=switch_arm, restore=restore)

    def journal(self, searched: Searched, **more: Any) -> None:
        self._stamp(journal={**self.marker.journal, "searched": searched.to_json(), **more})

    def _stamp(self, **changes: Any) -> None:
        self.marker = replace(self.marker, **changes, seen_at=iso(utcnow()))
        experiment_state.write_marker(self.project, self.marker)

    def put_back(self) -> None:
        """The declared state back, if the measuring did not restore it yet."""
        if not self.restored and self.harness is not None and self.marker.arm is not None:
            self.marked(self.harness).restore()
        elif self.marker.arm is None:
            self.restored = True   # no arm was ever switched to: nothing to put back

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                experiment_state.clear_marker(self.project)
                return False
            if issubclass(exc_type, KeyboardInterrupt):
                self._interrupted(exc)
            try:
                self.put_back()
            except UserError:
                pass   # the original error is the one to say; the marker stays (put back not done)
            if self.restored:
                experiment_state.clear_marker(self.project)
            return False
        finally:
            experiment_state.release(self.project, self.handle)

    def _interrupted(self, stop: BaseException) -> None:
        by, at = interrupted_by(stop), iso(utcnow())
        try:
            self.put_back()
        except UserError as exc:
            raise Interrupted(f"{self.kind} of {self.marker.knob} stopped by {by}: the put-back failed ({exc}); role "
                              f"{self.marker.role} may still run an arm: put it back with `knobkeeper ab abort`") from None
        doc, written = None, "no evidence written (no run finished)"
        try:
            doc = self.partial(self.marker.journal, by, at)
        except UserError as exc:
            written = f"no evidence written ({exc})"
        if doc is not None:
            path = self.write(doc)
            written = f"the {len(doc.runs) + (len(doc.sweep.runs) if doc.sweep else 0)} runs measured kept as " \
                      f"evidence {doc.id} marked interrupted ({self.project.rel(path)})"
        experiment_state.clear_marker(self.project)
        raise Interrupted(f"{self.kind} of {self.marker.knob} stopped by {by}: role {self.marker.role} put back to "
                          f"the declared state; {written}", doc)


def abort(project, partial_of: Callable[[str], Partial],
          write: Callable[[Evidence], Any]) -> tuple[ExperimentMarker, Any, Evidence | None]:
    """`knobkeeper ab abort`: deploy the role an abandoned experiment left on an arm back to the
    declared state (recorded as a deploy), write the runs of its journal as evidence marked
    interrupted, remove its marker; (the marker, the deploy result, the evidence or None).
    `partial_of(kind)`: the kind's partial-evidence builder."""
    data = experiment_state.abandoned(project)
    if data is None:
        running = experiment_state.read_marker(project)
        if running is not None:
            raise UserError(f"ab abort: the {running.kind} of {running.knob} is still running (pid "
                            f"{running.pid}); stop it (Ctrl-C puts the stack back)")
        raise UserError("ab abort: no abandoned ab run or sweep in this repo (nothing to put back)")
    handle = experiment_state.hold(project)
    try:
        result = deploy_api.run_deploy(project, data.inventory, only=data.role)
        if not result.ok:
            raise UserError(f"ab abort: the deploy of role {data.role} back to the declared state failed "
                            f"({result.error}); run `knobkeeper deploy {data.inventory} --only {data.role}`")
        doc = None
        if data.journal.get("searched"):
            doc = partial_of(data.kind)(data.journal, "SIGKILL (abandoned)", str(data.seen_at))
            if doc is not None:
                write(doc)
        experiment_state.clear_marker(project)
        return data, result, doc
    finally:
        experiment_state.release(project, handle)
