"""A Python client of the ddpo server, the one the ``ddpo`` CLI uses too.

    import ddpo

    with ddpo.Client() as client:            # DDPO_SERVER / DDPO_TOKEN, or this host's cluster
        job = client.submit(epochs=1, num_machines=2, num_processes=1)
        for line in client.logs(job, follow=True):
            print(line.text)                 # every line once, the last one too
        job = client.wait(job)               # raises ddpo.JobFailed with the reason
        client.download_model(job, "model.pt")

``AsyncClient`` has the same methods, to ``await`` (and ``async for`` the
iterators). Answers are the API's own models (``ddpo.schemas``); failures
are the typed errors of :mod:`ddpo.errors`.

A server that goes away (a restart, a deploy) is waited out, for up to
``patience_s`` at a stretch, by the calls that watch a job (``wait``,
``logs(follow=True)``): the job runs on without the server, so nothing is
lost by waiting. Other calls raise :class:`~ddpo.errors.Unavailable` at once
and leave retrying to the caller, except that a submit with an
``idempotency_key`` may be sent again safely.

The server, the token: from the arguments, else ``DDPO_SERVER`` and
``DDPO_TOKEN``, else the cluster ``ddpo local-cluster --keep`` keeps in this
directory, else ``http://127.0.0.1:8000`` and the admin token a server on
this host made for itself (as the CLI finds them).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel

from ddpo import kept, local_tokens
from ddpo.errors import ApiError, JobFailed, Unavailable, WaitTimeout, error_for
from ddpo.lifecycle import JobStatus, NodeState
from ddpo.schemas.people import (
    AuditPublic,
    CallerPublic,
    KeyCreated,
    KeyPublic,
    KeysPublic,
)
from ddpo.schemas.public import (
    JobPublic,
    JobsPublic,
    LogLinePublic,
    LogsPublic,
    MetricsPublic,
    NodePublic,
    NodesPublic,
    QueuePublic,
    StudiesPublic,
    StudyPublic,
    TrainersPublic,
)
from ddpo.schemas.spec import JobSpec, StudyCreate
from ddpo.schemas.sweep import SweepCreate, SweepPublic, SweepsPublic

DEFAULT_SERVER = "http://127.0.0.1:8000"
T = TypeVar("T")
JobRef = int | JobPublic
SpecLike = JobSpec | Mapping[str, Any]

# Keyword shortcuts for the spec's nested topology.
_TOPOLOGY_FIELDS = ("num_machines", "num_processes")


def server_url(given: str | None = None) -> str:
    """``given``, else ``$DDPO_SERVER``, else the cluster ``ddpo
    local-cluster --keep`` keeps here, else the default; a missing scheme
    is taken as http (``127.0.0.1:8000``). ValueError for another scheme."""
    found = given or os.environ.get("DDPO_SERVER")
    if not found:
        here = kept.read()
        found = here.server if here is not None else DEFAULT_SERVER
    url = found.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"server: {url!r} is not an http:// or https:// URL")
    return url


def token_for(url: str) -> str | None:
    """``$DDPO_TOKEN``, else the user token of the kept cluster at ``url``,
    else the admin token a server on this host made for itself."""
    if os.environ.get("DDPO_TOKEN"):
        return os.environ["DDPO_TOKEN"]
    here = kept.read()
    if here is not None and here.server == url:
        return here.token
    made = local_tokens.tokens_for(url)
    return made.admin if made is not None else None


def _job_id(job: JobRef) -> int:
    return job.id if isinstance(job, JobPublic) else int(job)


def _clean(params: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: (str(v).lower() if isinstance(v, bool) else v)
        for k, v in params.items()
        if v is not None
    }


def spec_body(spec: SpecLike | None, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON a submit sends: the spec (a model: only what was set), with
    ``fields`` over it; ``num_machines`` and ``num_processes`` go into the
    topology. The server checks it all (and names what is wrong)."""
    if isinstance(spec, BaseModel):
        body = spec.model_dump(mode="json", exclude_unset=True)
    else:
        body = dict(spec or {})
    topology = dict(body.get("topology") or {})
    for name, value in fields.items():
        if name in _TOPOLOGY_FIELDS:
            topology[name] = value
        else:
            body[name] = value
    if topology:
        body["topology"] = topology
    return body


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer: what the sync and the async
    client share, so each method is written once (:class:`Calls`)."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def _model(kind: type[T]) -> Callable[[httpx.Response], T]:
    def read(response: httpx.Response) -> T:
        return kind.model_validate_json(response.content)  # type: ignore[attr-defined, no-any-return]

    return read


@dataclass(frozen=True)
class Submitted:
    """A submit's answer: the job, and whether this call made it (False:
    the job the same ``idempotency_key`` made before)."""

    job: JobPublic
    created: bool


class Calls:
    """Every request the clients make, as :class:`Call` values; no I/O."""

    @staticmethod
    def submit(
        spec: SpecLike | None, idempotency_key: str | None, fields: Mapping[str, Any]
    ) -> Call[Submitted]:
        return Call(
            "POST",
            "/jobs",
            lambda r: Submitted(JobPublic.model_validate_json(r.content), r.status_code == 201),
            json=spec_body(spec, fields),
            headers={"Idempotency-Key": idempotency_key} if idempotency_key else {},
        )

    @staticmethod
    def get(job: JobRef) -> Call[JobPublic]:
        return Call("GET", f"/jobs/{_job_id(job)}", _model(JobPublic))

    @staticmethod
    def jobs(status: JobStatus | str | None, limit: int, offset: int) -> Call[JobsPublic]:
        return Call(
            "GET",
            "/jobs",
            _model(JobsPublic),
            params=_clean({"status": status and str(status), "limit": limit, "offset": offset}),
        )

    @staticmethod
    def cancel(job: JobRef) -> Call[JobPublic]:
        return Call("POST", f"/jobs/{_job_id(job)}/cancel", _model(JobPublic))

    @staticmethod
    def set_priority(job: JobRef, priority: int) -> Call[JobPublic]:
        return Call(
            "PATCH", f"/jobs/{_job_id(job)}", _model(JobPublic), json={"priority": priority}
        )

    @staticmethod
    def metrics(job: JobRef, max_points: int) -> Call[MetricsPublic]:
        return Call(
            "GET",
            f"/jobs/{_job_id(job)}/metrics",
            _model(MetricsPublic),
            params={"max_points": max_points},
        )

    @staticmethod
    def log_page(job: JobRef, since: int, filters: Mapping[str, Any]) -> Call[LogsPublic]:
        return Call(
            "GET",
            f"/jobs/{_job_id(job)}/logs",
            _model(LogsPublic),
            params=_clean({**filters, "since": since}),
        )

    @staticmethod
    def queue() -> Call[QueuePublic]:
        return Call("GET", "/queue", _model(QueuePublic))

    @staticmethod
    def nodes(state: NodeState | str | None, limit: int, offset: int) -> Call[NodesPublic]:
        return Call(
            "GET",
            "/nodes",
            _model(NodesPublic),
            params=_clean({"state": state and str(state), "limit": limit, "offset": offset}),
        )

    @staticmethod
    def drain(node_id: int, deadline_s: float) -> Call[NodePublic]:
        return Call(
            "POST", f"/nodes/{node_id}/drain", _model(NodePublic), json={"deadline_s": deadline_s}
        )

    @staticmethod
    def undrain(node_id: int) -> Call[NodePublic]:
        return Call("POST", f"/nodes/{node_id}/undrain", _model(NodePublic))

    @staticmethod
    def trainers() -> Call[TrainersPublic]:
        return Call("GET", "/trainers", _model(TrainersPublic))

    @staticmethod
    def submit_study(study: StudyCreate | Mapping[str, Any]) -> Call[StudyPublic]:
        body = (
            study.model_dump(mode="json", exclude_unset=True)
            if isinstance(study, BaseModel)
            else dict(study)
        )
        return Call("POST", "/studies", _model(StudyPublic), json=body)

    @staticmethod
    def study(study_id: int) -> Call[StudyPublic]:
        return Call("GET", f"/studies/{int(study_id)}", _model(StudyPublic))

    @staticmethod
    def studies(limit: int, offset: int) -> Call[StudiesPublic]:
        return Call(
            "GET", "/studies", _model(StudiesPublic), params={"limit": limit, "offset": offset}
        )

    @staticmethod
    def cancel_study(study_id: int) -> Call[StudyPublic]:
        return Call("POST", f"/studies/{int(study_id)}/cancel", _model(StudyPublic))

    @staticmethod
    def submit_sweep(sweep: SweepCreate | Mapping[str, Any]) -> Call[SweepPublic]:
        body = (
            sweep.model_dump(mode="json", exclude_unset=True)
            if isinstance(sweep, BaseModel)
            else dict(sweep)
        )
        return Call("POST", "/sweeps", _model(SweepPublic), json=body)

    @staticmethod
    def sweep(sweep_id: int) -> Call[SweepPublic]:
        return Call("GET", f"/sweeps/{int(sweep_id)}", _model(SweepPublic))

    @staticmethod
    def sweeps(limit: int, offset: int) -> Call[SweepsPublic]:
        return Call(
            "GET", "/sweeps", _model(SweepsPublic), params={"limit": limit, "offset": offset}
        )

    @staticmethod
    def cancel_sweep(sweep_id: int) -> Call[SweepPublic]:
        return Call("POST", f"/sweeps/{int(sweep_id)}/cancel", _model(SweepPublic))

    @staticmethod
    def create_key(name: str, role: str) -> Call[KeyCreated]:
        return Call("POST", "/keys", _model(KeyCreated), json={"name": name, "role": role})

    @staticmethod
    def keys() -> Call[KeysPublic]:
        return Call("GET", "/keys", _model(KeysPublic))

    @staticmethod
    def revoke_key(key_id: int) -> Call[KeyPublic]:
        return Call("POST", f"/keys/{int(key_id)}/revoke", _model(KeyPublic))

    @staticmethod
    def audit(limit: int, before: int | None, filters: Mapping[str, Any]) -> Call[AuditPublic]:
        return Call(
            "GET",
            "/audit",
            _model(AuditPublic),
            params=_clean({**filters, "limit": limit, "before": before}),
        )

    @staticmethod
    def whoami() -> Call[CallerPublic]:
        return Call("GET", "/whoami", _model(CallerPublic))


class _LogCursor:
    """Where a followed log stands: the last line id handed out, so that a
    line is never given twice and a reconnection asks only for what is
    after it. The log ends only when a plain page after the last line is
    empty and its job has ended: a follow stream that closes cleanly (a
    server shutting down does that) is not taken for the end."""

    def __init__(self, since: int) -> None:
        self.since = since

    def take(self, line: LogLinePublic) -> bool:
        if line.id <= self.since:
            return False
        self.since = line.id
        return True

    def fresh(self, lines: list[LogLinePublic]) -> list[LogLinePublic]:
        return [line for line in lines if self.take(line)]


class Patience:
    """How long a watcher waits out an absent server: a growing pause, at
    most ``limit_s`` in a row; ``say`` hears when it starts and ends."""

    def __init__(self, limit_s: float, say: Callable[[str], None] | None) -> None:
        self.limit_s, self.say = limit_s, say
        self.away_since: float | None = None
        self.pause_s = 0.5

    def missed(self, error: Unavailable) -> float:
        """The pause before the next try; raises ``error`` past the limit."""
        now = time.monotonic()
        if self.away_since is None:
            self.away_since = now
            if self.say:
                self.say(f"{error.detail}; retrying until it answers (Ctrl-C to stop watching)")
        elif now - self.away_since > self.limit_s:
            raise error
        pause = error.retry_after if error.retry_after else self.pause_s
        self.pause_s = min(self.pause_s * 2, 5.0)
        return float(pause)

    def answered(self) -> None:
        if self.away_since is not None:
            if self.say:
                self.say(f"the server is back after {time.monotonic() - self.away_since:.0f} s")
            self.away_since, self.pause_s = None, 0.5


def _check(response: httpx.Response, ok: tuple[int, ...] = ()) -> None:
    if response.is_success or response.status_code in ok:
        return
    raise error_for(response.status_code, response.text, response.headers)


class _Base:
    def __init__(
        self,
        server: str | None,
        token: str | None,
        timeout_s: float,
        patience_s: float,
        say: Callable[[str], None] | None,
    ) -> None:
        self.server = server_url(server)
        self.token = token if token is not None else token_for(self.server)
        self.timeout_s = timeout_s
        self.patience_s = patience_s
        self.say = say
        self._headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _unreachable(self, exc: Exception) -> Unavailable:
        return Unavailable(
            f"cannot reach the server at {self.server} ({type(exc).__name__}: {exc}); is it "
            "running, and is --server (or DDPO_SERVER) its address?",
            status=0,
        )

    @staticmethod
    def _done(job: JobPublic) -> JobPublic:
        if job.status is JobStatus.SUCCEEDED:
            return job
        raise JobFailed(job)


class Client(_Base):
    """The server's API, blocking. Use as a context manager, or ``close()``."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 30,
        patience_s: float = 600,
        say: Callable[[str], None] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(server, token, timeout_s, patience_s, say)
        self.http = httpx.Client(
            base_url=self.server, timeout=timeout_s, headers=self._headers, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # --- the plumbing -------------------------------------------------------

    def request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (), **kwargs: Any
    ) -> httpx.Response:
        """A raw request: the response if it succeeded (2xx, or a status in
        ``ok``), else the typed error."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        _check(response, ok)
        return response

    def call(self, call: Call[T]) -> T:
        response = self.request(
            call.method,
            call.path,
            params=call.params or None,
            json=call.json,
            headers=call.headers or None,
        )
        return call.read(response)

    def _patiently(self, call: Call[T], patience: Patience) -> T:
        while True:
            try:
                value = self.call(call)
            except Unavailable as error:
                time.sleep(patience.missed(error))
                continue
            patience.answered()
            return value

    # --- jobs ---------------------------------------------------------------

    def submit(
        self, spec: SpecLike | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> JobPublic:
        """Queue a job: ``spec`` (a ``JobSpec`` or a dict) with ``fields``
        over it (``epochs=2``, ``num_machines=2``). With an
        ``idempotency_key``, sending it again returns the same job."""
        return self.call(Calls.submit(spec, idempotency_key, fields)).job

    def submit_once(
        self, spec: SpecLike | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> Submitted:
        """As :meth:`submit`, saying whether this call made the job."""
        return self.call(Calls.submit(spec, idempotency_key, fields))

    def get(self, job: JobRef) -> JobPublic:
        return self.call(Calls.get(job))

    def list(
        self,
        status: JobStatus | str | None = None,
        *,
        page_size: int = 100,
        limit: int | None = None,
    ) -> Iterator[JobPublic]:
        """Jobs, newest first, a page at a time (each job once, even when
        new ones arrive between pages); at most ``limit``."""
        seen: set[int] = set()
        offset = 0
        while True:
            page = self.call(Calls.jobs(status, page_size, offset))
            for job in page.data:
                if job.id not in seen:
                    seen.add(job.id)
                    yield job
                    if limit is not None and len(seen) >= limit:
                        return
            if len(page.data) < page_size:
                return
            offset += len(page.data)

    def wait(
        self, job: JobRef, timeout_s: float | None = None, *, interval_s: float = 1.0
    ) -> JobPublic:
        """The job once it has ended. Raises :class:`JobFailed` (with the
        reason) unless it succeeded, :class:`WaitTimeout` after ``timeout_s``."""
        patience = Patience(self.patience_s, self.say)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            seen = self._patiently(Calls.get(job), patience)
            if seen.status.is_terminal():
                return self._done(seen)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(seen, timeout_s or 0)
            time.sleep(interval_s)

    def cancel(self, job: JobRef) -> JobPublic:
        return self.call(Calls.cancel(job))

    def set_priority(self, job: JobRef, priority: int) -> JobPublic:
        return self.call(Calls.set_priority(job, priority))

    def metrics(self, job: JobRef, max_points: int = 1000) -> MetricsPublic:
        return self.call(Calls.metrics(job, max_points))

    def logs(
        self,
        job: JobRef,
        *,
        follow: bool = False,
        since: int = 0,
        machine_id: int | None = None,
        rank: int | None = None,
        tail: int | None = None,
    ) -> Iterator[LogLinePublic]:
        """What the job's ranks printed, oldest first, each line once. With
        ``follow``, new lines as they come until the job has ended and its
        last line is out; a cut connection or a server restart is resumed
        after the last line given. ``tail``: start with the last N lines."""
        filters = {"machine_id": machine_id, "rank": rank}
        cursor = _LogCursor(since)
        patience = Patience(self.patience_s, self.say)
        # Only a follow waits out an absent server: a plain read says so at once.
        read = functools.partial(self._patiently, patience=patience) if follow else self.call
        if tail is not None:
            page = read(Calls.log_page(job, since, {**filters, "tail": tail}))
            yield from cursor.fresh(page.lines)
            if not follow:
                return
        while True:
            if follow:
                try:
                    yield from self._stream_lines(job, cursor, filters)
                    patience.answered()
                except Unavailable as error:
                    time.sleep(patience.missed(error))
                    continue
            page = read(Calls.log_page(job, cursor.since, filters))
            yield from cursor.fresh(page.lines)
            if not page.lines and (not follow or page.job_status.is_terminal()):
                return

    def _stream_lines(
        self, job: JobRef, cursor: _LogCursor, filters: Mapping[str, Any]
    ) -> Iterator[LogLinePublic]:
        params = _clean({**filters, "since": cursor.since, "follow": True})
        try:
            with self.http.stream(
                "GET",
                f"/jobs/{_job_id(job)}/logs",
                params=params,
                timeout=httpx.Timeout(self.timeout_s, read=None),
            ) as response:
                if not response.is_success:
                    response.read()
                    _check(response)
                for raw in response.iter_lines():
                    if raw:
                        line = LogLinePublic.model_validate_json(raw)
                        if cursor.take(line):
                            yield line
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    def download_model(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        """The job's newest checkpoint (a succeeded job's: its final model),
        streamed to ``path`` (written whole or not at all). ``torch.load``
        it: ``["model"]`` is the state_dict."""
        target = Path(path)
        partial = target.with_name(f".{target.name}.part")
        try:
            with self.http.stream(
                "GET",
                f"/jobs/{_job_id(job)}/model",
                timeout=httpx.Timeout(self.timeout_s, read=None),
            ) as response:
                if not response.is_success:
                    response.read()
                    _check(response)
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise self._unreachable(exc) from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)
        return target

    # --- the cluster ----------------------------------------------------------

    def queue(self) -> QueuePublic:
        return self.call(Calls.queue())

    def nodes(
        self, state: NodeState | str | None = None, *, limit: int = 100, offset: int = 0
    ) -> NodesPublic:
        return self.call(Calls.nodes(state, limit, offset))

    def drain(self, node_id: int, deadline_s: float = 0.0) -> NodePublic:
        return self.call(Calls.drain(node_id, deadline_s))

    def undrain(self, node_id: int) -> NodePublic:
        return self.call(Calls.undrain(node_id))

    def trainers(self) -> TrainersPublic:
        return self.call(Calls.trainers())

    # --- studies ----------------------------------------------------------------

    def submit_study(self, study: StudyCreate | Mapping[str, Any]) -> StudyPublic:
        return self.call(Calls.submit_study(study))

    def study(self, study_id: int) -> StudyPublic:
        return self.call(Calls.study(study_id))

    def studies(self, *, limit: int = 50, offset: int = 0) -> StudiesPublic:
        return self.call(Calls.studies(limit, offset))

    def cancel_study(self, study_id: int) -> StudyPublic:
        return self.call(Calls.cancel_study(study_id))

    # --- sweeps -----------------------------------------------------------------

    def submit_sweep(self, sweep: SweepCreate | Mapping[str, Any]) -> SweepPublic:
        """A sweep: ``{"spec": {...}, "space": {"lr": {"type": "float", ...}}, ...}``."""
        return self.call(Calls.submit_sweep(sweep))

    def sweep(self, sweep_id: int) -> SweepPublic:
        return self.call(Calls.sweep(sweep_id))

    def sweeps(self, *, limit: int = 20, offset: int = 0) -> SweepsPublic:
        return self.call(Calls.sweeps(limit, offset))

    def cancel_sweep(self, sweep_id: int) -> SweepPublic:
        return self.call(Calls.cancel_sweep(sweep_id))

    def wait_sweep(
        self, sweep_id: int, *, timeout_s: float | None = None, poll_s: float = 1.0
    ) -> SweepPublic:
        """The sweep once it has ended, whatever became of its trials
        (:class:`WaitTimeout` past ``timeout_s``); a server restart on the
        way is waited out."""
        patience = Patience(self.patience_s, self.say)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            sweep = self._patiently(Calls.sweep(sweep_id), patience)
            if sweep.status.is_terminal():
                return sweep
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(sweep, timeout_s or 0)
            time.sleep(poll_s)

    # --- people -------------------------------------------------------------------

    def create_key(self, name: str, role: str = "user") -> KeyCreated:
        return self.call(Calls.create_key(name, role))

    def keys(self) -> KeysPublic:
        return self.call(Calls.keys())

    def revoke_key(self, key_id: int) -> KeyPublic:
        return self.call(Calls.revoke_key(key_id))

    def audit(self, *, limit: int = 100, before: int | None = None, **filters: Any) -> AuditPublic:
        return self.call(Calls.audit(limit, before, filters))

    def whoami(self) -> CallerPublic:
        return self.call(Calls.whoami())


class AsyncClient(_Base):
    """:class:`Client`'s methods, to ``await``; ``logs`` and ``list`` are
    async iterators. Use as an async context manager, or ``await aclose()``."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 30,
        patience_s: float = 600,
        say: Callable[[str], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(server, token, timeout_s, patience_s, say)
        self.http = httpx.AsyncClient(
            base_url=self.server, timeout=timeout_s, headers=self._headers, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(
        self, method: str, path: str, *, ok: tuple[int, ...] = (), **kwargs: Any
    ) -> httpx.Response:
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        _check(response, ok)
        return response

    async def call(self, call: Call[T]) -> T:
        response = await self.request(
            call.method,
            call.path,
            params=call.params or None,
            json=call.json,
            headers=call.headers or None,
        )
        return call.read(response)

    async def _patiently(self, call: Call[T], patience: Patience) -> T:
        while True:
            try:
                value = await self.call(call)
            except Unavailable as error:
                await asyncio.sleep(patience.missed(error))
                continue
            patience.answered()
            return value

    async def submit(
        self, spec: SpecLike | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> JobPublic:
        return (await self.call(Calls.submit(spec, idempotency_key, fields))).job

    async def submit_once(
        self, spec: SpecLike | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> Submitted:
        return await self.call(Calls.submit(spec, idempotency_key, fields))

    async def get(self, job: JobRef) -> JobPublic:
        return await self.call(Calls.get(job))

    async def list(
        self,
        status: JobStatus | str | None = None,
        *,
        page_size: int = 100,
        limit: int | None = None,
    ) -> AsyncIterator[JobPublic]:
        seen: set[int] = set()
        offset = 0
        while True:
            page = await self.call(Calls.jobs(status, page_size, offset))
            for job in page.data:
                if job.id not in seen:
                    seen.add(job.id)
                    yield job
                    if limit is not None and len(seen) >= limit:
                        return
            if len(page.data) < page_size:
                return
            offset += len(page.data)

    async def wait(
        self, job: JobRef, timeout_s: float | None = None, *, interval_s: float = 1.0
    ) -> JobPublic:
        patience = Patience(self.patience_s, self.say)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            seen = await self._patiently(Calls.get(job), patience)
            if seen.status.is_terminal():
                return self._done(seen)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(seen, timeout_s or 0)
            await asyncio.sleep(interval_s)

    async def cancel(self, job: JobRef) -> JobPublic:
        return await self.call(Calls.cancel(job))

    async def set_priority(self, job: JobRef, priority: int) -> JobPublic:
        return await self.call(Calls.set_priority(job, priority))

    async def metrics(self, job: JobRef, max_points: int = 1000) -> MetricsPublic:
        return await self.call(Calls.metrics(job, max_points))

    async def logs(
        self,
        job: JobRef,
        *,
        follow: bool = False,
        since: int = 0,
        machine_id: int | None = None,
        rank: int | None = None,
        tail: int | None = None,
    ) -> AsyncIterator[LogLinePublic]:
        filters = {"machine_id": machine_id, "rank": rank}
        cursor = _LogCursor(since)
        patience = Patience(self.patience_s, self.say)
        read = functools.partial(self._patiently, patience=patience) if follow else self.call
        if tail is not None:
            page = await read(Calls.log_page(job, since, {**filters, "tail": tail}))
            for line in cursor.fresh(page.lines):
                yield line
            if not follow:
                return
        while True:
            if follow:
                try:
                    async for line in self._stream_lines(job, cursor, filters):
                        yield line
                    patience.answered()
                except Unavailable as error:
                    await asyncio.sleep(patience.missed(error))
                    continue
            page = await read(Calls.log_page(job, cursor.since, filters))
            for line in cursor.fresh(page.lines):
                yield line
            if not page.lines and (not follow or page.job_status.is_terminal()):
                return

    async def _stream_lines(
        self, job: JobRef, cursor: _LogCursor, filters: Mapping[str, Any]
    ) -> AsyncIterator[LogLinePublic]:
        params = _clean({**filters, "since": cursor.since, "follow": True})
        try:
            async with self.http.stream(
                "GET",
                f"/jobs/{_job_id(job)}/logs",
                params=params,
                timeout=httpx.Timeout(self.timeout_s, read=None),
            ) as response:
                if not response.is_success:
                    await response.aread()
                    _check(response)
                async for raw in response.aiter_lines():
                    if raw:
                        line = LogLinePublic.model_validate_json(raw)
                        if cursor.take(line):
                            yield line
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    async def download_model(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        partial = target.with_name(f".{target.name}.part")
        try:
            async with self.http.stream(
                "GET",
                f"/jobs/{_job_id(job)}/model",
                timeout=httpx.Timeout(self.timeout_s, read=None),
            ) as response:
                if not response.is_success:
                    await response.aread()
                    _check(response)
                with partial.open("wb") as out:
                    async for chunk in response.aiter_bytes(1 << 20):
                        out.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise self._unreachable(exc) from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)
        return target

    async def queue(self) -> QueuePublic:
        return await self.call(Calls.queue())

    async def nodes(
        self, state: NodeState | str | None = None, *, limit: int = 100, offset: int = 0
    ) -> NodesPublic:
        return await self.call(Calls.nodes(state, limit, offset))

    async def drain(self, node_id: int, deadline_s: float = 0.0) -> NodePublic:
        return await self.call(Calls.drain(node_id, deadline_s))

    async def undrain(self, node_id: int) -> NodePublic:
        return await self.call(Calls.undrain(node_id))

    async def trainers(self) -> TrainersPublic:
        return await self.call(Calls.trainers())

    async def submit_study(self, study: StudyCreate | Mapping[str, Any]) -> StudyPublic:
        return await self.call(Calls.submit_study(study))

    async def study(self, study_id: int) -> StudyPublic:
        return await self.call(Calls.study(study_id))

    async def studies(self, *, limit: int = 50, offset: int = 0) -> StudiesPublic:
        return await self.call(Calls.studies(limit, offset))

    async def cancel_study(self, study_id: int) -> StudyPublic:
        return await self.call(Calls.cancel_study(study_id))

    async def submit_sweep(self, sweep: SweepCreate | Mapping[str, Any]) -> SweepPublic:
        return await self.call(Calls.submit_sweep(sweep))

    async def sweep(self, sweep_id: int) -> SweepPublic:
        return await self.call(Calls.sweep(sweep_id))

    async def sweeps(self, *, limit: int = 20, offset: int = 0) -> SweepsPublic:
        return await self.call(Calls.sweeps(limit, offset))

    async def cancel_sweep(self, sweep_id: int) -> SweepPublic:
        return await self.call(Calls.cancel_sweep(sweep_id))

    async def wait_sweep(
        self, sweep_id: int, *, timeout_s: float | None = None, poll_s: float = 1.0
    ) -> SweepPublic:
        """As :meth:`Client.wait_sweep`."""
        patience = Patience(self.patience_s, self.say)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            sweep = await self._patiently(Calls.sweep(sweep_id), patience)
            if sweep.status.is_terminal():
                return sweep
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(sweep, timeout_s or 0)
            await asyncio.sleep(poll_s)

    async def create_key(self, name: str, role: str = "user") -> KeyCreated:
        return await self.call(Calls.create_key(name, role))

    async def keys(self) -> KeysPublic:
        return await self.call(Calls.keys())

    async def revoke_key(self, key_id: int) -> KeyPublic:
        return await self.call(Calls.revoke_key(key_id))

    async def audit(
        self, *, limit: int = 100, before: int | None = None, **filters: Any
    ) -> AuditPublic:
        return await self.call(Calls.audit(limit, before, filters))

    async def whoami(self) -> CallerPublic:
        return await self.call(Calls.whoami())


__all__ = ["DEFAULT_SERVER", "ApiError", "AsyncClient", "Client", "Submitted"]
