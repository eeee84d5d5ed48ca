"""People and what they did: the roles a token or key carries, the API keys
an admin hands out (one per person or script), and the audit log's entries."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ddpo.schemas.strict import Strict


class Role(str, enum.Enum):
    ADMIN = "admin"
    USER = "user"  # people and scripts: submit, cancel, read
    READER = "reader"  # dashboards: read only
    JOIN = "join"  # a machine joining as a new node: registration only
    NODE = "node"  # one node's own credential: the node protocol, for that node


# The roles a person's key may carry: nodes get their own credentials.
KEY_ROLES = (Role.ADMIN, Role.USER, Role.READER)
# A key's name: who it is for (a person, a team's script). Unique for good,
# revoked keys included, so the audit log's names never become ambiguous.
KEY_NAME_PATTERN = r"^[a-z0-9][a-z0-9._@-]{0,63}$"
# The environment's role tokens act under these names ("token:" cannot
# start a key's name).
TOKEN_ACTOR_PREFIX = "token:"


def token_actor(role: Role) -> str:
    return f"{TOKEN_ACTOR_PREFIX}{role.value}"


class KeyCreate(Strict):
    name: str = Field(
        pattern=KEY_NAME_PATTERN,
        description="Who the key is for (lower case, digits, . _ @ -); unique, for good",
    )
    role: Role = Field(description="admin, user or reader")

    @field_validator("role")
    @classmethod
    def _a_persons_role(cls, role: Role) -> Role:
        if role not in KEY_ROLES:
            raise ValueError(
                f"a key is admin, user or reader; {role.value} is for machines "
                "(the join token, a node's own credential)"
            )
        return role


class KeyPublic(BaseModel):
    id: int
    name: str
    role: Role
    created_at: datetime
    created_by: str | None = Field(description="The admin (key or token) that created it")
    revoked_at: datetime | None = None
    revoked_by: str | None = None


class KeyCreated(KeyPublic):
    key: str = Field(description="The secret, shown this once: the server keeps only its digest")


class KeysPublic(BaseModel):
    data: list[KeyPublic]


class AuditAction(str, enum.Enum):
    JOB_SUBMIT = "job.submit"
    JOB_CANCEL = "job.cancel"
    JOB_PRIORITY = "job.priority"
    JOB_PREEMPT = "job.preempt"  # by the scheduler, for a job of a higher priority
    STUDY_SUBMIT = "study.submit"
    STUDY_CANCEL = "study.cancel"
    SWEEP_SUBMIT = "sweep.submit"
    SWEEP_CANCEL = "sweep.cancel"
    SWEEP_PRUNE = "sweep.prune"  # by the sweep's early stopper: a trial stops at a step
    NODE_REVOKE = "node.revoke"
    NODE_DRAIN = "node.drain"
    NODE_UNDRAIN = "node.undrain"
    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"


class AuditEntryPublic(BaseModel):
    id: int
    at: datetime
    actor: str | None = Field(
        description="The key's name, token:<role> for an environment token, null with auth off"
    )
    role: Role | None
    address: str | None = Field(description="The client's address, as the server saw it")
    action: AuditAction
    target: str = Field(description='What it acted on: "job 12", "node 3", "key 4"')
    detail: dict[str, Any] = Field(default_factory=dict)


class AuditPublic(BaseModel):
    data: list[AuditEntryPublic] = Field(description="Newest first")
    next_before: int | None = Field(
        None, description="Pass as before= for the next (older) page; null at the oldest"
    )


class CallerPublic(BaseModel):
    name: str | None = Field(description="The key's name, or token:<role>; null with auth off")
    role: Role | None
