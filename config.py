"""pyinfra configuration, loaded before pyinfra connects to any host (deploy.py is loaded after).

FAIL_PERCENT = 0: a host that cannot be reached fails the run before any operation runs anywhere,
instead of pyinfra carrying on with the hosts it could reach (its default). It must be set on the
config object; a bare `FAIL_PERCENT = 0` here is ignored.

watch_parent(): a deploy started by knobkeeper gets SIGTERM when the process that started it dies
(knobkeeper/deploy/parent.py), also where Linux's PR_SET_PDEATHSIG does not exist.
"""

from pyinfra import config

config.FAIL_PERCENT = 0

# Started by knobkeeper (a canary, `ab run`, `knobkeeper deploy`): die with that process, on any OS.
from knobkeeper.deploy.parent import watch_parent  # noqa: E402

watch_parent()
