"""The deploy's own render, for review and check: every file of every (host, service) of every
inventory, through knobkeeper.deploy.render, so what is reviewed and linted is what is deployed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobkeeper.deploy import render, repo_files
from knobkeeper.deploy.render import SUPERVISORD_TEMPLATE, WholeStack, strip_header
from knobkeeper.deploy.stack import _host_data, load_inventory, load_stack, Stack, stack_from_inventory
from knobkeeper.errors import UserError
from knobkeeper.project import Project


@dataclass
class RenderedFile:
    inventory: str  # "inventory/local.py"
    host: str
    role: str       # "" for a host-wide file (supervisord.conf)
    service: str    # "" for a host-wide file
    path: str       # where the file goes on the host
    text: str
    knobs: str = ""  # the service's knob values as rendered (a secret: its fingerprint), JSON
    reviewed: str | None = None  # the text a review diffs, where not `text` (RenderedService.reviewed)
    template: str = ""  # the template under templates/ it was rendered from: what a lint failure names
    whole_stack: WholeStack | None = None  # RenderedService.whole_stack: its change restarts every component
    describe: Any = None  # RenderedService.describe: a target's words for what changed in it (a manifest)

    @property
    def shown(self) -> str:
        """The text a review diffs."""
        return self.text if self.reviewed is None else self.reviewed

    @property
    def body(self) -> str:
        """The text without its header(s): what the process or service manager would see differently."""
        return strip_header(self.shown)


@dataclass
class InventoryRender:
    inventory: str
    order: list[str] = field(default_factory=list)
    roles: dict[str, Any] = field(default_factory=dict)  # name -> topology.Role
    files: dict[tuple[str, str], RenderedFile] = field(default_factory=dict)  # (host, path) -> file
    services: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, service) -> digest
    error: str | None = None

    def service_files(self, host: str, service: str) -> dict[str, RenderedFile]:
        """{path: file} of one (host, service)."""
        return {p: f for (h, p), f in self.files.items() if h == host and f.service == service}


inventories = repo_files.inventory_files  # every pyinfra inventory file: inventory/*.py, sorted


def relative(message: str, *roots: Path) -> str:
    """An error message with the repo's (or a snapshot's) path taken out of the paths it names."""
    for root in roots:
        message = message.replace(f"{root}/", "")
    return message


def _rebased(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, (dict, list, tuple)) and old in json.dumps(value, default=str):
        return json.loads(json.dumps(value, default=str).replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))
    return value


def load_stack_as(project: Project, inventory: str, data: dict | None = None, rebase: Path | None = None) -> Any:
    """The inventory's Stack; with `rebase`, host data that names the snapshot's root names `rebase`
    instead (an inventory that places files relative to its repo, like local.py, renders the paths, and
    so the digests, the real repo's deploy renders)."""
    inv = load_inventory(project.root, inventory, data)
    if rebase is not None and rebase != project.root:
        old, new = str(project.root), str(rebase)
        for host in inv:
            for key, value in _host_data(host).items():
                moved = _rebased(value, old, new)
                if moved != value:
                    setattr(host.data, key, moved)
    return stack_from_inventory(inv, Path(inventory).stem)


def render_inventory(project: Project, inventory: str, source: Any = None, data: dict | None = None,
                     rebase: Path | None = None) -> InventoryRender:
    """Every file of every (host, service) of one inventory, via knobkeeper.deploy.render."""
    out = InventoryRender(inventory)
    try:
        stack = load_stack_as(project, inventory, data, rebase)
    except UserError as exc:
        out.error = relative(str(exc), project.root)
        return out
    out.order, out.roles = list(stack.order), dict(stack.roles)
    source = source or render.source_of(project.root)
    try:
        rendered = render.render_stack(project, stack, source=source)
        for plan in stack.hosts.values():
            if plan.supervisor is not None:
                for path, text in render.render_supervisord(plan, source, project.templates_dir).items():
                    out.files[(plan.name, path)] = RenderedFile(inventory, plan.name, "", "", path, text,
                                                                template=SUPERVISORD_TEMPLATE)
    except UserError as exc:
        out.error = relative(str(exc), project.root)
        return out
    for (host, name), svc in rendered.items():
        out.services[(host, name)] = svc.digest
        for path, text in svc.files.items():
            out.files[(host, path)] = RenderedFile(inventory, host, svc.service.role, name, path, text,
                                                   json.dumps(svc.knobs, sort_keys=True), svc.reviewed.get(path),
                                                   svc.templates.get(path, ""), svc.whole_stack, svc.describe)
    return out


def render_errors_per_host(project: Project, inventory: str, source: Any = None) -> list[tuple[str, str]]:
    """(host, error) for every host whose files fail to render ('' as host when the inventory fails)."""
    try:
        stack = load_stack(project.root, inventory)
    except UserError as exc:
        return [("", relative(str(exc), project.root))]
    source = source or render.source_of(project.root)
    errors = []
    for name, plan in stack.hosts.items():
        one = Stack(inventory=stack.inventory, roles=stack.roles, order=stack.order, hosts={name: plan},
                    commands={k: v for k, v in stack.commands.items() if k[0] == name})
        try:
            render.render_stack(project, one, source=source)
            if plan.supervisor is not None:
                render.render_supervisord(plan, source, project.templates_dir)
        except UserError as exc:
            errors.append((name, relative(str(exc), project.root)))
    return errors


def shown_paths(text: str, root: Path, home: Path | None) -> str:
    """`text` as a PR body shows it: paths under the repo relative to it ("cd /home/a/infra/x" ->
    "cd x"), others under the home folder from ~ (a body is read on other machines, and two of
    them must write the same body)."""
    for folder, short in ((root, "."), (home, "~")):
        if folder is None or str(folder) in ("", "/"):
            continue
        text = re.sub(re.escape(str(folder)) + r"(/|(?![\w.-]))", lambda m: "" if m.group(1) == "/" and short == "."
                      else short + m.group(1), text)
    return text


def show_paths_from(render: InventoryRender, root: Path, home: Path | None) -> None:
    """Every text and path of `render` as a PR body shows it (`shown_paths`)."""
    files = {}
    for (host, path), f in render.files.items():
        f.path, f.text = shown_paths(f.path, root, home), shown_paths(f.text, root, home)
        f.reviewed = shown_paths(f.reviewed, root, home) if f.reviewed is not None else None
        files[(host, f.path)] = f
    render.files = files
    if render.error:
        render.error = shown_paths(render.error, root, home)


def rebase_paths(render: InventoryRender, old_root: Path, new_root: Path) -> None:
    """Texts rendered in a snapshot name the snapshot's path; show the repo's own (what deploy renders)."""
    old, new = str(old_root), str(new_root)
    files = {}
    for (host, path), f in render.files.items():
        f.path, f.text = f.path.replace(old, new), f.text.replace(old, new)
        f.reviewed = f.reviewed.replace(old, new) if f.reviewed is not None else None
        files[(host, f.path)] = f
    render.files = files
    if render.error:
        render.error = render.error.replace(old, new)
