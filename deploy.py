"""knobkeeper's deploy (pyinfra 3): `pyinfra -y inventory/local.py deploy.py [--data KEY=VALUE ...]`.

--data restart=changed|co|none   what to restart (default changed: files changed or not running)
--data only=ROLE                 upload and restart this role only (its downstream roles are still gated)
--data knob_overrides=JSON       {"ROLE": {"KNOB": value}} or {"HOST/SERVICE": {"KNOB": value}} (one service,
                                 e.g. "@local/knobkeeper-decode-2") for this run only, never written to knobs.toml
--data decode_workers=N          N decode services per decode host (any <role>_workers; knobkeeper/deploy/stack.py)
--data record=false              do not commit the deploy record (it goes to .knobkeeper-state/deploys/)
--data allow_dirty=true          deploy uncommitted changes to inventory/ or templates/ (recorded)
--data batch=N                   restart a role's hosts N at a time, each batch gated (default: all at once)
--data rollback=true             a failed gate puts the service's previous files back and restarts it
                                 (the run still fails)

The steps live in knobkeeper/deploy/operations.py; read its docstring for the ordering rules.
"""

import sys

from pyinfra import host, inventory

from knobkeeper.deploy import operations as kk
from knobkeeper.errors import UserError

# config.py (loaded before any host is connected) stops the whole run on the first failed host:
# nothing downstream of a failed gate is touched.

try:
    run = kk.current_run(inventory)
except UserError as exc:
    print(f"knobkeeper: error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2)

plan = run.stack.hosts[host.name]

kk.engine(run, plan)
# The target's operations: on hosts, the services' files, then role by role each restart and its gate
# (knobkeeper/deploy/hosts.py); a Slurm stack is one job submitted from this (login) host, gated role by
# role where Slurm placed it, then the old job cancelled (knobkeeper/deploy/slurm/ops.py).
run.target_run.operations(plan)

kk.finish(run)
