"""The cluster ``ddpo local-cluster --keep`` keeps running: its address and
user token in a file only its owner can read, so that ``ddpo`` on the same
host uses it without DDPO_SERVER or DDPO_TOKEN being set.

The file is ``$DDPO_CLUSTER_FILE``, else ``$XDG_STATE_HOME/ddpo/cluster.json``
(``~/.local/state/ddpo/cluster.json``). It names the process that keeps the
cluster; once that process is gone the file is ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ddpo import local_tokens


def path() -> Path:
    if "DDPO_CLUSTER_FILE" in os.environ:
        return Path(os.environ["DDPO_CLUSTER_FILE"])
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "ddpo" / "cluster.json"


@dataclass(frozen=True)
class KeptCluster:
    server: str
    token: str | None
    pid: int


def write(cluster: KeptCluster) -> Path:
    where = path()
    note = {"server": cluster.server, "token": cluster.token, "pid": cluster.pid}
    local_tokens.write_private(where, json.dumps(note))
    return where


def remove(pid: int) -> None:
    """Remove the file if it is this process's cluster."""
    found = read()
    if found is not None and found.pid == pid:
        path().unlink(missing_ok=True)


def read() -> KeptCluster | None:
    """The kept cluster, if its keeper still runs."""
    try:
        data = json.loads(path().read_text())
        found = KeptCluster(
            server=str(data["server"]), token=data.get("token"), pid=int(data["pid"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if local_tokens.process_alive(found.pid) else None
