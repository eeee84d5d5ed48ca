"""Who may call what. Bearer tokens, one per role, configured on the server
(``DDPO_ADMIN_TOKEN``, ``DDPO_USER_TOKEN``, ``DDPO_READ_TOKEN``,
``DDPO_JOIN_TOKEN``), kept only as SHA-256 digests and compared in
constant time.

People hold keys of their own (``POST /keys``, admins only): a name and
a role each, kept as digests too, refused from the moment they are revoked.
A request records who sent it (:attr:`Caller.name`): the owner of what it
submits and the actor in the audit log.

Worker daemons hold two secrets. The join token lets a machine register a
new node, nothing else. Registering gives it a credential of its own, bound
to that node (the server keeps its digest in the node's row): with it the
daemon polls, heartbeats and reports for its own node and its own parts
only, and an admin can revoke it without touching any other node.

Every route's roles are in its row of api/route_table.py, the table the
routers' decorators read too; the auth-matrix test builds its table from
the app's own route list. ``AuthMiddleware`` is the outermost layer: it
runs before the read cache answers anything, and matches the table's
templates itself (FastAPI resolves routes only further in). A path no
route matches is answered 404 to everyone, so a route can never be open
by being forgotten.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException
from pydantic import SecretStr
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import route_table
from api.credentials import ApiKeys, KeyHolder, NodeCredentials, digest
from api.raw_answers import send_problem
from api.route_table import PUBLIC, Role
from ddpo.schemas.people import token_actor


@dataclass(frozen=True)
class Caller:
    """Who sent a request: a role; for a node credential, which node; for a
    person's key, whose."""

    role: Role
    node_id: int | None = None
    key: KeyHolder | None = None

    @property
    def name(self) -> str:
        """The key's name, or token:<role> for a token from the environment."""
        return self.key.name if self.key is not None else token_actor(self.role)


def rule_for(method: str, template: str) -> frozenset[Role] | None:
    """The roles a route allows (api/route_table.py), None if it has none."""
    route = route_table.find(method, template)
    return route.roles if route else None


class TokenBook:
    """The configured role tokens' digests, and the nodes' credentials."""

    def __init__(
        self,
        tokens: dict[Role, SecretStr | None],
        nodes: NodeCredentials | None = None,
        keys: ApiKeys | None = None,
        look_up: Callable[[str], Caller | None] | None = None,
    ) -> None:
        """``look_up`` finds the node or key a digest belongs to in the
        database, for one this server has not heard of yet: with several
        servers, a node registered (a key made) through another may reach
        this one before the note of it does."""
        self._digests = [
            (role, bytes.fromhex(digest(token.get_secret_value())))
            for role, token in tokens.items()
            if token is not None and token.get_secret_value()
        ]
        self.nodes = nodes or NodeCredentials()
        self.keys = keys or ApiKeys()
        self.look_up = look_up

    @property
    def enabled(self) -> bool:
        """Whether tokens are checked at all: only with role tokens configured
        (node credentials are handed out either way)."""
        return bool(self._digests)

    def caller_of(self, authorization: str | None) -> Caller | None:
        """Who a ``Bearer`` header's token belongs to, if anyone. Every role
        digest is compared, so the time taken says nothing about which one
        matched."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        presented = digest(token.strip())
        found = self._role_of(presented)
        if found is None and (node_id := self.nodes.node_of(presented)) is not None:
            found = Caller(Role.NODE, node_id)
        if found is None and (holder := self.keys.holder_of(presented)) is not None:
            found = Caller(holder.role, key=holder)
        return found

    def caller_in_database(self, authorization: str) -> Caller | None:
        """A node credential or key :meth:`caller_of` did not know, looked
        up in the database (blocking: call it from a thread)."""
        token = authorization.partition(" ")[2].strip()
        if self.look_up is None or not token:
            return None
        # Not kept in memory: the note of the node or key (api/main.py,
        # _heard) puts it there, and a revocation's note takes it out; one
        # kept from here could outlive a revocation heard in between.
        return self.look_up(digest(token))

    def _role_of(self, presented: str) -> Caller | None:
        presented_bytes = bytes.fromhex(presented)
        found = None
        for role, role_digest in self._digests:
            if secrets.compare_digest(presented_bytes, role_digest):
                found = Caller(role)
        return found


class AuthMiddleware:
    """Checks the caller against the route's rule. A node's request is also
    a sign of life (``saw``), noted when it arrives and again when its answer
    starts: a checkpoint streaming in over a slow link for a minute is a
    node at work, not a silent one."""

    def __init__(
        self, app: ASGIApp, book: TokenBook, saw: Callable[[int], None] = lambda _: None
    ) -> None:
        self.app = app
        self.book = book
        self.saw = saw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.book.enabled:
            await self.app(scope, receive, send)
            return
        route = route_table.match(scope["method"], scope["path"])
        if isinstance(route, int):
            await _refuse(send, route, "not found" if route == 404 else "method not allowed")
            return
        allowed = route.roles
        if allowed is PUBLIC:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        caller = self.book.caller_of(authorization)
        if caller is None and self.book.look_up is not None and authorization:
            caller = await run_in_threadpool(self.book.caller_in_database, authorization)
        if caller is None:
            await _refuse(send, 401, "a valid bearer token is needed (Authorization: Bearer ...)")
        elif caller.role not in allowed:
            await _refuse(send, 403, f"the {caller.role.value} role may not do this")
        else:
            # Routes bound to a node check the node they act for against it.
            scope.setdefault("state", {})[CALLER] = caller
            await self.app(
                scope,
                receive,
                send if caller.node_id is None else self._noting(caller.node_id, send),
            )

    def _noting(self, node_id: int, send: Send) -> Send:
        """``send``, noting the node alive now and when its answer starts."""
        self.saw(node_id)

        async def send_noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.saw(node_id)
            await send(message)

        return send_noting


# The request-state key the authenticated caller is kept under.
CALLER = "ddpo_caller"


def caller_of_request(state: dict[str, object]) -> Caller | None:
    """Who sent the request; None when the server checks no tokens."""
    caller = state.get(CALLER)
    return caller if isinstance(caller, Caller) else None


def caller_node(state: dict[str, object]) -> int | None:
    """The node a request's credential belongs to; None for any other caller,
    and when the server checks no tokens."""
    caller = state.get(CALLER)
    return caller.node_id if isinstance(caller, Caller) else None


def acting_for(own: int | None, node_id: int) -> None:
    """Refuse a node credential (``own``) acting for another node: 403."""
    if own is not None and own != node_id:
        raise HTTPException(
            403, f"node_id: this credential is node {own}'s; it cannot act for node {node_id}"
        )


async def _refuse(send: Send, status: int, detail: str) -> None:
    challenge = [(b"www-authenticate", b'Bearer realm="ddpo"')] if status == 401 else []
    await send_problem(send, status, detail, challenge)
