"""Slurm's own clients (sbatch, squeue, scontrol, scancel, sinfo), run on the login host, every call
with a timeout, their answers parsed into small typed rows. pyslurm has no build for 22.05, so the
CLI is the API; `squeue --json` ignores -j and --states in 22.05 and lists every job of the cluster,
so the parsable `-o` formats are used and filtered by job name here.

    client = Client(settings, run)      # run(command) -> output lines, on the login host
    client.jobs()                       # [Job]: this stack's jobs (by job name), newest first
    client.submit(script, digest)       # sbatch --parsable --comment=DIGEST SCRIPT -> job id
    client.test(path, script_path)      # sbatch --test-only PATH: Slurm's verdict, nothing submitted
    client.cancel(["12"])               # scancel
    client.batch_script("12")           # the script Slurm stored for the job (what it runs)
    client.partition("gpu")             # Partition(name, nodes, cpus, memory_mb, gres)

Examples of what the parsers read (22.05.8):

    squeue -h -t all --name=N -o 'kkjob|%A|%i|%T|%r|%N|%V|%S|%k|%j'
        kkjob|12|12+0|RUNNING|None|n1|2026-12-01T19:21:48|2026-12-01T19:21:48|sha256:...|knobkeeper-x
        kkjob|13|12+1|PENDING|Resources|||N/A|sha256:...|knobkeeper-x
    sinfo -h -o 'kkpart|%R|%D|%c|%m|%G|%a'
        kkpart|kk|3|2|4000|(null)|up
    scontrol show job -o 12   (one line per component: JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 ...)

A failed call raises SlurmError with one line: the tool, its own words, and the data key to fix
where the answer names one (partition, account, time, resources).
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from knobkeeper.deploy.slurm.job import Settings
from knobkeeper.errors import UserError

RunOnHost = Callable[[str], list[str]]
RC = "knobkeeper-rc="
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "RESIZING", "SIGNALING", "STAGE_OUT")
# Pending reasons that waiting will not cure: the job is refused in all but name.
HOPELESS = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "PartitionDown", "PartitionInactive",
            "AccountNotAllowed", "InvalidAccount", "InvalidQOS", "QOSNotAllowed", "BadConstraints",
            "DependencyNeverSatisfied", "JobHeldAdmin", "account not known", "not permitted to use this partition")
# sbatch's own words -> the data key that set them (Settings.field_of names the role's key).
REFUSALS = (("partition", "partition"), ("account", "account"), ("qos", "qos"), ("--time", "time"),
            ("time limit", "time"), ("memory", "mem"), ("node configuration", "resources"), ("gres", "gpus"),
            ("cpu", "cpus"), ("feature", "constraint"), ("constraint", "constraint"))


class SlurmError(UserError):
    """A Slurm client call failed or Slurm refused what was asked: one line, naming what to fix."""


@dataclass
class Component:
    """One component of a job as squeue lists it (a plain job has one)."""

    offset: int
    state: str
    reason: str
    nodes: str


@dataclass
class Job:
    id: str  # the job id (a heterogeneous job: its leader's)
    name: str
    digest: str  # the stack digest the deploy put in --comment
    submitted: str | None
    started: str | None
    components: list[Component] = field(default_factory=list)

    @property
    def state(self) -> str:
        """RUNNING when every component runs; else the first component's state that is not."""
        states = [c.state for c in sorted(self.components, key=lambda c: c.offset)]
        if states and all(s == "RUNNING" for s in states):
            return "RUNNING"
        for s in states:
            if s != "RUNNING":
                return s
        return "UNKNOWN"

    @property
    def active(self) -> bool:
        """Some component still pending, running or ending (a cancelled job is active until all are gone)."""
        return any(c.state in ACTIVE for c in self.components)

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING")

    @property
    def reason(self) -> str:
        reasons = [no_reason(c.reason) for c in self.components]
        return ", ".join(dict.fromkeys(r for r in reasons if r))

    def nodes(self, offset: int) -> str:
        for c in self.components:
            if c.offset == offset:
                return c.nodes
        return ""


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int
    cpus: int  # the most CPUs one node of it has
    memory_mb: int  # the most memory one node has
    gres: str
    up: bool


def no_reason(reason: str | None) -> str:
    """Slurm's reason, or "" where squeue and scontrol print their word for none ("None")."""
    return "" if reason in (None, "", "None", "(null)") else reason


def slurm_time(text: str | None) -> str | None:
    """Slurm's local-time stamp ("2026-12-01T19:21:48") as an ISO UTC time, or None (N/A, Unknown)."""
    if not text or not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$", text):
        return None
    local = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").astimezone()
    return local.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Client:
    def __init__(self, settings: Settings, run: RunOnHost) -> None:
        self.settings = settings
        self.run = run
        self.calls: list[tuple[str, float]] = []  # (tool, seconds): what the deploy's overhead is made of

    # --- one call ------------------------------------------------------------------------------------

    def command(self, tool: str, *args: str) -> str:
        """The shell line of one call. It carries names and options only, never a script's text: the
        whole line is one argument of `sh -c` (and of sshd's), which Linux caps at 128 KiB."""
        s = self.settings
        exe = f"{s.bin}/{tool}" if s.bin else tool
        env = f"SLURM_CONF={shlex.quote(s.conf)} " if s.conf else ""
        return f"{env}timeout -k 2 {s.timeout:g} {shlex.quote(exe)} {shlex.join(args)} 2>&1; echo \"{RC}$?\""

    def call(self, tool: str, *args: str, check: bool = True) -> tuple[int, list[str]]:
        started = time.monotonic()
        lines = self.run(self.command(tool, *args))
        self.calls.append((tool, time.monotonic() - started))
        rc, out = 255, []
        for line in lines:
            if line.startswith(RC):
                rc = int(line[len(RC):]) if line[len(RC):].isdigit() else 255
            else:
                out.append(line)
        if check and rc != 0:
            raise SlurmError(self.explain(tool, rc, out))
        return rc, out

    def explain(self, tool: str, rc: int, out: list[str]) -> str:
        s = self.settings
        if rc in (124, 137):
            return (f"slurm: {tool} on {s.host} did not answer within {s.timeout:g} s: slurmctld unreachable "
                    f"(SLURM_CONF={s.conf or 'the host default'}; data slurm_conf, slurm_timeout)")
        if rc == 127:
            return f"slurm: {tool} not found on {s.host} (install Slurm's clients there, or set data slurm_bin)"
        words = " ".join(" ".join(out).split()) or f"exit {rc}"
        if "contact slurm controller" in words or "Connection refused" in words:
            return (f"slurm: slurmctld unreachable from {s.host} ({tool}: {words[:160]}; "
                    f"SLURM_CONF={s.conf or 'the host default'}; data slurm_conf)")
        return f"slurm: {tool} failed on {s.host}: {words}"

    # --- what runs ---------------------------------------------------------------------------------------

    def jobs(self) -> list[Job]:
        """This stack's jobs that slurmctld still knows (active ones, and ended ones for MinJobAge),
        newest first."""
        fmt = "kkjob|%A|%i|%T|%r|%N|%V|%S|%k|%j"
        _, out = self.call("squeue", "-h", "-t", "all", f"--name={self.settings.job_name}", "-o", fmt)
        by_id: dict[str, Job] = {}
        for line in out:
            parts = line.split("|")
            if len(parts) != 10 or parts[0] != "kkjob" or parts[9] != self.settings.job_name:
                continue
            _, _own_id, ident, state, reason, nodes, submitted, started, comment, name = parts
            # %i is "12+1" for component 1 of heterogeneous job 12 (%A is each component's own id)
            leader, _, offset_text = ident.partition("+")
            offset = int(offset_text) if offset_text.isdigit() else 0
            job = by_id.setdefault(leader, Job(id=leader, name=name, digest=comment if comment != "(null)" else "",
                                               submitted=slurm_time(submitted), started=None))
            if offset == 0:
                job.started = slurm_time(started) if state in ("RUNNING", "COMPLETING") else job.started
            job.components.append(Component(offset=offset, state=state, reason=reason, nodes=nodes))
        return sorted(by_id.values(), key=lambda j: int(j.id) if j.id.isdigit() else 0, reverse=True)

    def show(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job -o ID`: one dict per component (JobState, Reason, ExitCode, NodeList, ...)."""
        rc, out = self.call("scontrol", "show", "job", "-o", job_id, check=False)
        rows = []
        for line in out if rc == 0 else []:
            fields = dict(m.group(1, 2) for m in re.finditer(r"(\w[\w/:]*)=(\S*)", line))
            if fields.get("JobId"):
                rows.append(fields)
        return rows

    def batch_script(self, job_id: str) -> str | None:
        rc, out = self.call("scontrol", "write", "batch_script", job_id, "-", check=False)
        return "\n".join(out) + "\n" if rc == 0 and out and out[0].startswith("#!") else None

    def partition_names(self) -> list[str]:
        _, out = self.call("sinfo", "-h", "-o", "kkpart|%R")
        return sorted({line.split("|", 1)[1] for line in out if line.startswith("kkpart|")})

    def partition(self, name: str | None) -> Partition | None:
        """The partition `name` (None: the default one), or None when Slurm does not know it."""
        _, out = self.call("sinfo", "-h", "-o", "kkpart|%P|%D|%c|%m|%G|%a")
        found: Partition | None = None
        for line in out:
            parts = line.split("|")
            if len(parts) != 7 or parts[0] != "kkpart":
                continue
            _, pname, nodes, cpus, memory, gres, avail = parts
            default = pname.endswith("*")
            pname = pname.rstrip("*")
            if (name is None and not default) or (name is not None and pname != name):
                continue
            row = Partition(pname, _int(nodes), _int(cpus), _int(memory), gres, avail == "up")
            if found is None:
                found = row
            else:
                found = Partition(pname, found.nodes + row.nodes, max(found.cpus, row.cpus),
                                  max(found.memory_mb, row.memory_mb), found.gres + "," + row.gres, found.up or row.up)
        return found

    # --- changes --------------------------------------------------------------------------------------------

    def submit(self, script_path: str, digest: str) -> str:
        rc, out = self.call("sbatch", "--parsable", f"--comment={digest}", script_path, check=False)
        ident = next((line.split(";", 1)[0] for line in reversed(out) if re.match(r"^\d+(;\S+)?$", line)), None)
        if rc == 0 and ident:
            return ident
        if rc in (124, 127, 137):
            raise SlurmError(self.explain("sbatch", rc, out))
        words = " ".join(line.replace("sbatch: error:", "").strip() for line in out if line.strip()) or f"exit {rc}"
        words = " ".join(words.split())
        raise SlurmError(f"slurm: sbatch refused job {self.settings.job_name} ({script_path}): {words}"
                         + _which_field(words, self.settings))

    def test(self, path: str, script_path: str) -> None:
        """`sbatch --test-only PATH` (a copy of the job script on the login host, to be deployed as
        `script_path`): Slurm's own verdict on it, nothing submitted."""
        rc, out = self.call("sbatch", "--test-only", path, check=False)
        if rc == 0:
            return
        if rc in (124, 127, 137):
            raise SlurmError(self.explain("sbatch", rc, out))
        words = " ".join(" ".join(line.replace("sbatch: error:", "").split()) for line in out if line.strip())
        raise SlurmError(f"slurm: sbatch --test-only refuses job {self.settings.job_name} ({script_path}): "
                         f"{words or f'exit {rc}'}" + _which_field(words, self.settings))

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            self.call("scancel", *job_ids)


def _int(text: str) -> int:
    digits = re.match(r"\d+", text or "")
    return int(digits.group(0)) if digits else 0


def _which_field(words: str, settings: Settings) -> str:
    low = words.lower()
    for needle, option in REFUSALS:
        if needle in low:
            if option == "resources":
                return " (data <role>_slurm: no node of the partition has what a component asks for)"
            return f" (data {settings.field_of(option)})"
    return ""
