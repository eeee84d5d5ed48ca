"""Sweeps: one job spec over many hyperparameters, each trial an ordinary
job on the same queue, the poor ones stopped early."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api import route_table, sweep_views
from api.core import sweeps as sweeps_core
from api.deps import ActorDep, CoreDep, DatabaseDep, SettingsDep
from api.routes import endpoint
from ddpo.schemas import DB_INT_MAX, documented
from ddpo.schemas.sweep import SweepCreate, SweepPublic, SweepsPublic

router = APIRouter(prefix="/sweeps", tags=["sweeps"], responses=documented(400, 403, 404, 409))

SweepId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]


@endpoint(
    router,
    route_table.SUBMIT_SWEEP,
    status_code=201,
    response_model=SweepPublic,
    responses=documented(429),
)
def submit_sweep(
    create: SweepCreate, core: CoreDep, db: DatabaseDep, actor: ActorDep
) -> SweepPublic:
    """Queues its first trials (max_concurrent of them); each trial that
    ends, or is stopped early by the pruner, makes room for the next, up to
    max_trials. Its values are checked first: a value outside the spec's
    bounds, or a params.NAME its trainer's schema refuses, is a 422 naming
    space.NAME. The sweep and its trials are the caller's."""
    sweep_id = sweeps_core.submit_sweep(core, create, actor)
    return sweep_views.read_sweep(db=db, sweep_id=sweep_id)


@endpoint(router, route_table.LIST_SWEEPS, response_model=SweepsPublic)
def list_sweeps(
    db: DatabaseDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=DB_INT_MAX)] = 20,
    offset: Annotated[int, Query(ge=0, le=DB_INT_MAX)] = 0,
) -> SweepsPublic:
    """Newest first."""
    return sweep_views.read_sweeps(db=db, limit=min(limit, settings.max_page_size), offset=offset)


@endpoint(router, route_table.GET_SWEEP, response_model=SweepPublic)
def get_sweep(sweep_id: SweepId, db: DatabaseDep) -> SweepPublic:
    """Every trial with its values, state and objective (its reports by
    step), the best succeeded trial, counts per state, and the slot-time
    the trials took."""
    return sweep_views.read_sweep(db=db, sweep_id=sweep_id)


@endpoint(router, route_table.CANCEL_SWEEP, response_model=SweepPublic)
def cancel_sweep(sweep_id: SweepId, core: CoreDep, db: DatabaseDep, actor: ActorDep) -> SweepPublic:
    """No new trial starts; every trial not yet ended is cancelled. Its
    owner or an admin only."""
    sweeps_core.cancel_sweep(core, sweep_id, actor)
    return sweep_views.read_sweep(db=db, sweep_id=sweep_id)
