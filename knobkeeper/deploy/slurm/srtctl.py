"""`knobkeeper import srtctl RECIPE`: an srt-slurm (`srtctl`) recipe as a Slurm inventory plus
declared knobs, in one commit. The mapping (README "For srtctl users" has the table):

    name                                    -> slurm_job_name, the inventory's file name
    slurm.partition / account / time_limit  -> slurm_partition / slurm_account / slurm_time_limit
    resources.<role>_workers                -> <role>_workers (one het component each)
    resources.<role>_nodes, gpus_per_node   -> <role>_slurm["gpus"]: gpus_per_<role>, else the role's
                                               tensor-parallel-size, else nodes * gpus_per_node / workers
                                               (a worker spanning nodes cannot be mapped)
    model.path / model.container            -> model / <role>_slurm["srun"] --container-image
                                               (aliases resolve through --srtslurm srtslurm.yaml)
    container_mounts / extra_mount          -> --container-mounts of every component
    backend.<role>_environment, environment -> knobs.toml [<role>] when the catalog (or the engine's
                                               registry) has the variable for that role; otherwise the
                                               inventory's `environment` when every worker role sets the
                                               same value; otherwise: exit 2 naming it
    backend.sglang_config.<role>            -> engine_args[<role>] (served-model-name, model-path, tp,
                                               transfer backend, bootstrap port: their own data keys)
    frontend (type sglang) args             -> the sglang-router's engine_args; type dynamo (the
                                               default): exit 2 unless --router names the router that
                                               replaces it
    sbatch_directives / srun_options        -> slurm_sbatch / every component's srun options
    health_check                            -> health_timeout (max_attempts x interval_seconds)
    benchmark                               -> not a deploy: the `knobkeeper ab run` it corresponds to
                                               is printed

Anything else (aggregated mode, another backend, setup scripts, profiling, sweeps, dynamo options)
cannot be mapped mechanically: one line naming the field, exit 2, nothing written.
"""

from __future__ import annotations

import json
import pprint
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from knobkeeper.deploy.render import render_stack
from knobkeeper.deploy.stack import load_stack
from knobkeeper.engine import engine_spec
from knobkeeper.engine.routers import SGLANG_ROUTER
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import load_catalog

ROUTERS = ("sglang-router", "smg")
WORKER_ROLES = ("prefill", "decode")
# sglang_config keys that are the inventory's own data (or the deploy's), never engine_args.
OWN_FLAGS = {"disaggregation-mode": None, "host": None, "port": None, "model-path": "model",
             "served-model-name": "served_model_name", "tensor-parallel-size": "tp_size", "tp-size": "tp_size",
             "tp": "tp_size", "disaggregation-transfer-backend": "transfer_backend",
             "disaggregation-bootstrap-port": "prefill_bootstrap_port"}
IGNORED = {"dynamo": "Dynamo's version: the sglang router fronts the workers instead",
           "output": "srtctl's log folders: the job writes under {prefix}/slurm/",
           "enable_config_dump": "srtctl's config dump: the job script itself is the saved config"}
UNMAPPABLE = ("setup_script", "profiling", "telemetry", "sweep", "infra", "identity", "reporting")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Imported:
    name: str
    inventory: str  # inventory/<name>.py
    data: dict[str, Any]
    knobs: list[tuple[str, str, str]] = field(default_factory=list)  # (role, knob, value)
    notes: list[str] = field(default_factory=list)
    commit: str | None = None


def _yaml(path: Path) -> dict[str, Any]:
    # PyYAML (~10 ms) only for `import srtctl`; the Slurm target's other readers never parse YAML
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such recipe") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a recipe (a YAML mapping with name, model, resources, backend)")
    return data


def _flag_args(where: str, table: Any) -> list[str]:
    """srtctl's {flag: value} (kebab or snake case) as command-line arguments: true -> --flag,
    false/None -> left out, a list -> the flag's values."""
    if table is None:
        return []
    if not isinstance(table, Mapping):
        raise UserError(f"{where}: expected a mapping of flag: value")
    out: list[str] = []
    for key, value in table.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True or value == "":
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, *[str(v) for v in value]]
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


def _directives(where: str, table: Any) -> list[str]:
    if not table:
        return []
    if not isinstance(table, Mapping):
        raise UserError(f"{where}: expected a mapping of option: value")
    return [f"--{k}" if v in ("", None, True) else f"--{k}={v}" for k, v in table.items()]


def _resolve(where: str, value: Any, aliases: Mapping[str, Any], what: str) -> str:
    text = str(value)
    if text in aliases:
        return str(aliases[text])
    if text.startswith("/") or "://" in text or (":" in text and "/" in text) or text.endswith(".sqsh"):
        return text
    raise UserError(f"{where} = {text!r}: an alias of srtslurm.yaml's {what}: map; pass --srtslurm PATH "
                    f"(the cluster's srtslurm.yaml) or write the full path")


def map_recipe(recipe: Mapping[str, Any], source: str, *, cluster: Mapping[str, Any] | None = None,
               router: str | None = None, sglang_version: str | None = None, prefix: str, login: str = "@local",
               catalog: Any = None) -> Imported:
    """The inventory data and the knobs of a recipe, or UserError naming the first field that cannot
    be mapped. Pure: reads only its arguments."""
    cluster = dict(cluster or {})
    known = {"name", "model", "resources", "slurm", "frontend", "backend", "benchmark", "environment",
             "container_mounts", "extra_mount", "sbatch_directives", "srun_options", "health_check", *IGNORED}
    for key in recipe:
        if key in UNMAPPABLE or key not in known:
            raise UserError(f"{source}: {key}: cannot be mapped onto an inventory and knobs.toml (knobkeeper runs "
                            f"no {key.replace('_', ' ')}); remove it or keep using srtctl for this recipe")
    name = str(recipe.get("name") or "")
    if not _NAME.match(name):
        raise UserError(f"{source}: name = {name!r}: expected a job name ([A-Za-z0-9_.-])")
    slug = re.sub(r"[^A-Za-z0-9_]", "_", name)
    notes: list[str] = []
    for key, why in IGNORED.items():
        if key in recipe:
            notes.append(f"not imported: {key} ({why})")
    res = recipe.get("resources") or {}
    if res.get("agg_nodes") or res.get("agg_workers"):
        raise UserError(f"{source}: resources.agg_nodes: aggregated mode cannot be mapped (a knobkeeper stack is "
                        f"prefill, decode and a router)")
    backend = recipe.get("backend") or {}
    if (backend.get("type") or "sglang") != "sglang":
        raise UserError(f"{source}: backend.type = {backend.get('type')!r}: only sglang recipes map onto this "
                        f"stack's engines")
    unknown_backend = sorted(set(backend) - {"type", "prefill_environment", "decode_environment", "sglang_config",
                                             "gpu_type"})
    if unknown_backend:
        raise UserError(f"{source}: backend.{unknown_backend[0]}: cannot be mapped (no knobkeeper equivalent)")
    frontend = recipe.get("frontend") or {}
    ftype = frontend.get("type") or "dynamo"
    if ftype == "sglang":
        router = router or "sglang-router"
    elif router is None:
        raise UserError(f"{source}: frontend.type = {ftype!r}{' (the default)' if 'type' not in frontend else ''}: "
                        f"knobkeeper fronts the workers with a router of its own; pass --router sglang-router or "
                        f"--router smg to replace it")
    else:
        notes.append(f"frontend {ftype!r} replaced by {router}")
    if router not in ROUTERS:
        raise UserError(f"--router {router!r}: expected one of {', '.join(ROUTERS)}")
    bad_frontend = sorted(set(frontend) - {"type", "args", "env", "enable_multiple_frontends",
                                           "num_additional_frontends", "nginx_container"})
    if bad_frontend:
        raise UserError(f"{source}: frontend.{bad_frontend[0]}: cannot be mapped onto the router")
    if frontend.get("env"):
        raise UserError(f"{source}: frontend.env: the router's environment would be every component's "
                        f"(knobkeeper keeps per-role values as knobs); declare router knobs with `knobkeeper set`")
    if frontend.get("enable_multiple_frontends") and frontend.get("num_additional_frontends"):
        notes.append("one router instead of nginx + several frontends")

    slurm = recipe.get("slurm") or {}
    data: dict[str, Any] = {
        "prefix": prefix, "service_manager": "slurm", "slurm_job_name": name,
        # engine and version per role, in one place (knobkeeper.engine.role_engine reads it)
        "engines": {"prefill": engine_spec("sglang", sglang_version), "decode": engine_spec("sglang", sglang_version),
                    "router": engine_spec(router, SGLANG_ROUTER.version if router == SGLANG_ROUTER.name else None)},
        "listen_host": "0.0.0.0",
    }
    for key, target, fallback in (("partition", "slurm_partition", "default_partition"),
                                  ("account", "slurm_account", "default_account"),
                                  ("time_limit", "slurm_time_limit", "default_time_limit")):
        value = slurm.get(key) or cluster.get(fallback)
        if value:
            data[target] = str(value)
    if sorted(set(slurm) - {"partition", "account", "time_limit"}):
        extra = sorted(set(slurm) - {"partition", "account", "time_limit"})[0]
        raise UserError(f"{source}: slurm.{extra}: cannot be mapped (use sbatch_directives)")

    model = recipe.get("model") or {}
    if not model.get("path"):
        raise UserError(f"{source}: model.path: required (the model every worker serves)")
    model_path = _resolve(f"{source}: model.path", model["path"], cluster.get("model_paths") or {}, "model_paths")
    config = backend.get("sglang_config") or {}
    inside = next((str(v) for role in WORKER_ROLES for k, v in (config.get(role) or {}).items()
                   if str(k).replace("_", "-") == "model-path"), None)
    srun: list[str] = []
    if model.get("container"):
        # srtctl mounts the model into the container (at /model unless the flags name another path).
        data["model"] = inside or "/model"
        image = _resolve(f"{source}: model.container", model["container"], cluster.get("containers") or {}, "containers")
        srun.append(f"--container-image={image}")
        mounts = [f"{prefix}:{prefix}", f"{model_path}:{data['model'].rstrip('/') or '/'}"]
        # ^ the job's files (every component reads its script there) and the model
        for src, dst in (recipe.get("container_mounts") or {}).items():
            mounts.append(f"{src}:{dst}")
        mounts += [str(m) for m in recipe.get("extra_mount") or []]
        srun.append("--container-mounts=" + ",".join(dict.fromkeys(mounts)))
    elif recipe.get("container_mounts") or recipe.get("extra_mount"):
        raise UserError(f"{source}: container_mounts: mounts without model.container")
    else:
        data["model"] = model_path
    srun += _directives(f"{source}: srun_options", recipe.get("srun_options"))

    gpus_per_node = int(res.get("gpus_per_node") or cluster.get("gpus_per_node") or 0)
    for role in WORKER_ROLES:
        workers = int(res.get(f"{role}_workers") or 0)
        nodes = res.get(f"{role}_nodes")
        if workers < 1:
            raise UserError(f"{source}: resources.{role}_workers: expected at least 1")
        explicit = res.get(f"gpus_per_{role}")
        tp = next((v for k, v in (config.get(role) or {}).items()
                   if str(k).replace("_", "-") in ("tensor-parallel-size", "tp-size", "tp")), None)
        if explicit:
            gpus = int(explicit)
        elif tp:
            gpus = int(tp)  # what the worker uses; nodes x gpus_per_node is the allocation srtctl packs them into
        elif nodes in (None, 0) and role == "decode":
            gpus = gpus_per_node  # decode_nodes: 0 shares prefill's nodes: one node's GPUs per worker
        else:
            total = int(nodes or 0) * gpus_per_node
            if total % workers:
                raise UserError(f"{source}: resources.{role}_nodes = {nodes} x gpus_per_node = {gpus_per_node} over "
                                f"{workers} workers: not a whole number of GPUs per worker")
            gpus = total // workers
        if gpus_per_node and gpus > gpus_per_node:
            raise UserError(f"{source}: resources.{role}_nodes = {nodes} for {role}_workers = {workers}: a worker "
                            f"spanning nodes ({gpus} GPUs, {gpus_per_node} per node) cannot be mapped (each "
                            f"component runs on one node)")
        data[f"{role}_workers"] = workers
        data[f"{role}_slurm"] = {"gpus": gpus, **({"srun": list(srun)} if srun else {})}
    data["router_slurm"] = {"cpus": 4, **({"srun": list(srun)} if srun else {})}
    if recipe.get("sbatch_directives"):
        data["slurm_sbatch"] = _directives(f"{source}: sbatch_directives", recipe["sbatch_directives"])
    health = recipe.get("health_check") or {}
    if health:
        data["health_timeout"] = int(health.get("max_attempts", 180)) * int(health.get("interval_seconds", 10))

    # Flags: per role, the inventory's own keys out, the rest engine_args.
    unknown_modes = sorted(set(config) - set(WORKER_ROLES))
    if unknown_modes:
        raise UserError(f"{source}: backend.sglang_config.{unknown_modes[0]}: only prefill and decode map")
    engine_args: dict[str, list[str]] = {}
    own: dict[str, dict[str, Any]] = {}
    for role in WORKER_ROLES:
        flags = dict(config.get(role) or {})
        for key in list(flags):
            norm = str(key).replace("_", "-")
            if norm in OWN_FLAGS:
                target = OWN_FLAGS[norm]
                value = flags.pop(key)
                if target:
                    own.setdefault(target, {})[role] = value
        engine_args[role] = _flag_args(f"{source}: backend.sglang_config.{role}", flags)
    for target, per_role in own.items():
        values = {str(v) for v in per_role.values()}
        if target == "model":
            continue  # placed above (the container's path of the model)
        if target == "prefill_bootstrap_port":
            data[target] = int(per_role.get("prefill", next(iter(per_role.values()))))
        elif len(values) > 1:
            raise UserError(f"{source}: backend.sglang_config: {target.replace('_', '-')} differs between prefill "
                            f"({per_role.get('prefill')!r}) and decode ({per_role.get('decode')!r}); knobkeeper "
                            f"keeps it once ({target}), put the difference into engine args by hand")
        else:
            data[target] = int(values.pop()) if target == "tp_size" else values.pop()
    router_args = dict(frontend.get("args") or {})
    if "policy" in router_args:
        data["router_policy"] = str(router_args.pop("policy"))
    engine_args["router"] = _flag_args(f"{source}: frontend.args", router_args)
    data["engine_args"] = engine_args

    # Environment: knobs where the catalog knows them for the role, shared environment otherwise.
    knobs: list[tuple[str, str, str]] = []
    shared: dict[str, str] = {}
    per_role_env = {role: dict(backend.get(f"{role}_environment") or {}) for role in WORKER_ROLES}
    for var, value in (recipe.get("environment") or {}).items():
        for role in WORKER_ROLES:
            per_role_env[role].setdefault(var, value)
    leftovers: dict[str, dict[str, str]] = {}
    for role, env in per_role_env.items():
        for var, value in env.items():
            if not _VAR.match(str(var)):
                raise UserError(f"{source}: backend.{role}_environment.{var}: not a variable name")
            text = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            if "{node" in text:
                raise UserError(f"{source}: backend.{role}_environment.{var} = {text!r}: per-node templates cannot "
                                f"be mapped (a knob has one value per role)")
            verdict = _as_knob(catalog, var, role)
            if verdict is None:
                knobs.append((role, var, text))
            elif verdict == "not a knob":
                leftovers.setdefault(var, {})[role] = text
            else:
                hint = (f" (the catalog's roles say which engines read it: drop it from {role}_environment, or add "
                        f"{role} to its roles in inventory/catalog.toml)" if "does not apply to role" in verdict else "")
                raise UserError(f"{source}: backend.{role}_environment.{var}: {verdict}{hint}")
    for var, by_role in sorted(leftovers.items()):
        if set(by_role) != set(WORKER_ROLES) or len(set(by_role.values())) > 1:
            shown = ", ".join(f"{r} {v!r}" for r, v in sorted(by_role.items()))
            raise UserError(f"{source}: {var} ({shown}): not a catalog knob, and not the same in every worker role, "
                            f"so it cannot be the inventory's environment; add it to inventory/catalog.toml with its "
                            f"roles, then import again")
        shared[var] = next(iter(by_role.values()))
    if shared:
        data["environment"] = shared
    bench = recipe.get("benchmark") or {}
    if bench:
        conc = bench.get("concurrencies")
        levels = ",".join(str(c) for c in conc) if isinstance(conc, list) else str(conc or "").replace("x", ",")
        notes.append(f"not imported: benchmark ({bench.get('type', '?')}); the A/B of a knob on this stack: "
                     f"knobkeeper ab run --inventory inventory/{slug}.py --role decode --set KNOB=VALUE "
                     f"--concurrency {levels or '64'} --input-len {bench.get('isl', 1024)} "
                     f"--output-len {bench.get('osl', 1024)}")
    return Imported(name=name, inventory=f"inventory/{slug}.py", data=data, knobs=knobs, notes=notes)


def _as_knob(catalog: Any, var: str, role: str) -> str | None:
    """None when `var` is a knob of `role`; "not a knob" when the catalog does not know it at all;
    else why it cannot be declared for the role."""
    if catalog is None:
        return "not a knob"
    try:
        knob = catalog.for_role(var, role)
    except UserError as exc:
        text = str(exc)
        return "not a knob" if text.startswith("unknown knob") else text
    if knob.secret:
        return "a secret knob: set it with `knobkeeper set --value-file`, never from a recipe"
    return None


def inventory_text(imported: Imported, source: str, login: str) -> str:
    body = pprint.pformat((login, imported.data), width=110, sort_dicts=False)
    return (f'"""{imported.name}: imported from the srtctl recipe {source} by `knobkeeper import srtctl`.\n\n'
            f"One heterogeneous Slurm job (knobkeeper/deploy/slurm/): prefill and decode SGLang workers, each on a\n"
            f"node of its own, and one router, submitted from {login}. Knob values are in inventory/knobs.toml\n"
            f"(the import's entries say where each came from); edit the rest here.\n"
            f'"""\n\n_login = {body}\n\nprefill = [_login]\ndecode = [_login]\nrouter = [_login]\n')


def prepare_import(project: Any, recipe_path: str | Path, *, name: str | None = None, router: str | None = None,
                   srtslurm: str | Path | None = None, sglang_version: str | None = None, prefix: str | None = None,
                   login: str = "@local") -> tuple[Imported, Path, str]:
    """The recipe mapped: (what it imports, the inventory file to write, its text), the stack it
    describes loaded and rendered like every other inventory; nothing written. The commit of the
    inventory and the knobs is a knob change (changelog.ops.import_srtctl)."""
    path = Path(recipe_path)
    recipe = _yaml(path)
    cluster = _yaml(Path(srtslurm)) if srtslurm else {}
    if name:
        recipe = {**recipe, "name": name}
    slug = re.sub(r"[^A-Za-z0-9_]", "_", str(recipe.get("name") or path.stem))
    prefix = prefix or str(project.state_dir / slug)
    if not prefix.startswith("/") or any(c.isspace() for c in prefix):
        raise UserError(f"--prefix {prefix!r}: expected an absolute path on the shared filesystem, without spaces")
    imported = map_recipe(recipe, path.name, cluster=cluster, router=router, sglang_version=sglang_version,
                          prefix=prefix, login=login, catalog=load_catalog(project.catalog_path))
    target = project.root / imported.inventory
    if target.exists():
        raise UserError(f"{imported.inventory}: exists; pass --name to import under another name")
    text = inventory_text(imported, path.name, login)
    # The stack it describes must load and render like every other inventory before anything is written
    # (a leading _ keeps `check` and `review` from listing the trial file).
    trial = target.with_name(f"_import_{target.name}")
    trial.write_text(text)
    try:
        render_stack(project, load_stack(project.root, trial))
    finally:
        trial.unlink()
    return imported, target, text
