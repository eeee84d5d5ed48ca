"""The worker's side of the protocol: HTTP calls to the server, nothing else."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import httpx
from pydantic import BaseModel

from ddpo import store
from ddpo.schemas import protocol


class ServerUnavailable(RuntimeError):
    """The server could not be reached or answered with a 5xx: try again later."""


class NodeUnknown(RuntimeError):
    """The server does not know this node id: register again."""


class Refused(RuntimeError):
    """The server rejected a request (4xx): resending it would not help."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


class CredentialRefused(Refused):
    """401: the server does not know the token presented (a revoked node, or
    a server with a new database)."""


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# A connection attempt that takes longer is to a host that is not there (a
# cut link, a server down): give up and try again, rather than wait out the
# kernel's SYN retries, so a healed link is noticed within seconds.
CONNECT_TIMEOUT_S = 3.0


def server_urls(value: str) -> list[str]:
    """``--server``'s value: one URL, or several servers on one database,
    comma-separated (a worker moves to the next when one cannot be reached)."""
    return [url.strip().rstrip("/") for url in value.split(",") if url.strip()]


class ServerClient:
    def __init__(self, base_url: str | Sequence[str], timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._urls = server_urls(base_url) if isinstance(base_url, str) else list(base_url)
        self._current = 0
        self._http = httpx.Client(timeout=self._timeout(timeout_s))
        # The node's own credential, presented on everything but joining.
        self.credential: str | None = None

    @property
    def url(self) -> str:
        """The server this client speaks to now."""
        return self._urls[self._current]

    def _unreachable(self, what: str, exc: Exception) -> ServerUnavailable:
        """The server could not be reached: the next call goes to the next
        one given, if there are several (one database behind them all)."""
        tried = self.url
        self._current = (self._current + 1) % len(self._urls)
        return ServerUnavailable(f"{what} ({tried}): {exc!r}")

    def close(self) -> None:
        self._http.close()

    def _timeout(self, seconds: float) -> httpx.Timeout:
        return httpx.Timeout(seconds, connect=min(self._timeout_s, CONNECT_TIMEOUT_S))

    def _auth(self) -> dict[str, str]:
        return _bearer(self.credential)

    def _post(
        self,
        path: str,
        body: BaseModel,
        *,
        extra_wait_s: float = 0.0,
        auth: dict[str, str] | None = None,
    ) -> object:
        """POST ``body``, presenting ``auth`` if given, else the node's credential."""
        try:
            response = self._http.post(
                self.url + path,
                content=body.model_dump_json(),
                headers={
                    "content-type": "application/json",
                    **(self._auth() if auth is None else auth),
                },
                # A long-poll is held open by the server on purpose.
                timeout=self._timeout(self._timeout_s + extra_wait_s),
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(path, exc) from exc
        return self._check(path, response)

    @staticmethod
    def _check(path: str, response: httpx.Response) -> object:
        if response.status_code >= 500 or response.status_code == 429:
            # 429: too many nodes joining at once; this one joins a little later.
            raise ServerUnavailable(f"{path}: {response.status_code} {response.text[:200]}")
        if response.status_code == 401:
            raise CredentialRefused(401, f"{path}: 401 {response.text[:500]}")
        if response.status_code >= 400:
            raise Refused(
                response.status_code, f"{path}: {response.status_code} {response.text[:500]}"
            )
        return response.json()

    def register(
        self, registration: protocol.NodeRegistration, token: str | None
    ) -> protocol.NodeRegistered:
        """Register presenting exactly ``token``: the node's credential, the
        join token, or nothing (a server without tokens)."""
        return protocol.NodeRegistered.model_validate(
            self._post("/nodes/register", registration, auth=_bearer(token))
        )

    def poll(
        self,
        node_id: int,
        active_part_ids: list[int],
        waiting_for_port: list[int],
        wait_s: float,
        asked_to_stop: list[int] | None = None,
    ) -> protocol.PollResponse:
        request = protocol.PollRequest(
            active_part_ids=active_part_ids,
            waiting_for_port=waiting_for_port,
            asked_to_stop=asked_to_stop or [],
            wait_s=wait_s,
        )
        try:
            data = self._post(f"/nodes/{node_id}/poll", request, extra_wait_s=wait_s)
        except Refused as exc:
            if exc.status_code == 404:
                raise NodeUnknown(str(exc)) from exc
            raise
        return protocol.PollResponse.model_validate(data)

    def heartbeat(self, node_id: int, active_part_ids: list[int]) -> protocol.HeartbeatResponse:
        """The node is alive; the parts among ``active_part_ids`` to stop
        (now, or at a step)."""
        data = self._post(
            f"/nodes/{node_id}/heartbeat",
            protocol.HeartbeatRequest(active_part_ids=active_part_ids),
        )
        return protocol.HeartbeatResponse.model_validate(data)

    def started(self, part_id: int, node_id: int) -> bool:
        ack = protocol.Ack.model_validate(
            self._post(f"/parts/{part_id}/started", protocol.PartStarted(node_id=node_id))
        )
        return ack.accepted

    def rendezvous(self, part_id: int, node_id: int, master_port: int) -> bool:
        body = protocol.RendezvousBound(node_id=node_id, master_port=master_port)
        return protocol.Ack.model_validate(
            self._post(f"/parts/{part_id}/rendezvous", body)
        ).accepted

    def upload_checkpoint(
        self, part_id: int, node_id: int, epoch: int, path: Path, step: int | None = None
    ) -> bool:
        params = {"node_id": node_id, "epoch": epoch}
        if step is not None:
            params["step"] = step
        try:
            with open(path, "rb") as body:
                response = self._http.put(
                    f"{self.url}/parts/{part_id}/checkpoint",
                    params=params,
                    content=body,
                    headers={"content-type": "application/octet-stream", **self._auth()},
                    timeout=self._timeout(self._timeout_s * 10),
                )
        except httpx.HTTPError as exc:
            raise self._unreachable("checkpoint upload", exc) from exc
        return protocol.Ack.model_validate(
            self._check(f"/parts/{part_id}/checkpoint", response)
        ).accepted

    def tracking_run(self, part_id: int, node_id: int) -> protocol.TrackingRun:
        """The job's MLflow run, made by the server if need be."""
        return protocol.TrackingRun.model_validate(
            self._post(f"/parts/{part_id}/tracking-run", protocol.PartStarted(node_id=node_id))
        )

    def checkpoint_stored(self, part_id: int, record: protocol.CheckpointStored) -> bool:
        """Machine 0 wrote a checkpoint to the artifact store: its record."""
        return protocol.Ack.model_validate(
            self._post(f"/parts/{part_id}/checkpoint/stored", record)
        ).accepted

    def download_checkpoint(self, job_id: int, destination: Path) -> None:
        """The job's newest checkpoint, written whole to ``destination``, its
        SHA-256 checked when the server has one (store.DigestMismatch)."""
        partial = destination.with_name(destination.name + ".partial")
        digest = hashlib.sha256()
        try:
            with self._http.stream(
                "GET",
                f"{self.url}/jobs/{job_id}/model",
                timeout=self._timeout(self._timeout_s * 10),
                headers=self._auth(),
            ) as response:
                if response.status_code != 200:
                    response.read()
                    self._check(f"/jobs/{job_id}/model", response)
                expected = response.headers.get(protocol.CHECKPOINT_SHA256_HEADER)
                with open(partial, "wb") as out:
                    for chunk in response.iter_bytes():
                        digest.update(chunk)
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise self._unreachable("checkpoint download", exc) from exc
        store.check_digest(f"job {job_id}'s checkpoint", digest, expected, partial)
        os.replace(partial, destination)

    def progress(self, part_id: int, node_id: int, reports: list[protocol.ProgressReport]) -> bool:
        body = protocol.ProgressBatch(node_id=node_id, reports=reports)
        return protocol.Ack.model_validate(self._post(f"/parts/{part_id}/progress", body)).accepted

    def logs(self, part_id: int, node_id: int, lines: list[protocol.LogLine]) -> bool:
        body = protocol.LogBatch(node_id=node_id, lines=lines)
        return protocol.Ack.model_validate(self._post(f"/parts/{part_id}/logs", body)).accepted

    def leave(self, node_id: int, grace_s: float) -> None:
        """This node's worker is shutting down: its parts' jobs stop at a
        step within ``grace_s`` and go elsewhere."""
        self._post(f"/nodes/{node_id}/leave", protocol.NodeLeaving(grace_s=grace_s))

    def finish(self, part_id: int, report: protocol.PartFinished) -> bool:
        return protocol.Ack.model_validate(self._post(f"/parts/{part_id}/finish", report)).accepted
