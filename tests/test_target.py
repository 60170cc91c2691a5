"""Deploy targets behind one interface (knobkeeper/deploy/target.py): the inventory's hosts pick the
target, each target has every member of the interface, a new kind is a row in TARGETS, and the
render, the plan's shape and the probes ask the target rather than which kind it is. What each target
does is tested where it runs: tests/test_deploy_local.py and test_fleet.py (hosts), test_slurm.py,
test_kube.py and test_kube_deploy.py."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from knobkeeper.deploy import target as target_module
from knobkeeper.deploy.hosts import HostsTarget
from knobkeeper.deploy.kube.target import KubeTarget
from knobkeeper.deploy.slurm.target import SlurmTarget
from knobkeeper.deploy.stack import load_stack, running_stack
from knobkeeper.deploy.target import Target, target_of

ROOT = Path(__file__).resolve().parents[1]

# Every member Target declares: its facts (annotations) and its methods.
MEMBERS = set(Target.__annotations__) | {name for name, value in vars(Target).items()
                                         if callable(value) and not name.startswith("_")}


def test_the_interface_is_what_the_callers_use():
    assert MEMBERS == {"kind", "service_units", "started_record", "placed_per_run", "partial_deploys", "installs_engines",
                       "repo_files", "canary_refusal", "check", "commands", "extra_files", "lint", "begin", "placed",
                       "job_plan", "status", "started_knobs"}


@pytest.mark.parametrize("cls", [HostsTarget, SlurmTarget, KubeTarget])
def test_each_target_has_every_member(cls):
    missing = sorted(name for name in MEMBERS if not hasattr(cls, name))
    assert missing == [], f"{cls.__name__} lacks {missing}"


def test_the_hosts_manager_picks_the_target():
    hosts = load_stack(ROOT, "inventory/local.py")
    slurm = load_stack(ROOT, "inventory/example_slurm.py")
    assert isinstance(target_of(hosts), HostsTarget) and target_of(hosts).kind == "hosts"
    assert isinstance(target_of(slurm), SlurmTarget) and target_of(slurm).kind == "slurm"
    # hosts: the services are where the inventory says; the commands are the stack's own
    assert running_stack(ROOT, "inventory/local.py").services == hosts.services
    assert target_of(hosts).commands() is hosts.commands
    # Slurm: a job places its services, so the commands carry placement tokens, not the inventory's ports
    tokened = target_of(slurm).commands()
    assert tokened.keys() == slurm.commands.keys() and tokened != slurm.commands
    assert any("@kk:" in word for command in tokened.values() for word in command)
    assert (target_of(hosts).placed_per_run, target_of(slurm).placed_per_run) == (False, True)
    assert (target_of(hosts).partial_deploys, target_of(slurm).partial_deploys) == (True, False)
    assert (target_of(hosts).service_units, target_of(slurm).service_units) == (True, False)
    # Kubernetes: the peers by their Service names; the manifests in place of the launch scripts, in the repo
    kube = load_stack(ROOT, "inventory/example_k8s.py")
    assert isinstance(target_of(kube), KubeTarget) and target_of(kube).kind == "kubernetes"
    assert any("knobkeeper-decode.llm.svc" in word for word in target_of(kube).commands()[("@local", "knobkeeper-router")])
    assert (target_of(kube).installs_engines, target_of(kube).repo_files, target_of(hosts).repo_files) == (False, True, False)
    assert target_of(kube).canary_refusal and target_of(hosts).canary_refusal is None


def test_no_module_outside_the_targets_asks_which_target_it_is():
    """The kind is the target's to know: a comparison of a manager, a plan's or a stack's kind with a
    target's name outside the target modules is the `if is_slurm` of issue 37 coming back."""
    package = ROOT / "knobkeeper"
    targets = {package / "deploy" / "target.py", package / "deploy" / "hosts.py"}
    asking = re.compile(r"""(==|!=|\bin)\s*\(?\s*["'](slurm|hosts|kubernetes)["']|is_slurm|is_kube""")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted(package.rglob("*.py"))
             if path not in targets and (package / "deploy" / "slurm") not in path.parents
             and (package / "deploy" / "kube") not in path.parents
             for number, line in enumerate(path.read_text().splitlines(), 1) if asking.search(line)]
    assert found == []


class _ThirdTarget:
    """A stand-in for a third kind (Kubernetes): a class and a row in TARGETS."""

    kind = "third"

    def __init__(self, stack):
        self.stack = stack


def test_a_new_kind_is_a_row_in_targets(monkeypatch):
    monkeypatch.setitem(target_module.TARGETS, "third", f"{__name__}:_ThirdTarget")
    stack = SimpleNamespace(hosts={"login": SimpleNamespace(manager="third"),
                                   "node": SimpleNamespace(manager="supervisord")})
    picked = target_of(stack)
    assert isinstance(picked, _ThirdTarget) and picked.stack is stack
    # no host with such a manager: the hosts target
    assert isinstance(target_of(SimpleNamespace(hosts={"a": SimpleNamespace(manager="systemd")})), HostsTarget)
