"""The deploy: from an inventory and the declared knobs to running services, in dependency order,
health-gated, recorded. Owns the facts of how a stack is laid out and started:

    options    DeployOptions (restart mode, only, batch, rollback, overrides, record, ...), validated once
    model      the dataclasses: Stack, HostPlan, Service, Supervisor
    topology   roles from group data; the deploy order (a topological sort of `after`)
    stack      a Stack from a pyinfra inventory (host data validated here)
    engines    the engine command of each service and the interpreter it runs with
    render     THE file texts (launch script, unit / program section), the header rule, the digest
    plan       restart decisions and their reasons in words (deploy, `plan`, review)
    health     gates: healthy, the supervised process answers, it stays up (its settle waited out
               at once or while independent work goes on); the partial-deploy check
    observe    what a host runs (service state, started files), shell on any host of an inventory
    status     declared vs running per service
    record     deploy records (typed rows), written and read here only
    target     where a stack runs, one interface (target_of): hosts.py (pyinfra's hosts) or slurm/;
               the rest of deploy, and ab run, call its methods and never ask which kind it is
    operations the pyinfra operations deploy.py calls; api: run a deploy from Python
    hosts      the hosts target: the restarts role by role on each host
    local      the local stack's supervisord (stop, pids)
    slurm/     Slurm as a target: the stack as one job, a change as a new job (see its docstring)

May import: knobkeeper.changelog (entries, the store's commit), knobkeeper.knobs, knobkeeper.gitio,
knobkeeper.fmt, knobkeeper.project, knobkeeper.errors, knobkeeper.timeutil, pyinfra. Never the CLI,
review, audit, evidence or report (they sit above), nor torch/triton.
"""
