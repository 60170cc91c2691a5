"""What the local inventories (inventory/local.py, local_vllm.py, local_slurm.py) read from the
environment, parsed once here: `NAME=N,NAME=N` lists that move the local stack's ports or set how
many workers a role runs, for every command that reads the inventory (deploy, status, check, a canary).

    KNOBKEEPER_LOCAL_PORTS=prefill=31000,bootstrap:9998     ':' works for '='; any subset
    KNOBKEEPER_LOCAL_WORKERS=decode=2

An inventory is plain Python that pyinfra runs; it calls `numbers` and spreads the result into its
host data. A bad item raises ValueError naming the variable, the item and the names accepted (pyinfra
and knobkeeper's own inventory reader turn it into one line naming the inventory).
"""

from __future__ import annotations

import os
from typing import Mapping


def numbers(variable: str, keys: Mapping[str, str], what: str) -> dict[str, int]:
    """NAME=N,NAME=N (':' for '=') of environment `variable` to {keys[NAME]: N}; `what` names N in
    the error ("PORT", "COUNT")."""
    out = {}
    for item in filter(None, (part.strip() for part in os.environ.get(variable, "").split(","))):
        name, sep, value = item.replace(":", "=").partition("=")
        if not sep or name not in keys or not value.isdigit():
            raise ValueError(f"{variable}: {item!r}: expected NAME={what} with NAME one of {', '.join(keys)}")
        out[keys[name]] = int(value)
    return out
