from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import DatabaseDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(db: DatabaseDep) -> dict[str, str]:
    """Answers once the database does."""
    with db.read() as session:
        session.exec(text("SELECT 1"))  # type: ignore[call-overload]
    return {"status": "ok"}
