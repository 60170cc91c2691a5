"""A real Slurm cluster on this machine: munged, slurmctld and N slurmd (Debian's slurm-wlm 22.05),
everything under one folder (key, state, spool, logs, pid files), loopback only, free ports.

    cluster = start_cluster(root)      # munge key + munged, slurm.conf, slurmctld, slurmd n1..n3
    cluster.client("sinfo", "-h")      # any Slurm client, SLURM_CONF set, with a timeout
    stop_cluster(root)                 # cancel every job, wait for its steps, stop daemons by PID

Used by the tests (tests/slurm.py), `make demo TARGET=slurm` / `make stop`, and bench/bench_slurm.py.
The facts it rests on (docs/platform-notes.md, "A real Slurm on one machine"):

- Several slurmd on one host (`NodeName=n1..nN`, each with its own `Port=`, all `NodeAddr=127.0.0.1`),
  because a heterogeneous job never starts on ONE node (the scheduler serialises its components).
- munged runs as the munge user with its own key (mode 400) and socket folder (mode 755: clients
  need to reach the socket); Slurm finds it through `AuthInfo=socket=...`.
- Daemons run in the foreground (`-D`, `-F`) in their own session; stopped by the PIDs their pid
  files name (each checked against its command line first: a pid file can outlive its process).
- Job processes are NOT children of slurmd: stopping the daemons first would leave every job's
  processes running. So `stop_cluster` cancels every job and waits until no slurmstepd of this
  cluster is left, then stops the slurmd, slurmctld, munged.
- Every client needs SLURM_CONF (without it 22.05 looks the controller up in DNS and dies) and a
  timeout (with slurmctld down a call blocks for 10 s or more).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from knobkeeper.errors import UserError
from knobkeeper.pids import pid_of, stop_pid
from knobkeeper.ports import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
CLIENT_TIMEOUT_S = 20.0
STATE_FILE = "cluster.json"


def _which(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))
    if not found:
        raise UserError(f"{name}: not installed (Debian: `apt-get install -y slurm-wlm munge`, or `make system-deps`)")
    return found


@dataclass
class LocalCluster:
    """A started cluster: where its files are and what answers where."""

    root: str
    conf: str
    partition: str
    nodes: list[str]
    cpus: int
    memory_mb: int
    controller_port: int
    node_ports: dict[str, int]
    pidfiles: dict[str, str] = field(default_factory=dict)  # daemon -> pid file

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.conf}

    def client(self, *argv: str, timeout: float = CLIENT_TIMEOUT_S, check: bool = False) -> subprocess.CompletedProcess:
        """Run a Slurm client (sinfo, squeue, scontrol, sbatch, scancel) against this cluster."""
        done = subprocess.run([_which(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise UserError(f"{' '.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
        return done

    def save(self) -> None:
        Path(self.root, STATE_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, root: str | Path) -> "LocalCluster | None":
        try:
            return cls(**json.loads(Path(root, STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def slurm_conf(c: LocalCluster, extra: str = "") -> str:
    """slurm.conf of the local cluster (the settings that work: docs/platform-notes.md, "A real Slurm on
    one machine")."""
    root = c.root
    nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname=localhost Port={c.node_ports[n]} "
                      f"CPUs={c.cpus} RealMemory={c.memory_mb} State=UNKNOWN" for n in c.nodes)
    return f"""\
# A local Slurm cluster for knobkeeper (knobkeeper/deploy/slurm/localcluster.py); loopback only.
ClusterName=knobkeeper
SlurmctldHost=localhost
SlurmctldPort={c.controller_port}
SlurmdPort={min(c.node_ports.values())}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge-run/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
CommunicationParameters=NoInAddrAny
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=5
{nodes}
PartitionName={c.partition} Nodes={','.join(c.nodes)} Default=YES MaxTime=INFINITE State=UP AllowAccounts=ALL
{extra}"""

# The tests' second partition: jobs of any other account wait there for good ("account not known").
LOCKED = "PartitionName=locked Nodes={nodes} MaxTime=INFINITE State=UP AllowAccounts=ops\n"


def _popen(argv: list[str], log: Path, user: str | None = None) -> subprocess.Popen:
    if user:
        argv = [_which("runuser"), "-u", user, "--", *argv]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={"PATH": ":".join(SBIN), "LANG": "C.UTF-8"})


def _wait(what: str, ok, timeout: float, log: Path | None = None, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = ""
    if log is not None and log.exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
    raise UserError(f"local Slurm: {what} did not come up within {timeout:g} s" + (f": {tail}" if tail else ""))


def start_cluster(root: str | Path, nodes: int = 3, cpus: int = 2, memory_mb: int = 4000,
                  partition: str = "kk", timeout: float = 30.0, locked_partition: bool = False) -> LocalCluster:
    """Start munged, slurmctld and `nodes` slurmd under `root` (made if missing); wait until every
    node is idle. Raises UserError (naming the daemon and its log) when one does not come up.
    `locked_partition`: also a partition "locked" that only account ops may use."""
    if os.geteuid() != 0:
        raise UserError("the local Slurm cluster runs its daemons as root (slurmd must start jobs as any user): "
                        "run as root")
    for tool in DAEMONS:
        _which(tool)
    root = Path(root).resolve()
    if any(c.isspace() for c in str(root)):
        raise UserError(f"{root}: the local cluster's folder must not contain spaces")
    for sub in ("state", "run", "log", "munge-run", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for folder in root.parents:  # munged runs as the munge user: it must reach its folders
        if not os.stat(folder).st_mode & 0o001:
            raise UserError(f"{folder}: not searchable by other users (mode {os.stat(folder).st_mode & 0o777:o}); "
                            f"the munge user must reach {root}: chmod o+x it or put the cluster elsewhere")
    names = [f"n{i}" for i in range(1, nodes + 1)]
    cluster = LocalCluster(root=str(root), conf=str(root / "slurm.conf"), partition=partition, nodes=names,
                           cpus=cpus, memory_mb=memory_mb, controller_port=free_port(),
                           node_ports={n: free_port() for n in names})
    for n in names:
        (root / "spool" / n).mkdir(exist_ok=True)
    Path(cluster.conf).write_text(slurm_conf(cluster, LOCKED.format(nodes=",".join(names)) if locked_partition else ""))
    munge = pwd.getpwnam("munge")
    key_dir, run_dir = root / "munge", root / "munge-run"
    key_dir.mkdir(exist_ok=True)
    for folder, mode in ((key_dir, 0o700), (run_dir, 0o755)):
        os.chown(folder, munge.pw_uid, munge.pw_gid)
        folder.chmod(mode)
    key = key_dir / "munge.key"
    if not key.exists():
        subprocess.run([_which("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True, timeout=30)
    os.chown(key, munge.pw_uid, munge.pw_gid)
    key.chmod(0o400)
    cluster.pidfiles = {"munged": str(run_dir / "munged.pid"), "slurmctld": str(root / "run/slurmctld.pid"),
                        **{f"slurmd-{n}": str(root / f"run/slurmd-{n}.pid") for n in names}}
    cluster.save()
    try:
        log = root / "log" / "munged.out"
        proc = _popen([_which("munged"), "-F", f"--socket={run_dir}/munge.socket", f"--key-file={key}",
                       f"--pid-file={run_dir}/munged.pid", f"--log-file={key_dir}/munged.log",
                       f"--seed-file={key_dir}/munged.seed"], log, user="munge")
        _wait("munged", lambda: (run_dir / "munge.socket").exists(), timeout, log, proc)
        log = root / "log" / "slurmctld.out"
        proc = _popen([_which("slurmctld"), "-D", "-c", "-f", cluster.conf], log)
        _wait("slurmctld", lambda: cluster.client("sinfo", "-h", timeout=5).returncode == 0, timeout, log, proc)
        for n in names:
            _popen([_which("slurmd"), "-D", "-f", cluster.conf, "-N", n], root / "log" / f"slurmd-{n}.out")
        _wait(f"slurmd {', '.join(names)} (idle)", lambda: _all_idle(cluster), timeout,
              root / "log" / f"slurmd-{names[0]}.log")
    except BaseException:
        stop_cluster(root)
        raise
    return cluster


def _all_idle(cluster: LocalCluster) -> bool:
    done = cluster.client("sinfo", "-h", "-N", "-o", "%N %t", timeout=5)
    states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
    return all(states.get(n) == "idle" for n in cluster.nodes)


# --- stopping -----------------------------------------------------------------------------------------


def stepd_pids(root: str | Path) -> list[int]:
    """The slurmstepd processes of this cluster: they hold their step's socket in our spool folder."""
    spool = str(Path(root).resolve() / "spool") + "/"
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not Path(entry, "cmdline").read_bytes().startswith(b"slurmstepd"):
                continue
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if (cwd + "/").startswith(spool) or _holds_path(entry, spool):
            out.append(int(entry.name))
    return out


def _holds_path(proc: Path, prefix: str) -> bool:
    try:
        for fd in (proc / "fd").iterdir():
            try:
                if os.readlink(fd).startswith(prefix):
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def stop_cluster(root: str | Path, timeout: float = 30.0) -> list[int]:
    """Cancel every job, wait until no slurmstepd of this cluster is left (their processes are not
    slurmd's children), then stop every slurmd, slurmctld and munged by PID. Returns the daemons'
    pids that were stopped. Safe to call on a folder where nothing runs."""
    root = Path(root).resolve()
    cluster = LocalCluster.load(root)
    if cluster is None:
        return []
    conf = cluster.conf
    ctld = pid_of(cluster.pidfiles.get("slurmctld", ""), conf)
    if ctld is not None:
        try:
            cluster.client("scancel", "--full", "--quiet", f"--partition={cluster.partition}", timeout=10)
            # scancel without a job id needs a filter; jobs of other partitions (none here) stay.
            listed = cluster.client("squeue", "-h", "-o", "%A", timeout=10).stdout.split()
            if listed:
                cluster.client("scancel", "--full", "--quiet", *sorted(set(listed)), timeout=10)
        except (subprocess.TimeoutExpired, UserError):
            pass
    deadline = time.monotonic() + timeout
    while stepd_pids(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in stepd_pids(root):  # steps that outlived KillWait and our wait: their whole session goes
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    stopped = []
    names = [k for k in cluster.pidfiles if k.startswith("slurmd-")] + ["slurmctld", "munged"]
    for name in names:
        marker = conf if name != "munged" else str(root / "munge-run")
        pid = pid_of(cluster.pidfiles.get(name, ""), marker)
        if pid is not None:
            stop_pid(pid)
            stopped.append(pid)
    return stopped


def cluster_pids(root: str | Path) -> list[int]:
    """Every live daemon and slurmstepd of the cluster under `root` (tests assert none is left)."""
    root = Path(root).resolve()
    cluster = LocalCluster.load(root)
    if cluster is None:
        return []
    pids = []
    for name, pidfile in cluster.pidfiles.items():
        pid = pid_of(pidfile, cluster.conf if name != "munged" else str(root / "munge-run"))
        if pid is not None:
            pids.append(pid)
    return pids + stepd_pids(root)
