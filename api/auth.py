"""Who may call what. Bearer tokens, one per role, configured on the server
(``DDPO_ADMIN_TOKEN``, ``DDPO_USER_TOKEN``, ``DDPO_READ_TOKEN``,
``DDPO_WORKER_TOKEN``), kept only as SHA-256 digests and compared in
constant time.

Every route has a rule in :data:`RULES`; the auth-matrix test builds its
table from the app's own route list, so a new route without a rule fails it.
``AuthMiddleware`` is the outermost layer: it runs before the read cache
answers anything, and matches the rules' templates itself (FastAPI resolves
routes only further in). A path no rule matches is answered 404 to everyone,
so a route added without a rule is unreachable, never open.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import secrets

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send


class Role(str, enum.Enum):
    ADMIN = "admin"
    USER = "user"  # people and scripts: submit, cancel, read
    READER = "reader"  # dashboards: read only
    WORKER = "worker"  # worker daemons: the node protocol


PUBLIC: frozenset[Role] = frozenset()  # no token needed
READ = frozenset({Role.ADMIN, Role.USER, Role.READER})
WRITE = frozenset({Role.ADMIN, Role.USER})
NODE = frozenset({Role.WORKER})

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
    # Workers fetch the checkpoint a retry resumes from.
    ("GET", "/jobs/{job_id}/model"): READ | NODE,
    ("POST", "/studies"): WRITE,
    ("GET", "/studies"): READ,
    ("GET", "/studies/{study_id}"): READ,
    ("POST", "/studies/{study_id}/cancel"): WRITE,
    ("GET", "/nodes"): READ,
    ("POST", "/nodes/register"): NODE,
    ("POST", "/nodes/{node_id}/poll"): NODE,
    ("POST", "/parts/{part_id}/started"): NODE,
    ("POST", "/parts/{part_id}/rendezvous"): NODE,
    ("POST", "/parts/{part_id}/progress"): NODE,
    ("POST", "/parts/{part_id}/logs"): NODE,
    ("POST", "/parts/{part_id}/finish"): NODE,
    ("PUT", "/parts/{part_id}/checkpoint"): NODE,
}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenBook:
    """The configured tokens' digests, by role."""

    def __init__(self, tokens: dict[Role, SecretStr | None]) -> None:
        self._digests = [
            (role, _digest(token.get_secret_value()))
            for role, token in tokens.items()
            if token is not None and token.get_secret_value()
        ]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def role_of(self, authorization: str | None) -> Role | None:
        """The role a ``Bearer`` header's token has, if any. Every digest is
        compared, so the time taken says nothing about which one matched."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        presented = _digest(token.strip())
        found = None
        for role, digest in self._digests:
            if secrets.compare_digest(presented, digest):
                found = role
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
    def __init__(self, app: ASGIApp, book: TokenBook) -> None:
        self.app = app
        self.book = book

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
        role = self.book.role_of(authorization)
        if role is None:
            await _refuse(send, 401, "a valid bearer token is needed (Authorization: Bearer ...)")
        elif role not in allowed:
            await _refuse(send, 403, f"the {role.value} role may not do this")
        else:
            await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="ddpo"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
