from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api import route_table
from api.deps import DatabaseDep
from api.routes import endpoint

router = APIRouter(tags=["health"])


@endpoint(router, route_table.HEALTH)
def healthz(db: DatabaseDep) -> dict[str, str]:
    """Answers once the database does."""
    with db.read() as session:
        session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    return {"status": "ok"}
