"""The FastAPI application: routers, error handlers, and the background
sweep that notices lost nodes."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, get_args

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from prometheus_client import Histogram
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp

from api import route_table
from api.auth import AuthMiddleware, Caller, TokenBook
from api.core import artifacts, runs
from api.core.clock import tick, write_sightings
from api.core.context import Core
from api.core.errors import DomainError
from api.core.people import holder_of, load_keys
from api.core.retention import prune
from api.deps import refuse_unknown_query
from api.head import HeadAsGet
from api.host_check import HostCheck, OriginCheck, allowed_hosts
from api.limits import BodyLimitMiddleware
from api.monitoring import LatencyMiddleware, fastapi_telemetry, make_registry
from api.node_lane import NodeLane
from api.notifier import Notifier
from api.quiet_nodes import QuietNodes
from api.read_cache import (
    TRIM_AFTER_BYTES,
    ReadCache,
    ReadCacheMiddleware,
    give_back_freed_memory,
)
from api.refusals import refusal, text
from api.route_table import Role
from api.routes import (
    dashboard,
    health,
    jobs,
    nodes,
    parts,
    people,
    prometheus,
    queue,
    reference,
    studies,
    sweeps,
    trainers,
)
from api.routes.off_loop import BodyDecoders
from api.settings import ServerSettings
from api.tracking import Ended, MLflow, Sink, TensorBoard, Tracking
from db import queries
from db.changes import EVERYONE, Change, Wake
from db.engine import Database
from db.models import ApiKey, Attempt, Job, Node, Part, utcnow
from ddpo.lifecycle import IllegalTransition, PartStatus
from ddpo.schemas.public import Problem

log = logging.getLogger(__name__)

# The garbage collector's passes (see the lifespan): young passes between
# two of the middle generation (Python's default: 10), and those between two
# full passes (Python's default: 10).
MIDDLE_PASS_EVERY = 100
FULL_PASS_EVERY = 100


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    db = Database(settings.database_url, wakes=_wakes_polls)
    notifier = Notifier()
    core = Core(db, settings)
    core.tracking = _tracking(core)
    instruments = make_registry(db)
    read_cache = ReadCache(db)
    db.after_commit(lambda rows: notifier.wake(_wakes_polls(rows)))
    db.after_commit(lambda rows: _settle_runs(core.tracking, rows))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db.prepare_schema()
        notifier.bind(asyncio.get_running_loop())
        # Listening before the credentials are read: a revocation through
        # another server after this is heard, one before it is read.
        db.listen(lambda change: _heard(core, notifier, change))
        with db.read() as session:
            core.credentials.load(queries.node_credentials(session=session))
        load_keys(core)
        if removed := artifacts.clear_incoming(settings):
            log.info("removed %d partial upload(s) left by an earlier run", removed)
        # What starting made (modules, the app, its routes and schemas) lives
        # as long as the server: out of the collector's full passes, which
        # otherwise walk all of it each time they stop the event loop.
        gc.collect()
        gc.freeze()
        # Held polls live seconds: what they hold is most of what a young
        # pass finds alive (65,000 objects at 1,000 nodes), moved on to the
        # middle generation and from there to the oldest. A pass of the
        # middle generation walks all of them: 60 ms, with the event loop
        # stopped, and with Python's default of one every 10 young passes,
        # every 2-3 s. That was the slow tail of idle polls and 8% of the
        # server's CPU. One every MIDDLE_PASS_EVERY young passes, and a full
        # pass every FULL_PASS_EVERY of those: 10,000 young passes apart, as
        # before this change. What dies in the older generations is freed by
        # reference counting when the poll ends (requests make no reference
        # loops: api/serving.py, tests/unit/test_notifier.py); the passes
        # find what little else there is. BENCHMARKS.md, "Idle polls and the
        # garbage collector".
        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], MIDDLE_PASS_EVERY, FULL_PASS_EVERY)
        sweeper = asyncio.create_task(_sweep_forever(core, instruments.tick, read_cache))
        log.info("serving with database %s", redacted(settings.database_url))
        try:
            yield
        finally:
            gc.set_threshold(*thresholds)
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await run_in_threadpool(app.state.body_decoders.close)
            await run_in_threadpool(core.tracking.close)
            db.dispose()

    app = _Orchestrator(
        # Operation ids are the handlers' names (submit_job, get_job): what
        # a generated client calls its functions (api/routes: each is unique).
        generate_unique_id_function=lambda route: route.name,
        title="ddpo",
        summary="A REST-controlled orchestrator for distributed PyTorch training",
        version="0.1.0",
        lifespan=lifespan,
        # Served from installed files (api/routes/reference.py), not a CDN.
        docs_url=None,
        redoc_url=None,
        telemetry=fastapi_telemetry(),
    )
    app.state.settings = settings
    app.state.db = db
    app.state.notifier = notifier
    app.state.quiet_nodes = QuietNodes(notifier)
    app.state.core = core
    app.state.read_cache = read_cache
    app.state.body_decoders = BodyDecoders(settings.body_decoders)
    app.state.tokens = TokenBook(
        settings.role_tokens,
        core.credentials,
        core.keys,
        # SQLite: this server is the only one, and knows every credential.
        look_up=None if db.is_sqlite else lambda hexdigest: _caller_in_database(core, hexdigest),
    )
    app.state.registry, app.state.latency = instruments.registry, instruments.latency
    app.add_middleware(LatencyMiddleware, latency=app.state.latency)
    routers = (
        jobs.router,
        queue.router,
        studies.router,
        sweeps.router,
        nodes.router,
        parts.router,
        trainers.router,
        people.router,
    )
    for router in routers:
        app.include_router(router, dependencies=[Depends(refuse_unknown_query)])
    for router in (health.router, prometheus.router, dashboard.router, reference.router):
        app.include_router(router)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(IllegalTransition, _refused)
    app.add_exception_handler(DomainError, _refused)
    return app


class _Orchestrator(FastAPI):
    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, with the bearer scheme on every route that
        needs a token (from the route table), so /docs can send one."""
        if self.openapi_schema is None:
            document = super().openapi()
            document.setdefault("components", {})["securitySchemes"] = {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A person's key, a role's token (README, Tokens and "
                    "roles), or a node's own credential",
                },
            }
            schemas = document["components"].setdefault("schemas", {})
            problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(problem.pop("$defs", {}))
            schemas["Problem"] = problem
            for path, operations in document.get("paths", {}).items():
                for method, operation in operations.items():
                    route = route_table.find(method.upper(), path)
                    if route is not None and route.roles:
                        operation["security"] = [{"bearer": []}]
                        roles = ", ".join(sorted(role.value for role in route.roles))
                        operation["description"] = (
                            f"{operation.get('description', '')}\n\nRoles: {roles}."
                        ).strip()
                    _document_refusals(operation, route)
        return self.openapi_schema or {}

    def build_middleware_stack(self) -> ASGIApp:
        # Cached answers go out in front of everything else, Starlette's own
        # error middleware included: 50 dashboards polling a job are 50
        # requests a second on a host that is training (BENCHMARKS.md).
        # Only the body cap, authentication and CORS come before them.
        settings: ServerSettings = self.state.settings
        cached = ReadCacheMiddleware(
            super().build_middleware_stack(), self.state.read_cache, self.state.latency
        )
        # Polls and heartbeats, most of a large cluster's requests, are
        # answered before routing too, once their caller and size are checked.
        lane = NodeLane(
            HeadAsGet(cached),
            self.state.core,
            self.state.notifier,
            self.state.quiet_nodes,
            self.state.latency,
        )
        capped = BodyLimitMiddleware(lane, _body_caps(settings))
        guarded: ASGIApp = AuthMiddleware(
            capped, self.state.tokens, saw=self.state.core.sightings.saw
        )
        guarded = OriginCheck(guarded, settings.cors_origins)
        hosts = allowed_hosts(settings.host, settings.allowed_hosts)
        if hosts is not None:
            guarded = HostCheck(guarded, hosts)
        if settings.cors_origins:
            # Outermost: a browser's preflight carries no token.
            guarded = CORSMiddleware(
                guarded,
                allow_origins=settings.cors_origins,
                allow_methods=["GET", "POST", "PUT", "PATCH"],
                allow_headers=["authorization", "content-type", "idempotency-key"],
            )
        return guarded


# What any route may answer besides its success, each with the Problem body:
# a generator then gives a typed error for each, never None for a 401.
_REFUSALS = {
    401: "No token, or one this server does not accept",
    403: "The token's role may not do this, or it is not the caller's to do",
    404: "No such resource",
    409: "Not possible in its current state",
    413: "The body is over the server's cap",
    422: "A field is wrong: each entry's msg starts with the field's dotted name",
    429: "Too many at once: try again after Retry-After seconds",
}


def _document_refusals(operation: dict[str, Any], route: route_table.Route | None) -> None:
    responses = operation.setdefault("responses", {})
    needs_token = route is None or bool(route.roles)
    for status, meaning in _REFUSALS.items():
        if status in (401, 403) and not needs_token:
            continue
        responses[str(status)] = {
            "description": responses.get(str(status), {}).get("description", meaning),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }


def _body_caps(settings: ServerSettings) -> Callable[[str, str], tuple[int, str] | None]:
    """Each route's body cap: checkpoint uploads have their own
    (DDPO_MAX_CHECKPOINT_MB); a node's batches and registration may be large;
    every other body (a submit, a poll) is small, so that twenty 16 MiB
    submits cannot take the server's memory while they are refused."""
    large = (settings.max_body_kb * 1024, "DDPO_MAX_BODY_KB")
    small = (min(settings.max_small_body_kb, settings.max_body_kb) * 1024, "DDPO_MAX_SMALL_BODY_KB")

    def cap(method: str, path: str) -> tuple[int, str] | None:
        route = route_table.match(method, path)
        if isinstance(route, int):
            return small  # no such route: FastAPI says so, with nothing to read
        if route.upload:
            return None
        return large if route.large_body else small

    return cap


# How late the sweep may wake before the server counts itself as stalled.
STALL_S = 0.5


def _tracking(core: Core) -> Tracking:
    """Where this server writes reports on (api/tracking.py): none unless configured."""
    settings = core.settings
    sinks: list[Sink] = []
    if settings.tensorboard_dir is not None:
        sinks.append(TensorBoard(settings.tensorboard_dir))
    if settings.mlflow_tracking_uri is not None:
        sinks.append(
            MLflow(
                settings.mlflow_tracking_uri,
                settings.mlflow_experiment,
                run_of=functools.partial(runs.run_of, core),
                existing_run=functools.partial(runs.existing_run, core),
                final_model=functools.partial(runs.final_model, core),
            )
        )
    return Tracking(sinks)


def _settle_runs(tracking: Tracking, rows: Sequence[object]) -> None:
    """A job that ended in a commit of this server: its runs settled (its
    result, its final model, its status), off this thread."""
    if not tracking.sinks:
        return  # every commit passes here: nothing to look at without sinks
    for row in rows:
        if isinstance(row, Job) and row.id is not None and row.status.is_terminal():
            tracking.ended(
                row.id, Ended(status=row.status, result=row.result, final_step=row.progress_step)
            )


def _wakes_polls(rows: Sequence[object]) -> Wake:
    """Which long-polls a write is news for (woken once it has committed,
    on every server): the node a part was assigned to, asked to stop on or
    ended on; the polls waiting for a rendezvous port, when an attempt
    changed (its port may be known); a node whose own row changed (lost,
    revoked: its next poll must read the database). A part that just
    started running is news to no poll: its node said so itself. Everything
    a poll answers changes only through these (api/core/nodes.py,
    _poll_answer), which is why a quiet node's answer can be remembered
    (api/quiet_nodes.py)."""
    nodes: set[int] = set()
    for row in rows:
        if isinstance(row, Part) and row.status is not PartStatus.RUNNING:
            nodes.add(row.node_id)
        elif isinstance(row, Node) and row.id is not None:
            nodes.add(row.id)
        elif isinstance(row, Attempt) and row.stop_reason is not None and row.finished_at is None:
            # Asked to stop at a step: news for its parts' nodes, which the
            # row does not name. Rare (a preemption, a drain): wake them all.
            return EVERYONE
    return Wake(nodes=frozenset(nodes), port_waiters=any(isinstance(row, Attempt) for row in rows))


def _caller_in_database(core: Core, hexdigest: str) -> Caller | None:
    """The node or live key this digest is of, read from the database."""
    with core.db.read() as session:
        node_id = queries.node_of_credential(session=session, hexdigest=hexdigest)
        if node_id is not None:
            return Caller(Role.NODE, node_id)
        key = queries.live_key_of(session=session, hexdigest=hexdigest)
        return None if key is None else Caller(key.role, key=holder_of(key))


def _heard(core: Core, notifier: Notifier, change: Change) -> None:
    """Another server on the database committed ``change``."""
    if change.everything or ApiKey.__tablename__ in change.tables:
        load_keys(core)
    if change.everything or change.nodes:
        with core.db.read() as session:
            if change.everything:
                core.credentials.load(queries.node_credentials(session=session))
            else:
                nodes = list(change.nodes)
                core.credentials.reload(
                    nodes, queries.node_credentials(session=session, node_ids=nodes)
                )
    notifier.wake(change.wake)


async def _sweep_forever(core: Core, duration: Histogram, cache: ReadCache) -> None:
    settings = core.settings
    loop = asyncio.get_running_loop()
    pruned_at = loop.time()
    while True:
        asked = loop.time()
        await asyncio.sleep(settings.sweep_interval_s)
        late_s = loop.time() - asked - settings.sweep_interval_s
        # A server that woke this late was starved of CPU itself: heartbeats
        # may be queued unread on its sockets, so silence proves nothing yet.
        judge_nodes = late_s < STALL_S
        if not judge_nodes:
            log.warning("the server ran %.1f s late; not judging node liveness this time", late_s)
        try:
            if cache.drop_expired() >= TRIM_AFTER_BYTES:
                await run_in_threadpool(give_back_freed_memory)
            await run_in_threadpool(write_sightings, core)
            # With several servers on one database, one sweeps at a time.
            if not await run_in_threadpool(core.db.sweeps, settings.sweep_interval_s):
                continue
            await run_in_threadpool(_timed_tick, core, judge_nodes, duration)
            if loop.time() - pruned_at >= settings.retention_interval_s:
                pruned_at = loop.time()
                await run_in_threadpool(prune, core, utcnow())
        except Exception:  # keep sweeping: a transient database error must not end it
            log.exception("sweep for lost nodes, deadlines, retries and old data failed")


def _timed_tick(core: Core, judge_nodes: bool, duration: Histogram) -> None:
    with duration.time():  # in the thread: not counting the wait for one
        tick(core, judge_nodes)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 whose messages start with the dotted name of the offending field."""
    assert isinstance(exc, RequestValidationError)
    detail = []
    content_type = request.headers.get("content-type", "")
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        msg = error.get("msg", "invalid")
        if error.get("type") == "json_invalid":
            # loc is ("body", <character offset>): say what it is.
            offset = loc[1] if len(loc) > 1 else ""
            where = int(offset) + 1 if offset.isdigit() else "?"  # counted from 1
            reason = (error.get("ctx") or {}).get("error", "")
            detail.append(_echoable(error, f"body: not valid JSON at character {where}: {reason}"))
            continue
        # Drop where it came from ("body", "query", "path"): the name is what helps.
        if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
            loc = loc[1:] or loc
        field = ".".join(loc) or "body"
        if error.get("type") == "extra_forbidden":
            msg += _did_you_mean(request, [str(part) for part in error.get("loc", ())])
        if loc == ["body"] and "json" not in content_type:
            msg += " (send the body as JSON, with content-type: application/json)"
        detail.append(_echoable(error, f"{field}: {msg}"))
    return JSONResponse(status_code=422, content={"detail": detail})


def _did_you_mean(request: Request, loc: list[str]) -> str:
    """For a field the body's model does not have: the known field nearest
    to it, if one is near (``channel_last``: did you mean channels_last?)."""
    route = request.scope.get("route")
    body = getattr(route, "body_field", None)
    if not loc or loc[0] != "body" or body is None:
        return ""
    model: Any = body.field_info.annotation
    for part in loc[1:-1]:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return ""
        model = _the_model_in(fields[part].annotation)
    fields = getattr(model, "model_fields", None)
    close = difflib.get_close_matches(loc[-1], list(fields or ()), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _the_model_in(annotation: Any) -> Any:
    """``Performance`` from ``Performance | None``, ``Annotated[...]``."""
    if isinstance(annotation, type):
        return annotation
    for arg in get_args(annotation):
        found = _the_model_in(arg)
        if getattr(found, "model_fields", None):
            return found
    return None


def _echoable(error: Any, msg: str) -> dict[str, Any]:
    """A validation error as it can always go back as JSON: its type, where,
    the message and the constraint, as text. The rejected input is not
    echoed: it may not be encodable (a number beyond a float, a lone
    surrogate), and the client has it anyway."""
    ctx = error.get("ctx")
    return {
        "type": text(error.get("type", "")),
        "loc": [part if isinstance(part, int) else text(part) for part in error.get("loc", ())],
        "msg": text(msg),
        **({"ctx": {text(k): text(v) for k, v in ctx.items()}} if ctx else {}),
    }


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    """The domain's refusals (api/core/errors.py), answered with their
    status, and a status change the state machine refuses (409)."""
    assert isinstance(exc, (DomainError, IllegalTransition))
    return refusal(exc)


def redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
