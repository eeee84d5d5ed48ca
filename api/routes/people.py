"""People: the keys admins hand out, the audit log, and who a token is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api import route_table, views
from api.core import people as people_core
from api.deps import ActorDep, CoreDep, DatabaseDep, KeyId, SettingsDep
from api.routes import endpoint
from ddpo.schemas import DB_INT_MAX, documented
from ddpo.schemas.people import (
    AuditAction,
    AuditPublic,
    CallerPublic,
    KeyCreate,
    KeyCreated,
    KeyPublic,
    KeysPublic,
)

router = APIRouter(tags=["people"], responses=documented(400, 403, 404, 409))


@endpoint(router, route_table.CREATE_KEY, status_code=201, response_model=KeyCreated)
def create_key(create: KeyCreate, core: CoreDep, actor: ActorDep) -> KeyCreated:
    """A key for one person or script, with a name and a role. The secret
    (``key``) is in this answer only: the server keeps its digest."""
    key, secret = people_core.create_key(core, create, actor)
    return KeyCreated(**views.key_public(key).model_dump(), key=secret)


@endpoint(router, route_table.LIST_KEYS, response_model=KeysPublic)
def list_keys(db: DatabaseDep) -> KeysPublic:
    """Every key ever made, revoked ones included (never their secrets)."""
    return views.read_keys(db=db)


@endpoint(router, route_table.REVOKE_KEY, response_model=KeyPublic)
def revoke_key(key_id: KeyId, core: CoreDep, actor: ActorDep) -> KeyPublic:
    """Refuse the key from now on. Its name stays taken, and its jobs keep
    it as their owner."""
    return views.key_public(people_core.revoke_key(core, key_id, actor))


@endpoint(router, route_table.AUDIT, response_model=AuditPublic)
def read_audit(
    db: DatabaseDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=DB_INT_MAX)] = 100,
    before: Annotated[
        int | None, Query(ge=1, le=DB_INT_MAX, description="only entries older than this id")
    ] = None,
    actor: Annotated[str | None, Query(max_length=200, description="a key's name")] = None,
    action: AuditAction | None = None,
    target: Annotated[str | None, Query(max_length=200, description='e.g. "job 12"')] = None,
) -> AuditPublic:
    """Who did what, when and from where: submissions, cancels, priority
    changes, node revocations and key changes. Newest first."""
    return views.read_audit(
        db=db,
        limit=min(limit, settings.max_page_size),
        before=before,
        actor=actor,
        action=action,
        target=target,
    )


@endpoint(router, route_table.WHOAMI, response_model=CallerPublic)
def whoami(actor: ActorDep) -> CallerPublic:
    """The name and role the presented token acts under."""
    return CallerPublic(name=actor.name, role=actor.role)
