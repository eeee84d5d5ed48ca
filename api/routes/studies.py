"""Scaling studies: the same training over several topologies, one after
another, and the table that compares them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api import route_table, views
from api.core import jobs as jobs_core
from api.deps import ActorDep, CoreDep, DatabaseDep, SettingsDep
from api.routes import endpoint
from ddpo.schemas import DB_INT_MAX, StudiesPublic, StudyCreate, StudyPublic, documented

router = APIRouter(prefix="/studies", tags=["studies"], responses=documented(400, 403, 404, 409))

StudyId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]


@endpoint(
    router,
    route_table.SUBMIT_STUDY,
    status_code=201,
    response_model=StudyPublic,
    responses=documented(429),
)
def submit_study(
    create: StudyCreate, core: CoreDep, db: DatabaseDep, actor: ActorDep
) -> StudyPublic:
    """Queues one job per row (default: 1, 2, 4, 8 processes with batch 128,
    64, 32, 16); each starts when the one before has ended. The study and
    its jobs are the caller's."""
    study_id = jobs_core.submit_study(core, create, actor)
    return views.read_study(db=db, study_id=study_id)


@endpoint(router, route_table.LIST_STUDIES, response_model=StudiesPublic)
def list_studies(
    db: DatabaseDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=DB_INT_MAX)] = 50,
    offset: Annotated[int, Query(ge=0, le=DB_INT_MAX)] = 0,
) -> StudiesPublic:
    return views.read_studies(db=db, limit=min(limit, settings.max_page_size), offset=offset)


@endpoint(router, route_table.GET_STUDY, response_model=StudyPublic)
def get_study(study_id: StudyId, db: DatabaseDep) -> StudyPublic:
    """The table: per row its job, wall and training time, samples/s,
    speedup and efficiency against the first row, loss and test accuracy."""
    return views.read_study(db=db, study_id=study_id)


@endpoint(router, route_table.CANCEL_STUDY, response_model=StudyPublic)
def cancel_study(study_id: StudyId, core: CoreDep, db: DatabaseDep, actor: ActorDep) -> StudyPublic:
    """Cancel every job of it not yet ended. Its owner or an admin only."""
    jobs_core.cancel_study(core, study_id, actor)
    return views.read_study(db=db, study_id=study_id)
