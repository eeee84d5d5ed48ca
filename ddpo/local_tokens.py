"""Tokens for a server started without any: made on its first start, kept
beside its database, and found by the CLI, the dashboard link and a worker
on the same host for the same user (as Jupyter's token is).

Two files, both mode 0600:

- the token file (``DDPO_TOKEN_FILE``; by default beside a SQLite database:
  ``ddpo.db`` -> ``ddpo-tokens.env``), lines a shell can ``source``:
  ``DDPO_ADMIN_TOKEN=...`` and ``DDPO_JOIN_TOKEN=...``. It outlives the
  server: the same tokens after a restart, so workers and scripts keep
  working.
- a runtime note per running server (``$XDG_RUNTIME_DIR/ddpo``, else
  ``~/.local/state/ddpo/servers``), ``server-<port>.json``: its URL, its
  process id and where its token file is. A client looking for the token of
  ``http://127.0.0.1:8000`` reads the note for port 8000, if that server
  still runs.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ADMIN = "DDPO_ADMIN_TOKEN"
JOIN = "DDPO_JOIN_TOKEN"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


@dataclass(frozen=True)
class LocalTokens:
    admin: str
    join: str


class TokenFileExposed(ValueError):
    """The token file is readable or writable by others than its owner."""


def load_or_make(path: Path) -> tuple[LocalTokens, bool]:
    """The tokens in ``path``, or new ones written there; True if made now.
    A file others may read or write is refused, as ssh refuses such a key:
    its tokens may be known, or replaced, by anyone on the host."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = 0
    if mode & 0o077:
        raise TokenFileExposed(
            f"{path} is mode {mode & 0o777:04o}: others on this host may read or change its "
            "tokens. If they may have, delete it (the server makes new ones; give workers the "
            f"new join token); else chmod 600 {path}"
        )
    found = read_token_file(path)
    if found is not None:
        return found, False
    tokens = LocalTokens(admin=secrets.token_urlsafe(32), join=secrets.token_urlsafe(32))
    write_private(path, f"{ADMIN}={tokens.admin}\n{JOIN}={tokens.join}\n")
    return tokens, True


def read_token_file(path: Path) -> LocalTokens | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    values = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    admin, join = values.get(ADMIN, "").strip(), values.get(JOIN, "").strip()
    return LocalTokens(admin=admin, join=join) if admin and join else None


def runtime_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "ddpo"
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "ddpo" / "servers"


def _note_path(port: int) -> Path:
    return runtime_dir() / f"server-{port}.json"


def announce(url: str, token_file: Path) -> Path:
    """Note that this process serves ``url`` with the tokens in ``token_file``."""
    port = urlsplit(url).port or 80
    note = {"url": url, "pid": os.getpid(), "token_file": str(token_file)}
    path = _note_path(port)
    write_private(path, json.dumps(note))
    return path


def withdraw(url: str) -> None:
    """Remove this process's note (a later server on the port writes its own)."""
    path = _note_path(urlsplit(url).port or 80)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def tokens_for(url: str) -> LocalTokens | None:
    """The made tokens of the server running on this host at ``url``, if
    its note and token file are readable by this user."""
    parts = urlsplit(url)
    if parts.hostname is None or not _is_this_host(parts.hostname):
        return None
    path = _note_path(parts.port or (443 if parts.scheme == "https" else 80))
    try:
        note = json.loads(path.read_text())
        pid, token_file = int(note["pid"]), Path(note["token_file"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not process_alive(pid):
        return None
    return read_token_file(token_file)


def _is_this_host(name: str) -> bool:
    if name.lower() in LOOPBACK_NAMES or name.startswith("127."):
        return True
    return name.lower() in {socket.gethostname().lower(), socket.getfqdn().lower()}


def process_alive(pid: int) -> bool:
    """Whether a process of that id runs (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner only, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(partial, path)
