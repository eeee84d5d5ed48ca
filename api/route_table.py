"""Every route the server answers, in one table: its method, its path
template, the roles that may call it, and whether its body is a checkpoint
upload. The routers' decorators (api/routes/__init__.py), the auth rules
(api/auth.py) and the body cap (api/limits.py) all read it, so a route
cannot be added in one place and forgotten in another; a path no route
matches is answered 404 to everyone."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ddpo.schemas.people import Role as Role  # re-exported: the roles are the table's words

PUBLIC: frozenset[Role] = frozenset()  # no token needed
READ = frozenset({Role.ADMIN, Role.USER, Role.READER})
WRITE = frozenset({Role.ADMIN, Role.USER})
NODE = frozenset({Role.NODE})
ADMIN = frozenset({Role.ADMIN})


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # the template, as FastAPI matches it
    roles: frozenset[Role]  # PUBLIC: anyone
    # The body is a checkpoint: capped by DDPO_MAX_CHECKPOINT_MB, not DDPO_MAX_BODY_KB.
    upload: bool = False
    # The body may be large (a node's batch of log lines or reports, its
    # registration): capped by DDPO_MAX_BODY_KB; every other route's by
    # DDPO_MAX_SMALL_BODY_KB.
    large_body: bool = False


# The dashboard's pages and the API reference (FastAPI's own) carry no data.
HEALTH = Route("GET", "/healthz", PUBLIC)
DASHBOARD_ROOT = Route("GET", "/", PUBLIC)
DASHBOARD = Route("GET", "/ui", PUBLIC)
DASHBOARD_PAGE = Route("GET", "/ui/{page:path}", PUBLIC)
DASHBOARD_STATIC = Route("GET", "/ui/static/{name}", PUBLIC)
OPENAPI = Route("GET", "/openapi.json", PUBLIC)
DOCS = Route("GET", "/docs", PUBLIC)
DOCS_OAUTH = Route("GET", "/docs/oauth2-redirect", PUBLIC)
DOCS_STATIC = Route("GET", "/docs/static/{name}", PUBLIC)
REDOC = Route("GET", "/redoc", PUBLIC)
PROMETHEUS = Route("GET", "/metrics", READ)

SUBMIT_JOB = Route("POST", "/jobs", WRITE)
LIST_JOBS = Route("GET", "/jobs", READ)
GET_JOB = Route("GET", "/jobs/{job_id}", READ)
CANCEL_JOB = Route("POST", "/jobs/{job_id}/cancel", WRITE)
UPDATE_JOB = Route("PATCH", "/jobs/{job_id}", WRITE)
QUEUE = Route("GET", "/queue", READ)
JOB_METRICS = Route("GET", "/jobs/{job_id}/metrics", READ)
JOB_LOGS = Route("GET", "/jobs/{job_id}/logs", READ)
# Workers fetch the checkpoint a retry resumes from (of their own jobs).
JOB_MODEL = Route("GET", "/jobs/{job_id}/model", READ | NODE)

SUBMIT_STUDY = Route("POST", "/studies", WRITE)
LIST_STUDIES = Route("GET", "/studies", READ)
GET_STUDY = Route("GET", "/studies/{study_id}", READ)
CANCEL_STUDY = Route("POST", "/studies/{study_id}/cancel", WRITE)

SUBMIT_SWEEP = Route("POST", "/sweeps", WRITE)
LIST_SWEEPS = Route("GET", "/sweeps", READ)
GET_SWEEP = Route("GET", "/sweeps/{sweep_id}", READ)
CANCEL_SWEEP = Route("POST", "/sweeps/{sweep_id}/cancel", WRITE)

# People: per-person keys (admins hand them out) and what was done with them.
CREATE_KEY = Route("POST", "/keys", ADMIN)
LIST_KEYS = Route("GET", "/keys", ADMIN)
REVOKE_KEY = Route("POST", "/keys/{key_id}/revoke", ADMIN)
AUDIT = Route("GET", "/audit", ADMIN)
WHOAMI = Route("GET", "/whoami", READ)

LIST_NODES = Route("GET", "/nodes", READ)
LIST_TRAINERS = Route("GET", "/trainers", READ)
# A new node joins; a known one registers again with its own credential.
REGISTER_NODE = Route("POST", "/nodes/register", NODE | {Role.JOIN}, large_body=True)
REVOKE_NODE = Route("POST", "/nodes/{node_id}/revoke", ADMIN)
DRAIN_NODE = Route("POST", "/nodes/{node_id}/drain", ADMIN)
UNDRAIN_NODE = Route("POST", "/nodes/{node_id}/undrain", ADMIN)
# A node's worker shutting down (SIGTERM) hands its parts back at a step.
LEAVE = Route("POST", "/nodes/{node_id}/leave", NODE)
POLL = Route("POST", "/nodes/{node_id}/poll", NODE)
HEARTBEAT = Route("POST", "/nodes/{node_id}/heartbeat", NODE)

PART_STARTED = Route("POST", "/parts/{part_id}/started", NODE)
PART_RENDEZVOUS = Route("POST", "/parts/{part_id}/rendezvous", NODE)
PART_PROGRESS = Route("POST", "/parts/{part_id}/progress", NODE, large_body=True)
PART_LOGS = Route("POST", "/parts/{part_id}/logs", NODE, large_body=True)
PART_FINISH = Route("POST", "/parts/{part_id}/finish", NODE)
PART_CHECKPOINT = Route("PUT", "/parts/{part_id}/checkpoint", NODE, upload=True)
# ... or, with an artifact store, the record of one machine 0 wrote there.
PART_CHECKPOINT_STORED = Route("POST", "/parts/{part_id}/checkpoint/stored", NODE)
# The job's MLflow run, made if need be, for the part's ranks.
PART_TRACKING_RUN = Route("POST", "/parts/{part_id}/tracking-run", NODE)

ROUTES: tuple[Route, ...] = tuple(r for r in list(globals().values()) if isinstance(r, Route))


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    regex = "".join(
        (".*" if part.endswith(":path}") else "[^/]+") if part.startswith("{") else re.escape(part)
        for part in parts
    )
    return re.compile(f"^{regex}$")


# Literal paths before templated ones ("/nodes/register" is not a node id).
_COMPILED = sorted(
    ((_pattern(r.path), r) for r in ROUTES),
    key=lambda pair: pair[0].pattern.count("[^/]+") + 10 * pair[0].pattern.count(".*"),
)


# A request's route is asked by more than one layer (auth, body caps), and
# a node asks the same few paths (its polls, its part's reports) again and
# again: each was a pass over every route's pattern, 2% of a busy server's
# Python. Kept for this many paths of at most this length (a client's
# made-up paths evict others, and hold at most 4096 x 256 characters).
_CACHED_PATHS = 4096
_CACHED_PATH_CHARS = 256


def match(method: str, path: str) -> Route | int:
    """The route a request is for, or the status for one no route covers
    (404: no such path; 405: not with this method). HEAD is GET's."""
    if len(method) + len(path) > _CACHED_PATH_CHARS:
        return _match(method, path)
    return _match_cached(method, path)


def _match(method: str, path: str) -> Route | int:
    method = "GET" if method == "HEAD" else method
    path_known = False
    for pattern, route in _COMPILED:
        if pattern.match(path):
            if route.method == method:
                return route
            path_known = True
    return 405 if path_known else 404


_match_cached = lru_cache(maxsize=_CACHED_PATHS)(_match)


def find(method: str, template: str) -> Route | None:
    """The route declared with this method and template."""
    method = "GET" if method == "HEAD" else method
    return next((r for r in ROUTES if r.method == method and r.path == template), None)
