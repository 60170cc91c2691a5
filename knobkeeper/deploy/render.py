"""Render the files of a (host, service): its launch script and its systemd unit or supervisord
program section. The one place file texts come from: deploy.py uploads them, `review` diffs them,
`check` lints them.

`render_service` is pure (it reads only templates). Every file starts with a header naming the
source commit and, in the launch script, the changelog entry behind each knob (or "override (A/B
run)"), plus one machine-readable `# knobkeeper: {...}` line that `status` reads back. Values are
shell-quoted; a secret's value is never in a file text: the script reads it from a 0600 file.

The header rule is `strip_header` (the one place it is written): an optional shebang, then the
header's comment lines (`# ...` or `; ...`) up to the first line that is not one; every template
puts a non-comment line (a blank one at least) between its header and its body. `digest` hashes
every file with its header stripped: it changes exactly when the process would see something
different. The deploy restarts on a digest change, not on a new commit id.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jinja2

from knobkeeper import gitio
from knobkeeper.changelog.entries import latest_by_knob, load_entries
from knobkeeper.changelog.secrets import secret_mismatch
from knobkeeper.deploy.target import target_of
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import Catalog, load_catalog, Value
from knobkeeper.knobs.state import read_declared

LAUNCH_TEMPLATE = "launch.sh.j2"
UNIT_TEMPLATE = "systemd.service.j2"
PROGRAM_TEMPLATE = "supervisor.conf.j2"
SUPERVISORD_TEMPLATE = "supervisord.conf.j2"
META_PREFIX = "# knobkeeper: "
OVERRIDE = "override (A/B run)"
# PYTHONFAULTHANDLER: a Python process killed by SIGILL, SIGSEGV, SIGBUS, SIGFPE or SIGABRT first writes
# "Fatal Python error: Illegal instruction" and where each thread was to its log. vLLM's own line for a
# dead worker may not know how it died ("Worker proc VllmWorker-0 died unexpectedly (exit code: None)":
# it looks before the process is reaped); the engine family reads this line instead.
BASE_ENVIRONMENT = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}


@dataclass(frozen=True)
class Source:
    """The commit the files were rendered from; dirty when inventory/ or templates/ had changes."""

    commit: str
    dirty: bool = False

    @property
    def label(self) -> str:
        return self.commit + (" (dirty)" if self.dirty else "")


@dataclass(frozen=True)
class WholeStack:
    """What a change of a whole-stack file means, in its target's words (review's restart plan):

        unit     "new Slurm job"
        how      "gated in it, then the old job is cancelled (one job carries every component)"
        why      "its own files are unchanged; a job's environment cannot change"
    """

    unit: str
    how: str
    why: str


@dataclass
class RenderedService:
    service: Any  # knobkeeper.deploy.stack.Service
    files: dict[str, str]  # remote path -> text
    modes: dict[str, str]  # remote path -> octal mode
    secrets: dict[str, tuple[str, str]] = field(default_factory=dict)  # remote path -> (role, knob)
    knobs: dict[str, str] = field(default_factory=dict)  # knob -> displayed value (secrets: fingerprint)
    provenance: dict[str, str] = field(default_factory=dict)
    digest: str = ""
    # A file's text as a review diffs it, where that is not the text itself: a Slurm job script
    # without the headers of the launch scripts it embeds (review shows each launch script's own).
    reviewed: dict[str, str] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)  # remote path -> the template under templates/
    # The variables the launch script exports, as the process sees them (knobs, then the fixed ones);
    # a secret knob is in `secrets` instead. A target that starts the engine without the script (a
    # Kubernetes container's env) passes exactly these.
    environment: dict[str, str] = field(default_factory=dict)
    # What differs between two texts of one of its files, in words (a Kubernetes manifest: its pod
    # templates' variables, image, command; deploy/kube/manifests.manifest_changes), for a file whose
    # target reads it; None: plan.change_reasons reads launch scripts and units itself.
    describe: Any = None
    # Set on a file that carries every component (a Slurm job script): when it changes, every
    # component restarts with it, its own files changed or not.
    whole_stack: WholeStack | None = None

    @property
    def launch(self) -> str:
        return self.files[self.service.launch_path]


@lru_cache(maxsize=8)
def _environment(templates_dir: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["shcommand"] = shell_command
    return env


def shell_command(argv: list[str], indent: str = "    ") -> str:
    """argv shell-quoted, one `--flag value...` group per continued line (readable in a review diff)."""
    lines: list[list[str]] = [[]]
    for i, arg in enumerate(argv):
        if i > 0 and arg.startswith("-") and lines[-1] and not (len(lines) == 1 and arg == "-m"):
            lines.append([])
        lines[-1].append(shlex.quote(str(arg)))
    return (" \\\n" + indent).join(" ".join(parts) for parts in lines)


def _template(templates_dir: Path, name: str) -> jinja2.Template:
    try:
        return _environment(str(templates_dir)).get_template(name)
    except jinja2.TemplateNotFound:
        raise UserError(f"{templates_dir}/{name}: template not found") from None
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"{templates_dir}/{name}:{exc.lineno}: {exc.message}") from None


def render_template(templates_dir: Path, name: str, context: dict[str, Any]) -> str:
    try:
        return _template(templates_dir, name).render(**context)
    except jinja2.UndefinedError as exc:
        raise UserError(f"{templates_dir}/{name}: {exc.message} (a template variable knobkeeper does not provide)") from None


def strip_header(text: str) -> str:
    """A rendered file without its header: the shebang (kept: it is content), then everything after
    the header's comment lines. What the digest covers, what review diffs, what a hand edit is."""
    lines = text.splitlines(keepends=True)
    start = 1 if lines and lines[0].startswith("#!") else 0
    end = start
    while end < len(lines) and _is_header_line(lines[end]):
        end += 1
    return "".join(lines[:start] + lines[end:])


def _is_header_line(line: str) -> bool:
    bare = line.rstrip("\n")
    return bare in ("#", ";") or bare.startswith(("# ", "; "))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def render_service(
    service: Any,
    command: list[str],
    *,
    knobs: Mapping[str, Value],
    catalog: Catalog,
    provenance: Mapping[str, str],
    source: Source,
    templates_dir: Path,
    environment: Mapping[str, str] | None = None,
    instance_env: Mapping[str, str] | None = None,
    scope: str | None = None,
    unit: bool = True,
) -> RenderedService:
    """{remote path: text} (plus modes, secrets, digest) for one (host, service). Pure.

    `knobs`: the role's knob values (a secret's value is its fingerprint); `provenance`: per knob the
    words that name where it came from ("entry 1a2b3c4d (set ... by ...)", "override (A/B run)");
    `instance_env`: what the engine family exports for this one instance (vLLM's NIXL side channel);
    `scope`: the knobs.toml table the knobs come from (where a secret's value is stored); `unit`: the
    manager's file too (the target's service_units; a Slurm job's script starts the launch script).
    """
    instance = dict(instance_env or {})
    env_fixed = {**BASE_ENVIRONMENT, **instance, **(environment or {})}
    for name in env_fixed:
        if name in catalog:
            raise UserError(f"data environment[{name!r}]: {name} is a catalog knob; set it with `knobkeeper set`")
    for name in instance:
        if name in knobs:
            raise UserError(f"{service.key}: knob {name} is set per instance by the {service.engine} engine family "
                            f"(data {service.role}_*_port); remove it from the declared knobs")
    knob_rows = []
    shown: dict[str, str] = {}
    secrets: dict[str, tuple[str, str]] = {}
    for name in sorted(knobs):
        knob = catalog.for_role(name, service.role)
        value = knobs[name]
        row = {"name": name, "secret": knob.secret, "value": "", "secret_path": ""}
        if knob.secret:
            path = f"{service.secrets_dir}/{name}"
            row["secret_path"] = path
            secrets[path] = (scope or service.role, name)  # where the value lives: .knobkeeper-secrets/<scope>/
        else:
            row["value"] = knob.render_value(value)
        knob_rows.append(row)
        shown[name] = knob.display(value)
    reads = service.family.reads_knobs_of
    unset = sorted(n for n, k in catalog.knobs.items()
                   if service.role in k.roles and n not in knobs and k.engine in (None, reads))
    context = {
        "service": service.name,
        "role": service.role,
        "host": service.host,
        "knobs": knob_rows,
        "unset": unset,
        "environment": sorted(env_fixed.items()),
        "command": list(command),
        "workdir": service.service_dir,
        "launch_path": service.launch_path,
        "log_path": service.log_path,
        "stop_timeout": service.stop_timeout,
        "user": service.user,
        "group_path": service.group_path,
        # systemd stops a unit's whole cgroup and Slurm a step's processes; under supervisord what a
        # killed main process started outlives it (templates/launch.sh.j2 says what is done then)
        "stop_leftovers": service.manager == "supervisord",
    }
    manager_template = PROGRAM_TEMPLATE if service.manager == "supervisord" else UNIT_TEMPLATE
    paths = [(service.launch_path, LAUNCH_TEMPLATE, "0755"), (service.manager_file, manager_template, "0644")]
    if not unit:
        paths = paths[:1]  # the target starts the launch script itself (a Slurm job's script: deploy/slurm)
    bare = {path: strip_header(render_template(templates_dir, tpl, {**context, "header": []})) for path, tpl, _ in paths}
    digest = content_digest(bare, shown)
    meta = {
        "service": service.name, "role": service.role, "host": service.host,
        "source": source.commit, "dirty": source.dirty, "digest": digest, "knobs": shown,
    }
    first = f"{service.name} (role {service.role}) on {service.host}: rendered by knobkeeper; edits on the host are overwritten"
    common = [first, f"source: {source.label}", f"digest: {digest}"]
    knob_lines = [f"knob {n}: {_one_line(provenance.get(n, 'declared, no changelog entry'))}" for n in sorted(knobs)]
    headers = {
        service.launch_path: common + knob_lines + [META_PREFIX[2:] + json.dumps(meta, sort_keys=True)],
        service.manager_file: common,
    }
    files = {path: render_template(templates_dir, tpl, {**context, "header": headers[path]}) for path, tpl, _ in paths}
    return RenderedService(
        service=service, files=files, modes={path: mode for path, _, mode in paths}, secrets=secrets,
        knobs=shown, provenance={n: provenance.get(n, "") for n in knobs}, digest=digest,
        templates={path: tpl for path, tpl, _ in paths},
        environment={**{row["name"]: row["value"] for row in knob_rows if not row["secret"]}, **env_fixed},
    )


def content_digest(bodies: Mapping[str, str], knobs: Mapping[str, str]) -> str:
    """The digest of a service's files (headers stripped) and its knob values as shown (a secret's
    fingerprint: a new secret value restarts the service although no file text changed)."""
    text = json.dumps({"files": dict(bodies), "knobs": dict(knobs)}, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def render_supervisord(plan: Any, source: Source, templates_dir: Path) -> dict[str, str]:
    """The host's own supervisord.conf (supervisord hosts only)."""
    sup = plan.supervisor
    context = {
        "header": [f"supervisord of {plan.name}: rendered by knobkeeper", f"source: {source.label}"],
        "root": sup.root, "socket": sup.socket, "pidfile": sup.pidfile,
    }
    return {sup.conf: render_template(templates_dir, SUPERVISORD_TEMPLATE, context)}


def parse_meta(script_text: str) -> dict[str, Any] | None:
    """The `# knobkeeper: {...}` line of a rendered launch script, or None."""
    for line in script_text.splitlines():
        if line.startswith(META_PREFIX):
            try:
                return json.loads(line[len(META_PREFIX):])
            except ValueError:
                return None
    return None


# --- the stack as a whole -------------------------------------------------------------------------


# What rendered files are made of: inventory (knobs, catalog, host data), templates, and the changelog
# entries named in the headers. Deploy records (changelog/deploys) are not an input.
SOURCE_PATHS = ("inventory", "templates", "changelog/entries")


def source_of(root: Path, paths: tuple[str, ...] = ("inventory", "templates"),
              dirty: list[str] | None = None) -> Source:
    """The last commit that changed what files are rendered from (not HEAD: a deploy record commit
    must not change every file's header, or every deploy re-uploads every file), and whether `paths`
    have uncommitted changes (tracked or untracked); `dirty`: those changes when the caller has just
    read them (dirty_paths of the same `paths`), not asked of git again."""
    commit = gitio.last_commit_touching(root, SOURCE_PATHS) or gitio.head_sha(root)
    return Source(commit=commit or "uncommitted", dirty=bool(dirty if dirty is not None else gitio.dirty_paths(root, paths)))


def head_commit(root: Path) -> str:
    return gitio.head_sha(root) or "uncommitted"


def dirty_paths(root: Path, paths: tuple[str, ...] = ("inventory", "templates")) -> list[str]:
    return gitio.dirty_paths(root, paths)


def normalize_overrides(catalog: Catalog, overrides: Mapping[str, Any] | None, roles: list[str],
                        services: Mapping[str, str] | None = None) -> dict[str, dict[str, Value | None]]:
    """knob_overrides to {role or service key: {knob: value or None (unset)}}.

    Accepts {role: {KNOB: value}}, {"HOST/SERVICE": {KNOB: value}} (one service only, e.g. the
    canary's "@local/knobkeeper-decode-2"; `services` maps each service key of the inventory to its
    role) in any mix, or flat {KNOB: value} (applied to every role of the inventory the knob applies
    to). A service's override wins over its role's. Values are checked against the catalog (for the
    service's role); secrets cannot be overridden.
    """
    if not overrides:
        return {}
    if not isinstance(overrides, Mapping):
        raise UserError("knob_overrides: expected a JSON object, {\"ROLE\": {\"KNOB\": value}}, "
                        "{\"HOST/SERVICE\": {\"KNOB\": value}} or {\"KNOB\": value}")
    services = dict(services or {})
    out: dict[str, dict[str, Value | None]] = {}
    nested = all(isinstance(v, Mapping) for v in overrides.values())
    items: list[tuple[str, str, str, Any]] = []  # (key of the result, role, knob, value)
    if nested:
        for key, table in overrides.items():
            if key in roles:
                role = key
            elif key in services:
                role = services[key]
            elif "/" in key:
                raise UserError(f"knob_overrides: {key!r} is not a service of this inventory (services: "
                                f"{', '.join(services) or 'none'})")
            else:
                raise UserError(f"knob_overrides: {key!r} is not a role of this inventory (roles: {', '.join(roles)}; "
                                f"or a service key HOST/SERVICE)")
            items += [(key, role, name, value) for name, value in table.items()]
    else:
        for name, value in overrides.items():
            knob = catalog.get(name)
            hit = [r for r in roles if r in knob.roles]
            if not hit:
                raise UserError(f"knob_overrides: {name} applies to {', '.join(knob.roles)}, none of them in this inventory")
            items += [(r, r, name, value) for r in hit]
    for key, role, name, value in items:
        knob = catalog.for_role(name, role)
        if knob.secret:
            raise UserError(f"knob_overrides: {name} is a secret knob; secrets cannot be overridden for a run")
        if value is not None:
            value = knob.from_data(value)
        out.setdefault(key, {})[name] = value
    return out


INVENTORY_DEFAULT = "inventory default (data knob_defaults; `knobkeeper set` declares another value)"


def _knob_defaults(catalog: Catalog, plan: Any, role: str, roles: list[str]) -> dict[str, Value]:
    """Host data `knob_defaults` {ROLE: {KNOB: value}}: the values a role's knobs take on this
    inventory's hosts when knobs.toml declares none (a declared value, then a run's override, wins).
    For a stack whose hosts need a baseline a user's repo does not declare: the local vLLM stack's
    two instances each bound to their own core. Checked against the catalog like an override."""
    table = plan.data.get("knob_defaults") or {}
    if not isinstance(table, Mapping) or not all(isinstance(v, Mapping) for v in table.values()):
        raise UserError(f"host {plan.name}: data knob_defaults: expected {{\"ROLE\": {{\"KNOB\": value}}}}")
    if role not in table:
        return {}
    try:
        checked = normalize_overrides(catalog, {role: table[role]}, roles).get(role, {})
    except UserError as exc:
        raise UserError(f"host {plan.name}: data knob_defaults: {str(exc).removeprefix('knob_overrides: ')}") from None
    return {name: value for name, value in checked.items() if value is not None}


def _apply_overrides(values: dict[str, Value], provenance: dict[str, str],
                     overrides: Mapping[str, Value | None]) -> None:
    for name, value in overrides.items():
        if value is None:
            values.pop(name, None)
            provenance.pop(name, None)
        else:
            values[name] = value
            provenance[name] = OVERRIDE


def render_stack(
    project: Any,
    stack: Any,
    *,
    knob_overrides: Mapping[str, Any] | None = None,
    source: Source | None = None,
    check_secrets: bool = False,
    declared: Mapping[str, Mapping[str, Value]] | None = None,
    entries: list[Any] | None = None,
) -> dict[tuple[str, str], RenderedService]:
    """Every (host, service) of the stack rendered from the project's knobs, catalog and changelog;
    `declared` and `entries`: the state a knob change is about to commit, instead of the files' (the
    change renders the files it commits with it: a Kubernetes stack's manifests)."""
    catalog = load_catalog(project.catalog_path)
    declared = declared if declared is not None else read_declared(project.knobs_path, catalog)
    latest = latest_by_knob(entries if entries is not None else load_entries(project))
    overrides = normalize_overrides(catalog, knob_overrides, list(stack.roles),
                                    {svc.key: svc.role for svc in stack.services})
    source = source or source_of(project.root)
    out: dict[tuple[str, str], RenderedService] = {}
    target = target_of(stack)
    # The target says each service's command line: the inventory's on hosts; under Slurm, where the
    # job places the services, with placement tokens filled on the nodes (deploy/slurm/job.py).
    commands = target.commands()
    for role in stack.order:
        key = stack.scope(role)  # [decode], or [vllm.decode] for an inventory of stack "vllm"
        values = dict(declared.get(key, {}))
        provenance: dict[str, str] = {}
        for name in values:
            entry = latest.get((key, name))
            provenance[name] = (
                f"entry {entry.id} ({entry.action} {entry.time} by {entry.author})" if entry else "declared, no changelog entry"
            )
        _apply_overrides(values, provenance, overrides.get(role, {}))
        if check_secrets:
            for name, value in values.items():
                problem = secret_mismatch(project, key, name, value) if catalog.get(name).secret else None
                if problem:
                    raise UserError(problem)
        for plan in stack.hosts.values():
            env = plan.data.get("environment") or {}
            defaults = _knob_defaults(catalog, plan, role, list(stack.roles))
            for svc in plan.role_services(role):
                svc_values = {**defaults, **values}
                svc_provenance = {**{name: INVENTORY_DEFAULT for name in defaults}, **provenance}
                _apply_overrides(svc_values, svc_provenance, overrides.get(svc.key, {}))
                out[(svc.host, svc.name)] = render_service(
                    svc, commands[(svc.host, svc.name)], knobs=svc_values, catalog=catalog, provenance=svc_provenance,
                    source=source, templates_dir=project.templates_dir, environment=env,
                    instance_env=svc.family.instance_environment(svc, plan.data), scope=key,
                    unit=target.service_units,
                )
    # A Slurm stack's job script (every component's launch script inside) is a rendered file too,
    # keyed (login host, job name): review shows it, check lints it.
    out.update(target.extra_files(project, out, source))
    return out
