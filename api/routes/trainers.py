"""What the cluster can run: the trainers and scripts its live nodes offer."""

from __future__ import annotations

from fastapi import APIRouter

from api import route_table
from api.core import offers
from api.deps import DatabaseDep
from api.routes import endpoint
from ddpo.schemas.public import TrainersPublic

router = APIRouter(tags=["trainers"])


@endpoint(router, route_table.LIST_TRAINERS, response_model=TrainersPublic)
def list_trainers(db: DatabaseDep) -> TrainersPublic:
    """Each trainer's versions with their parameter schemas, each script's
    contents, and the live nodes that have them."""
    with db.read() as session:
        return offers.offered(session)
