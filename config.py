"""pyinfra configuration, loaded before pyinfra connects to any host (deploy.py is loaded after).

FAIL_PERCENT = 0: a host that cannot be reached fails the run before any operation runs anywhere,
instead of pyinfra carrying on with the hosts it could reach (its default). It must be set on the
config object; a bare `FAIL_PERCENT = 0` here is ignored.
"""

from pyinfra import config

config.FAIL_PERCENT = 0
