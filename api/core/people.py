"""Who acts, what they may do to whose jobs, and the record of it: the
audit log's entries (written in the action's own transaction) and the
keys an admin hands out."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from api.core.context import Core
from api.core.errors import Conflict, Forbidden, NotFound
from api.credentials import KeyHolder, new_api_key
from db import queries
from db.models import ApiKey, AuditRow, utcnow
from ddpo.schemas.people import AuditAction, KeyCreate, Role

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Actor:
    """Who asks for an action: a key's name or token:<role> and its role
    (both None on a server that checks no tokens), and from which address."""

    name: str | None
    role: Role | None
    address: str | None = None

    @property
    def is_admin(self) -> bool:
        """Admins, and everyone on a server that checks no tokens."""
        return self.role is None or self.role is Role.ADMIN

    def may_steer(self, owner: str | None) -> bool:
        """Whether this actor may cancel or re-prioritise what ``owner``
        submitted: its owner, an admin, or anyone for what has no owner
        (submitted before owners were recorded, or with auth off)."""
        return self.is_admin or owner is None or owner == self.name


# Acting outside any request (a test, a script on the server's host): no
# name and no role, so allowed everything, and recorded as no one.
NOBODY = Actor(name=None, role=None)


def check_may_steer(actor: Actor, owner: str | None, what: str, verb: str) -> None:
    """Forbidden unless ``actor`` may steer what ``owner`` submitted."""
    if not actor.may_steer(owner):
        raise Forbidden(f"{what} is {owner}'s: only its owner or an admin may {verb} it")


def record(session: Session, actor: Actor, action: AuditAction, target: str, **detail: Any) -> None:
    """An audit entry for ``action``, committed with it or not at all."""
    queries.insert_audit(
        session=session,
        row=AuditRow(
            at=utcnow(),
            actor=actor.name,
            role=actor.role,
            address=actor.address,
            action=action,
            target=target,
            detail=detail,
        ),
    )


def create_key(core: Core, create: KeyCreate, actor: Actor) -> tuple[ApiKey, str]:
    """A new key and its secret (shown this once; only its digest is kept)."""
    secret, hexdigest = new_api_key()
    taken = f"name: a key named {create.name!r} exists (names are never reused)"
    # One writer at a time, on every server (db/engine.py): the name's check
    # and its insert cannot be overtaken.
    with core.db.write() as session:
        if queries.get_key_by_name(session=session, name=create.name) is not None:
            raise Conflict(taken)
        key = queries.insert_key(
            session=session,
            key=ApiKey(name=create.name, role=create.role, digest=hexdigest, created_by=actor.name),
        )
        assert key.id is not None
        record(
            session,
            actor,
            AuditAction.KEY_CREATE,
            f"key {key.id}",
            name=key.name,
            role=key.role.value,
        )
        session.expunge(key)
    core.keys.bind(hexdigest, holder_of(key))
    log.info("key %d (%s, %s) created by %s", key.id, key.name, key.role.value, actor.name)
    return key, secret


def revoke_key(core: Core, key_id: int, actor: Actor) -> ApiKey:
    """Refuse the key from now on: on this server from the next request, on
    the others once they hear the note (api/main.py, _heard)."""
    with core.db.write() as session:
        key = queries.get_key(session=session, key_id=key_id, for_update=True)
        if key is None:
            raise NotFound(f"key {key_id} not found")
        if key.revoked_at is not None:
            raise Conflict(f"key {key_id} ({key.name}) is already revoked")
        key.revoked_at, key.revoked_by = utcnow(), actor.name
        record(session, actor, AuditAction.KEY_REVOKE, f"key {key_id}", name=key.name)
        session.flush()
        session.expunge(key)
    core.keys.revoke(key_id)
    log.info("key %d (%s) revoked by %s", key_id, key.name, actor.name)
    return key


def holder_of(key: ApiKey) -> KeyHolder:
    """What the auth layer keeps of a stored key."""
    assert key.id is not None
    return KeyHolder(key.id, key.name, key.role)


def load_keys(core: Core) -> None:
    """Every live key into memory (at startup, and when another server
    changed some)."""
    with core.db.read() as session:
        keys = queries.live_keys(session=session)
    core.keys.load([(key.digest, holder_of(key)) for key in keys])
