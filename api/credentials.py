"""Node credentials (made at registration) and people's API keys (made by
an admin): kept by the server only as digests, looked up in memory by the
auth layer. Pure: no HTTP, no database."""

from __future__ import annotations

import hashlib
import secrets
import threading
from dataclasses import dataclass

from ddpo.schemas.people import Role


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_node_credential() -> tuple[str, str]:
    """A fresh node credential and the digest the server keeps of it."""
    credential = f"ddpo-node-{secrets.token_urlsafe(32)}"
    return credential, digest(credential)


class NodeCredentials:
    """Every node's credential digest, in memory: the middleware looks
    callers up here without waiting for the database (which holds the same
    digests and fills this at startup).

    Looked up by digest, as a dict key: the credentials are 256 random bits,
    so what a lookup's timing could tell about a digest helps no one find a
    credential.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._node_by_digest: dict[str, int] = {}

    def load(self, pairs: list[tuple[int, str]]) -> None:
        with self._lock:
            self._node_by_digest = {hexdigest: node_id for node_id, hexdigest in pairs}

    def reload(self, node_ids: list[int], pairs: list[tuple[int, str]]) -> None:
        """These nodes' credentials are now ``pairs`` (a node not in them has none)."""
        with self._lock:
            for node_id in node_ids:
                self._forget(node_id)
            for node_id, hexdigest in pairs:
                self._node_by_digest[hexdigest] = node_id

    def bind(self, node_id: int, hexdigest: str) -> None:
        """The node's credential is now this one (any older one stops working)."""
        with self._lock:
            self._forget(node_id)
            self._node_by_digest[hexdigest] = node_id

    def revoke(self, node_id: int) -> None:
        with self._lock:
            self._forget(node_id)

    def _forget(self, node_id: int) -> None:
        for hexdigest in [d for d, n in self._node_by_digest.items() if n == node_id]:
            del self._node_by_digest[hexdigest]

    def node_of(self, hexdigest: str) -> int | None:
        with self._lock:
            return self._node_by_digest.get(hexdigest)


def new_api_key() -> tuple[str, str]:
    """A fresh person's key and the digest the server keeps of it."""
    key = f"ddpo-key-{secrets.token_urlsafe(32)}"
    return key, digest(key)


@dataclass(frozen=True)
class KeyHolder:
    """Whom a key belongs to: its id, its name and the role it carries."""

    key_id: int
    name: str
    role: Role


class ApiKeys:
    """Every live key's digest, in memory, as :class:`NodeCredentials` keeps
    the nodes' (the database holds the same; a revoked key is not here).
    256 random bits each: looked up by digest, as a dict key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_digest: dict[str, KeyHolder] = {}

    def load(self, pairs: list[tuple[str, KeyHolder]]) -> None:
        with self._lock:
            self._by_digest = dict(pairs)

    def bind(self, hexdigest: str, holder: KeyHolder) -> None:
        with self._lock:
            self._by_digest[hexdigest] = holder

    def revoke(self, key_id: int) -> None:
        with self._lock:
            for hexdigest in [d for d, h in self._by_digest.items() if h.key_id == key_id]:
                del self._by_digest[hexdigest]

    def holder_of(self, hexdigest: str) -> KeyHolder | None:
        with self._lock:
            return self._by_digest.get(hexdigest)
