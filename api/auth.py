"""Who may call what. Bearer tokens, one per role, configured on the server
(``DDPO_ADMIN_TOKEN``, ``DDPO_USER_TOKEN``, ``DDPO_READ_TOKEN``,
``DDPO_JOIN_TOKEN``), kept only as SHA-256 digests and compared in
constant time.

Worker daemons hold two secrets. The join token lets a machine register a
new node, nothing else. Registering gives it a credential of its own, bound
to that node (the server keeps its digest in the node's row): with it the
daemon polls, heartbeats and reports for its own node and its own parts
only, and an admin can revoke it without touching any other node.

Every route has a rule in :data:`RULES`; the auth-matrix test builds its
table from the app's own route list, so a new route without a rule fails it.
``AuthMiddleware`` is the outermost layer: it runs before the read cache
answers anything, and matches the rules' templates itself (FastAPI resolves
routes only further in). A path no rule matches is answered 404 to everyone,
so a route added without a rule is unreachable, never open.
"""

from __future__ import annotations

import enum
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException
from pydantic import SecretStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.credentials import NodeCredentials, digest
from api.raw_answers import send_problem


class Role(str, enum.Enum):
    ADMIN = "admin"
    USER = "user"  # people and scripts: submit, cancel, read
    READER = "reader"  # dashboards: read only
    JOIN = "join"  # a machine joining as a new node: registration only
    NODE = "node"  # one node's own credential: the node protocol, for that node


@dataclass(frozen=True)
class Caller:
    """Who sent a request: a role, and for a node credential, which node."""

    role: Role
    node_id: int | None = None


PUBLIC: frozenset[Role] = frozenset()  # no token needed
READ = frozenset({Role.ADMIN, Role.USER, Role.READER})
WRITE = frozenset({Role.ADMIN, Role.USER})
NODE = frozenset({Role.NODE})
ADMIN = frozenset({Role.ADMIN})

# (method, route template) -> the roles allowed; PUBLIC: anyone. HEAD is
# GET's. The dashboard's pages and the API reference carry no data.
RULES: dict[tuple[str, str], frozenset[Role]] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/"): PUBLIC,
    ("GET", "/ui"): PUBLIC,
    ("GET", "/ui/{page:path}"): PUBLIC,
    ("GET", "/ui/static/{name}"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("GET", "/metrics"): READ,
    ("POST", "/jobs"): WRITE,
    ("GET", "/jobs"): READ,
    ("GET", "/jobs/{job_id}"): READ,
    ("POST", "/jobs/{job_id}/cancel"): WRITE,
    ("GET", "/jobs/{job_id}/metrics"): READ,
    ("GET", "/jobs/{job_id}/logs"): READ,
    # Workers fetch the checkpoint a retry resumes from (of their own jobs).
    ("GET", "/jobs/{job_id}/model"): READ | NODE,
    ("POST", "/studies"): WRITE,
    ("GET", "/studies"): READ,
    ("GET", "/studies/{study_id}"): READ,
    ("POST", "/studies/{study_id}/cancel"): WRITE,
    ("GET", "/nodes"): READ,
    # A new node joins; a known one registers again with its own credential.
    ("POST", "/nodes/register"): NODE | {Role.JOIN},
    ("POST", "/nodes/{node_id}/revoke"): ADMIN,
    ("POST", "/nodes/{node_id}/poll"): NODE,
    ("POST", "/nodes/{node_id}/heartbeat"): NODE,
    ("POST", "/parts/{part_id}/started"): NODE,
    ("POST", "/parts/{part_id}/rendezvous"): NODE,
    ("POST", "/parts/{part_id}/progress"): NODE,
    ("POST", "/parts/{part_id}/logs"): NODE,
    ("POST", "/parts/{part_id}/finish"): NODE,
    ("PUT", "/parts/{part_id}/checkpoint"): NODE,
}


class TokenBook:
    """The configured role tokens' digests, and the nodes' credentials."""

    def __init__(
        self, tokens: dict[Role, SecretStr | None], nodes: NodeCredentials | None = None
    ) -> None:
        self._digests = [
            (role, bytes.fromhex(digest(token.get_secret_value())))
            for role, token in tokens.items()
            if token is not None and token.get_secret_value()
        ]
        self.nodes = nodes or NodeCredentials()

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
        presented_bytes = bytes.fromhex(presented)
        found = None
        for role, role_digest in self._digests:
            if secrets.compare_digest(presented_bytes, role_digest):
                found = Caller(role)
        if found is None and (node_id := self.nodes.node_of(presented)) is not None:
            found = Caller(Role.NODE, node_id)
        return found


def rule_for(method: str, template: str) -> frozenset[Role] | None:
    return RULES.get(("GET" if method == "HEAD" else method, template))


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    regex = "".join(
        (".*" if part.endswith(":path}") else "[^/]+") if part.startswith("{") else re.escape(part)
        for part in parts
    )
    return re.compile(f"^{regex}$")


# Literal paths before templated ones ("/nodes/register" is not a node id).
_COMPILED = sorted(
    ((method, _pattern(template), roles) for (method, template), roles in RULES.items()),
    key=lambda rule: rule[1].pattern.count("[^/]+") + 10 * rule[1].pattern.count(".*"),
)


def _allowed(method: str, path: str) -> frozenset[Role] | int:
    """The roles allowed, or the status for a request no rule covers."""
    method = "GET" if method == "HEAD" else method
    path_known = False
    for rule_method, pattern, roles in _COMPILED:
        if pattern.match(path):
            if rule_method == method:
                return roles
            path_known = True
    return 405 if path_known else 404


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
        allowed = _allowed(scope["method"], scope["path"])
        if isinstance(allowed, int):
            await _refuse(send, allowed, "not found" if allowed == 404 else "method not allowed")
            return
        if allowed is PUBLIC:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        caller = self.book.caller_of(authorization)
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
