"""The job a Slurm stack runs as: its settings (host data of the login host), its components (one
per service, in deploy order), the job script (templates/slurm-job.sh.j2, through deploy/render.py),
and what a running job publishes (placements) and keeps (the script Slurm stored).

Data keys of the login host (group data, host data or --data; checked here, one line per problem):

    service_manager    "slurm": the stack runs as one Slurm job submitted from this host
    slurm_partition    partition of every component (a role's <role>_slurm["partition"] wins)
    slurm_account      account (optional); slurm_qos (optional)
    slurm_time_limit   --time of every component, e.g. "12:00:00" or "2-00:00:00" (optional)
    slurm_layout       "hetjob" (default: a heterogeneous job, one component per service, each
                       `srun --het-group=N`) or "steps" (one allocation, one `srun --exact` step per
                       service: for clusters that cannot run heterogeneous jobs)
    <role>_slurm       {"cpus": 4, "mem": "64G", "gpus": 8, "partition": ..., "constraint": ...,
                        "sbatch": ["--exclusive"], "srun": ["--container-image=..."]}: what each service
                       of the role gets (one node each) and how its step starts
    slurm_job_name     default knobkeeper-<inventory>; the deploy finds its jobs by this name
    slurm_conf         SLURM_CONF for the client calls on this host (optional: the host's default)
    slurm_bin          folder of sbatch/squeue/... on this host (optional: PATH)
    slurm_timeout      seconds each client call may take (default 20): a slurmctld that does not
                       answer fails the deploy with one line instead of hanging it
    slurm_pending_timeout   seconds a new job may stay pending before the deploy gives up (default 600)
    slurm_python       interpreter on the nodes that picks a free port when the preferred one is
                       taken (default python3)
    slurm_sbatch       more #SBATCH lines of the job, e.g. ["--requeue"]
    slurm_max_script_size   bytes the cluster takes in a job script (default 4194304: Slurm's own
                       default, SchedulerParameters=max_script_size): a larger one is refused when it
                       renders, naming its largest knob value, rather than by sbatch at submit time

Everything the job writes lives under {prefix}/slurm/ on a filesystem the login host and the nodes
share (as Slurm's own --output does): the job script, logs/<job id>.out, jobs/<job id>/ (each
component's launch script, its log, its .placement).

Ports and addresses are the job's: a launch script names them by placement tokens
(`@kk:<service>:port@`, `...:host@`, `...:bootstrap_port@`, `...:metrics_port@`) in its exec line,
filled on the node when the component starts. So `review` shows the exact text, and a new job can
start beside the old one on the same nodes (each component takes its preferred port when it is free
there, else another) before the old one is cancelled.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from knobkeeper.deploy.engines import engine_command, workers_of
from knobkeeper.deploy.render import (META_PREFIX, RenderedService, WholeStack, content_digest, parse_meta,
                                      render_template, strip_header)
from knobkeeper.errors import UserError

MANAGER = "slurm"
# What a changed job script means to a review's restart plan: every component restarts in the new job.
NEW_JOB = WholeStack("new Slurm job", "gated in it, then the old job is cancelled (one job carries every component)",
                     "its own files are unchanged; a job's environment cannot change")
JOB_ROLE = "slurm-job"  # the role of the job script's entry in render_stack's output
TEMPLATE = "slurm-job.sh.j2"
LAYOUTS = ("hetjob", "steps")
PATH = "/usr/local/bin:/usr/bin:/bin"
PORT_FIELDS = ("port", "bootstrap_port", "metrics_port")
TOKEN = re.compile(r"@kk:([A-Za-z0-9._-]+):(host|port|bootstrap_port|metrics_port)@")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_LIST = re.compile(r"^[A-Za-z0-9_.,&|!:-]+$")  # partition lists, constraints
_MEM = re.compile(r"^[0-9]+[KMGT]?$")
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, UNLIMITED/INFINITE.
_TIME = re.compile(r"^(\d+(:\d\d){0,2}|\d+-\d+(:\d\d){0,2}|UNLIMITED|INFINITE)$")
RESOURCE_KEYS = ("cpus", "mem", "gpus", "partition", "constraint", "sbatch", "srun", "nodes")
DELIMITER = "KNOBKEEPER_EOF"
JOB_GRACE_S = 30
# Slurm's default SchedulerParameters=max_script_size (22.05.8, measured): a script 100 bytes over
# it is refused by `sbatch` and `sbatch --test-only` alike ("Pathname of a file, directory or other
# parameter too long"); 200 bytes under it is accepted.
MAX_SCRIPT_SIZE = 4 * 1024 * 1024


def token(service: str, name: str) -> str:
    """The placement token of one component's `name` (host, port, bootstrap_port, metrics_port)."""
    return f"@kk:{service}:{name}@"


# --- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """What each service of one role asks Slurm for (one node, one task)."""

    cpus: int = 1
    mem: str | None = None
    gpus: int = 0
    partition: str | None = None
    constraint: str | None = None
    sbatch: tuple[str, ...] = ()
    srun: tuple[str, ...] = ()  # more options of the role's srun, e.g. --container-image=...

    def options(self, settings: "Settings") -> list[str]:
        out = [f"--partition={self.partition or settings.partition}"] if (self.partition or settings.partition) else []
        out += [f"--account={settings.account}"] if settings.account else []
        out += [f"--qos={settings.qos}"] if settings.qos else []
        out += [f"--time={settings.time_limit}"] if settings.time_limit else []
        out += ["--nodes=1", "--ntasks=1", f"--cpus-per-task={self.cpus}"]
        out += [f"--mem={self.mem}"] if self.mem else []
        out += [f"--gres=gpu:{self.gpus}"] if self.gpus else []
        out += [f"--constraint={self.constraint}"] if self.constraint else []
        return out + list(self.sbatch)


@dataclass(frozen=True)
class Settings:
    """The Slurm side of a stack, from the login host's data (validated once)."""

    host: str
    inventory: str
    job_name: str
    root: str  # {prefix}/slurm: shared by the login host and the nodes
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None
    layout: str = "hetjob"
    conf: str | None = None
    bin: str | None = None
    timeout: float = 20.0
    pending_timeout: float = 600.0
    python: str = "python3"
    sbatch: tuple[str, ...] = ()
    max_script_size: int = MAX_SCRIPT_SIZE
    resources: dict[str, Resources] = field(default_factory=dict)

    @property
    def script_path(self) -> str:
        return f"{self.root}/{self.job_name}.sh"

    @property
    def jobs_dir(self) -> str:
        return f"{self.root}/jobs"

    @property
    def logs_dir(self) -> str:
        return f"{self.root}/logs"

    def output_of(self, job_id: str) -> str:
        return f"{self.logs_dir}/{job_id}.out"

    def job_dir(self, job_id: str) -> str:
        return f"{self.jobs_dir}/{job_id}"

    def field_of(self, option: str) -> str:
        """The data key that sets an #SBATCH option (for Slurm's refusals: they do not name the role)."""
        if option in ("cpus", "mem", "gpus", "constraint"):
            return f"<role>_slurm[{option!r}]"
        return {"partition": "slurm_partition or <role>_slurm['partition']", "account": "slurm_account",
                "qos": "slurm_qos", "time": "slurm_time_limit"}.get(option, option)


def _text(where: str, key: str, value: Any, pattern: re.Pattern, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not pattern.match(str(value)):
        raise UserError(f"{where}: data {key} = {value!r}: expected {what}")
    return str(value)


def _number(where: str, key: str, value: Any, default: float, minimum: float = 0.0) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= minimum:
        raise UserError(f"{where}: data {key} = {value!r}: expected a number of seconds above {minimum:g}")
    return float(value)


def _options(where: str, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and v.startswith("--") and "\n" not in v and len(v) > 2 for v in value):
        raise UserError(f"{where}: data {key} = {value!r}: expected a list of sbatch options such as "
                        f"[\"--exclusive\"] (each starting with --)")
    return tuple(value)


def resources_of(where: str, role: str, spec: Any) -> Resources:
    key = f"{role}_slurm"
    if spec is None:
        return Resources()
    if not isinstance(spec, Mapping):
        raise UserError(f"{where}: data {key} = {spec!r}: expected a dict such as {{\"cpus\": 8, \"mem\": \"64G\", "
                        f"\"gpus\": 8}}")
    unknown = sorted(set(spec) - set(RESOURCE_KEYS))
    if unknown:
        raise UserError(f"{where}: data {key}[{unknown[0]!r}]: no such key (keys: {', '.join(RESOURCE_KEYS)})")
    nodes = spec.get("nodes", 1)
    if nodes != 1:
        raise UserError(f"{where}: data {key}['nodes'] = {nodes!r}: each service runs on 1 node (a service that "
                        f"spans nodes needs its engine's rank flags, which knobkeeper does not write yet); use "
                        f"{role}_workers for more services of the role")
    counts = {}
    for name, minimum in (("cpus", 1), ("gpus", 0)):
        value = spec.get(name, minimum if name == "gpus" else 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise UserError(f"{where}: data {key}[{name!r}] = {value!r}: expected a whole number of at least {minimum}")
        counts[name] = value
    mem = spec.get("mem")
    if isinstance(mem, int) and not isinstance(mem, bool):
        mem = f"{mem}M"
    return Resources(
        cpus=counts["cpus"], gpus=counts["gpus"],
        mem=_text(where, f"{key}['mem']", mem, _MEM, "an amount such as \"64G\", \"512M\" or megabytes as a number"),
        partition=_text(where, f"{key}['partition']", spec.get("partition"), _LIST, "a partition name"),
        constraint=_text(where, f"{key}['constraint']", spec.get("constraint"), _LIST, "a node feature expression"),
        sbatch=_options(where, f"{key}['sbatch']", spec.get("sbatch")),
        srun=_options(where, f"{key}['srun']", spec.get("srun")),
    )


def settings_of(stack: Any) -> Settings:
    """The Settings of a Slurm stack: exactly one host (the login host), every role's resources."""
    hosts = [plan for plan in stack.hosts.values() if plan.manager == MANAGER]
    others = [plan.name for plan in stack.hosts.values() if plan.manager != MANAGER]
    if others or len(hosts) != 1:
        names = ", ".join(sorted(stack.hosts))
        raise UserError(f"inventory {stack.inventory}: a Slurm stack is submitted from ONE host (the login node, in "
                        f"every role's group; service_manager = \"slurm\"), not {names}")
    plan = hosts[0]
    data = plan.data
    where = f"inventory {stack.inventory}, host {plan.name}"
    layout = data.get("slurm_layout") or "hetjob"
    if layout not in LAYOUTS:
        raise UserError(f"{where}: data slurm_layout = {layout!r}: expected one of {', '.join(LAYOUTS)}")
    name = data.get("slurm_job_name") or f"knobkeeper-{stack.inventory}"
    _text(where, "slurm_job_name", name, _NAME, "a job name ([A-Za-z0-9_.-])")
    for path_key in ("slurm_conf", "slurm_bin"):
        value = data.get(path_key)
        if value is not None and (not isinstance(value, str) or not value.startswith("/") or any(c.isspace() for c in value)):
            raise UserError(f"{where}: data {path_key} = {value!r}: expected an absolute path without spaces")
    python = data.get("slurm_python") or "python3"
    if not isinstance(python, str) or any(c.isspace() for c in python):
        raise UserError(f"{where}: data slurm_python = {python!r}: expected an interpreter path or name")
    max_size = data.get("slurm_max_script_size", MAX_SCRIPT_SIZE)
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1024:
        raise UserError(f"{where}: data slurm_max_script_size = {max_size!r}: expected a number of bytes (at least "
                        f"1024; Slurm's default is {MAX_SCRIPT_SIZE})")
    return Settings(
        host=plan.name, inventory=stack.inventory, job_name=str(name), root=f"{plan.prefix}/slurm",
        partition=_text(where, "slurm_partition", data.get("slurm_partition"), _LIST, "a partition name"),
        account=_text(where, "slurm_account", data.get("slurm_account"), _NAME, "an account name"),
        qos=_text(where, "slurm_qos", data.get("slurm_qos"), _NAME, "a QOS name"),
        time_limit=_text(where, "slurm_time_limit", data.get("slurm_time_limit"), _TIME,
                         "a Slurm time such as \"12:00:00\", \"2-00:00:00\" or \"90\" (minutes)"),
        layout=layout, conf=data.get("slurm_conf"), bin=data.get("slurm_bin"),
        timeout=_number(where, "slurm_timeout", data.get("slurm_timeout"), 20.0),
        pending_timeout=_number(where, "slurm_pending_timeout", data.get("slurm_pending_timeout"), 600.0),
        python=python, sbatch=_options(where, "slurm_sbatch", data.get("slurm_sbatch")), max_script_size=max_size,
        resources={role: resources_of(where, role, data.get(f"{role}_slurm")) for role in stack.order},
    )


# --- commands with placement tokens -----------------------------------------------------------------


def _tokened(svc: Any) -> Any:
    """`svc` as its launch script names it: address and ports are the job's placement tokens."""
    return dataclasses.replace(
        svc, address=token(svc.name, "host"), port=token(svc.name, "port"),  # type: ignore[arg-type]
        bootstrap_port=token(svc.name, "bootstrap_port") if svc.bootstrap_port is not None else None,
        metrics_port=token(svc.name, "metrics_port") if svc.metrics_port is not None else None,
    )


def runtime_commands(stack: Any) -> dict[tuple[str, str], list[str]]:
    """Every service's engine command with its own ports, and a router's workers, as placement tokens
    (the engine families build the commands; only what they are given differs)."""
    tokened = [_tokened(svc) for svc in stack.services]
    workers = workers_of(tokened)
    return {(svc.host, svc.name): engine_command(svc, stack.hosts[svc.host].data, workers) for svc in tokened}


def ports_of(svc: Any) -> list[tuple[str, int]]:
    """The component's preferred ports by placement field (the inventory's ports)."""
    return [(name, getattr(svc, name)) for name in PORT_FIELDS if getattr(svc, name) is not None]


# --- the job script ---------------------------------------------------------------------------------


def job_service(stack: Any, settings: Settings) -> Any:
    """The job script's entry in render_stack's output: a Service-shaped row with role JOB_ROLE."""
    first = stack.services[0]
    return dataclasses.replace(first, role=JOB_ROLE, name=settings.job_name, index=0, engine=MANAGER)


def render_job(project: Any, stack: Any, rendered: Mapping[tuple[str, str], Any], source: Any) -> Any:
    """The job script of the stack as a RenderedService (files: {script path: text}), rendered by
    deploy/render.py from templates/slurm-job.sh.j2 with every component's rendered launch script."""
    settings = settings_of(stack)
    services = list(stack.services)
    texts = {svc.name: rendered[(svc.host, svc.name)].launch for svc in services}
    # The digest and the here-document delimiter come from the scripts without their headers: a new
    # commit that changes nothing a process sees must not make a new job (as for every other file).
    bare = {name: embedded(strip_header(text)) for name, text in texts.items()}
    delimiter = DELIMITER
    components, roles = [], []
    for group, svc in enumerate(services):
        res = settings.resources.get(svc.role, Resources())
        if settings.layout == "hetjob":
            srun = [f"--het-group={group}", "--export=ALL", "--nodes=1", "--ntasks=1"]
        else:
            srun = ["--export=ALL", "--nodes=1", "--ntasks=1", f"--cpus-per-task={res.cpus}", "--exact", "--overlap"]
            srun += [f"--mem={res.mem}"] if res.mem else []
            srun += [f"--gres=gpu:{res.gpus}"] if res.gpus else []
        srun += [shlex.quote(o) for o in res.srun]
        components.append({"group": group, "service": svc.name, "role": svc.role, "script": bare[svc.name],
                           "srun": srun, "listen_host": svc.listen_host, "ports": ports_of(svc)})
    for index, role in enumerate(stack.order):
        members = [c for c in components if c["role"] == role]
        if members:
            roles.append({"role": role, "components": members, "health": stack.roles[role].health,
                          # The deploy's gate decides (and cancels); the job gives up on its own only
                          # well after it, when no deploy is watching.
                          "timeout": int(max(1, _timeout(stack, role))) + JOB_GRACE_S,
                          "wait": index < len(stack.order) - 1})
    if settings.layout == "hetjob":
        allocations = [{"options": settings.resources.get(svc.role, Resources()).options(settings)} for svc in services]
    else:
        allocations = [{"options": _steps_allocation(settings, services)}]
    job = job_service(stack, settings)
    context = {
        "job_name": settings.job_name, "output": f"{settings.logs_dir}/%j.out", "job_options": list(settings.sbatch),
        "allocations": allocations, "stack": stack.inventory, "order": list(stack.order),
        "layout": settings.layout, "layout_words": ("a heterogeneous job, one component per service"
                                                    if settings.layout == "hetjob" else "one allocation, one step per service"),
        "path": PATH, "jobs_dir": settings.jobs_dir, "python": settings.python, "delimiter": delimiter,
        "components": components, "roles": roles,
    }
    templates = project.templates_dir
    body = strip_header(render_template(templates, TEMPLATE, {**context, "header": []}))
    parts = {svc.name: rendered[(svc.host, svc.name)] for svc in services}
    digest = content_digest({settings.script_path: body}, {name: part.digest for name, part in parts.items()})
    header = _header(settings, stack, services, parts, source, digest)
    # What review diffs: the launch scripts' headers name the commit, so they change with every commit
    # (140 lines of a job script's diff, nothing else changed); each launch script's diff shows its own.
    reviewed = render_template(templates, TEMPLATE, {**context, "header": header})
    for component in components:  # what is submitted: each launch script with its header (provenance)
        component["script"] = embedded(texts[component["service"]])
    text = render_template(templates, TEMPLATE, {**context, "header": header})
    _check_size(settings, text, stack, parts)
    return RenderedService(service=job, files={settings.script_path: text}, modes={settings.script_path: "0644"},
                           knobs={}, digest=digest, reviewed={settings.script_path: reviewed},
                           templates={settings.script_path: TEMPLATE}, whole_stack=NEW_JOB)


def _header(settings: Settings, stack: Any, services: list[Any], parts: Mapping[str, Any], source: Any,
            digest: str) -> list[str]:
    """The job script's header lines: what it is, the commit, the digests, the machine-readable line."""
    meta = {"kind": "slurm-job", "stack": stack.inventory, "job": settings.job_name, "source": source.commit,
            "dirty": source.dirty, "digest": digest,
            "components": [{"service": s.name, "role": s.role, "group": i, "digest": parts[s.name].digest,
                            "knobs": parts[s.name].knobs} for i, s in enumerate(services)]}
    header = [f"job {settings.job_name} of stack {stack.inventory} ({len(services)} components): rendered by knobkeeper; "
              f"submitted with sbatch from {settings.host}",
              f"source: {source.label}", f"digest: {digest}"]
    header += [f"component {i} {s.name} (role {s.role}): digest {parts[s.name].digest}" for i, s in enumerate(services)]
    return header + [META_PREFIX[2:] + json.dumps(meta, sort_keys=True)]


def _check_size(settings: Settings, text: str, stack: Any, parts: Mapping[str, Any]) -> None:
    """A job script Slurm would refuse for its size is refused here, where `check`, `review`, `plan`
    and the deploy all render it: one line with the sizes and the knob value that weighs most (each
    value is in the script three times: its export and two headers)."""
    size = len(text.encode())
    if size <= settings.max_script_size:
        return
    values = [(len(value.encode()), stack.scope(part.service.role), name) for part in parts.values()
              for name, value in part.knobs.items()]
    heaviest = max(values, default=None)
    which = (f"; its largest knob value: [{heaviest[1]}] {heaviest[2]}, {heaviest[0]} bytes" if heaviest else "")
    raise UserError(f"inventory {stack.inventory}, host {settings.host}: job script {settings.script_path} would be "
                    f"{size} bytes, over the {settings.max_script_size} bytes Slurm takes (data slurm_max_script_size; "
                    f"the cluster's SchedulerParameters=max_script_size){which}")


def embedded(text: str) -> str:
    """A launch script as the job script carries it: every line behind a `|` (the job strips it with
    sed). sbatch drops the blank lines of a heterogeneous job's script (22.05, measured), which would
    change a knob value that holds an empty line; and no line of it can end the here-document."""
    return "".join(f"|{line}\n" for line in text.splitlines())


def _timeout(stack: Any, role: str) -> float:
    return max(s.health_timeout for s in stack.services if s.role == role)


def _steps_allocation(settings: Settings, services: list[Any]) -> list[str]:
    """One allocation for every service (layout steps): as many nodes as services, the largest ask."""
    asks = [settings.resources.get(s.role, Resources()) for s in services]
    mems = [a.mem for a in asks if a.mem]
    biggest = Resources(cpus=max(a.cpus for a in asks), gpus=max(a.gpus for a in asks),
                        mem=max(mems, key=megabytes) if mems else None,
                        partition=next((a.partition for a in asks if a.partition), None),
                        constraint=next((a.constraint for a in asks if a.constraint), None),
                        sbatch=tuple(dict.fromkeys(o for a in asks for o in a.sbatch)))
    options = biggest.options(settings)
    options = [o for o in options if not o.startswith(("--nodes=", "--ntasks="))]
    return options[:1] + [f"--nodes=1-{len(services)}", f"--ntasks={len(services)}"] + options[1:]


def megabytes(mem: str | None) -> int:
    """An #SBATCH --mem amount ("64G", "512M", "4096") in megabytes (0 when none is asked)."""
    if not mem:
        return 0
    unit = mem[-1] if mem[-1].isalpha() else "M"
    number = int(mem.rstrip("KMGT"))
    return {"K": number // 1024, "M": number, "G": number * 1024, "T": number * 1024 * 1024}[unit]


# --- what a job publishes and keeps -----------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where one component of a running job listens (its .placement file, one line of key=value)."""

    service: str
    node: str
    host: str
    port: int
    bootstrap_port: int | None = None
    metrics_port: int | None = None
    pid: int | None = None
    started: float | None = None

    def place(self, svc: Any) -> Any:
        """`svc` with this placement's address and ports (what the gates, status and A/B probe)."""
        return dataclasses.replace(svc, address=self.host, port=self.port,
                                   bootstrap_port=self.bootstrap_port if svc.bootstrap_port is not None else None,
                                   metrics_port=self.metrics_port if svc.metrics_port is not None else None)


def parse_placement(text: str) -> Placement | None:
    fields = dict(item.split("=", 1) for item in text.split() if "=" in item)

    def number(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else None

    port = number("port")
    if not fields.get("service") or not fields.get("host") or port is None:
        return None
    try:
        started = float(fields.get("started", ""))
    except ValueError:
        started = None
    return Placement(service=fields["service"], node=fields.get("node", ""), host=fields["host"], port=port,
                     bootstrap_port=number("bootstrap_port"), metrics_port=number("metrics_port"),
                     pid=number("pid"), started=started)


def job_meta(script: str | None) -> dict[str, Any] | None:
    """The machine-readable header line of a job script (the one Slurm stored for a job)."""
    meta = parse_meta(script or "")
    return meta if meta and meta.get("kind") == "slurm-job" else None


def component_scripts(script: str | None) -> dict[str, str]:
    """{service: its launch script} embedded in a job script (what each component runs)."""
    out: dict[str, str] = {}
    if not script:
        return out
    pattern = re.compile(r"^sed 's/\^\|//' > \"\$jobdir/([A-Za-z0-9._-]+)\.sh\" <<'" + DELIMITER + r"'\n(.*?)^"
                         + DELIMITER + "$", re.M | re.S)
    for match in pattern.finditer(script):
        out[match.group(1)] = "".join(line[1:] + "\n" for line in match.group(2).splitlines() if line.startswith("|"))
    return out
