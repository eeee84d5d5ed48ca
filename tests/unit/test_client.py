"""ddpo.Client's own logic against a scripted server (httpx's MockTransport):
a followed log that is cut, or closed cleanly by a server going down, goes
on after its last line and gives each line once; errors come typed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

import ddpo
from ddpo.client import AsyncClient, Client

AT = "2026-12-04T00:00:00Z"


def line(i: int) -> dict[str, Any]:
    return {"id": i, "machine_id": 0, "rank": 0, "text": f"line {i}", "at": AT}


class Server:
    """Lines 1..6 of a job that ends after line 6. Follow streams give what
    is after ``since`` up to the next cut; the first stream ends cleanly
    after line 2 (a server shutting down), the second breaks mid-line after
    line 4; plain pages give one line at a time."""

    def __init__(self) -> None:
        self.streams = 0
        self.asked: list[tuple[str, int]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        since = int(request.url.params.get("since", "0"))
        follow = request.url.params.get("follow") == "true"
        self.asked.append(("follow" if follow else "page", since))
        if follow:
            self.streams += 1
            if self.streams == 1:
                body = "".join(json.dumps(line(i)) + "\n" for i in range(since + 1, 3))
                return httpx.Response(200, content=body.encode())
            if self.streams == 2:
                body = "".join(json.dumps(line(i)) + "\n" for i in range(since + 1, 5))
                return httpx.Response(200, stream=Broken(body.encode() + b'{"id": 5, "mach'))
            body = "".join(json.dumps(line(i)) + "\n" for i in range(since + 1, 7))
            return httpx.Response(200, content=body.encode())
        lines = [line(since + 1)] if since < 6 else []
        status = "succeeded" if since >= 5 else "running"
        page = {"lines": lines, "next_since": since + len(lines), "job_status": status}
        return httpx.Response(200, json=page)


class Broken(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that stops with a cut connection after ``data``."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield self.data
        raise httpx.RemoteProtocolError("peer closed connection")

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield self.data
        raise httpx.RemoteProtocolError("peer closed connection")


def test_a_followed_log_resumes_after_its_last_line_and_gives_each_once() -> None:
    server, said = Server(), []
    with Client(
        "http://ddpo.test", "t", transport=httpx.MockTransport(server), say=said.append
    ) as client:
        ids = [seen.id for seen in client.logs(7, follow=True)]
    assert ids == [1, 2, 3, 4, 5, 6]
    assert ("follow", 2) in server.asked or ("page", 2) in server.asked
    assert ("follow", 4) in server.asked or ("page", 4) in server.asked
    assert any("retrying until it answers" in s for s in said), said


def test_the_async_client_follows_the_same_way() -> None:
    server = Server()

    async def follow() -> list[int]:
        async with AsyncClient(
            "http://ddpo.test", "t", transport=httpx.MockTransport(server)
        ) as client:
            return [seen.id async for seen in client.logs(7, follow=True)]

    assert asyncio.run(follow()) == [1, 2, 3, 4, 5, 6]


def answering(status: int, body: Any, headers: dict[str, str] | None = None) -> Client:
    return Client(
        "http://ddpo.test",
        "t",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(status, json=body, headers=headers)
        ),
    )


@pytest.mark.parametrize(
    "status,body,kind",
    [
        (401, {"detail": "a bearer token is required"}, ddpo.Unauthorized),
        (403, {"detail": "role reader may not"}, ddpo.Forbidden),
        (404, {"detail": "job 9 not found"}, ddpo.NotFound),
        (409, {"detail": "job 9 has started"}, ddpo.Conflict),
        (413, {"detail": "too large"}, ddpo.TooLarge),
        (500, {"detail": "boom"}, ddpo.ServerError),
        (502, "bad gateway", ddpo.Unavailable),
    ],
)
def test_each_refusal_is_its_own_type_with_the_servers_words(
    status: int, body: Any, kind: type[ddpo.ApiError]
) -> None:
    with answering(status, body) as client, pytest.raises(kind) as raised:
        client.get(9)
    assert raised.value.status == status
    assert (body["detail"] if isinstance(body, dict) else body) in str(raised.value)


def test_invalid_names_every_field_and_unavailable_says_when_to_come_back() -> None:
    detail = [
        {
            "type": "greater_than_equal",
            "loc": ["body", "topology", "num_machines"],
            "msg": "topology.num_machines: Input should be >= 1",
        },
        {
            "type": "extra_forbidden",
            "loc": ["body", "epoch"],
            "msg": "epoch: Extra inputs are not permitted (did you mean epochs?)",
        },
    ]
    with answering(422, {"detail": detail}) as client, pytest.raises(ddpo.Invalid) as bad:
        client.submit(num_machines=0, epoch=1)
    assert bad.value.fields == ["topology.num_machines", "epoch"]
    refusal = {"detail": "params.hidden: 5 is not of type 'string'"}
    with answering(422, refusal) as client, pytest.raises(ddpo.Invalid) as bad:
        client.submit(params={"hidden": 5})
    assert bad.value.fields == ["params.hidden"]
    busy_server = answering(429, {"detail": "too many"}, {"Retry-After": "3"})
    with busy_server as client, pytest.raises(ddpo.Unavailable) as busy:
        client.submit()
    assert busy.value.retry_after == 3


def test_a_submit_puts_the_topology_shortcuts_in_the_topology() -> None:
    sent: list[Any] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append((json.loads(request.content), request.headers.get("idempotency-key")))
        return httpx.Response(422, json={"detail": "stop here"})

    client = Client("http://ddpo.test", "t", transport=httpx.MockTransport(server))
    with client, pytest.raises(ddpo.Invalid):
        client.submit(
            {"epochs": 2, "topology": {"num_processes": 2}},
            num_machines=3,
            idempotency_key="k1",
            lr=0.1,
        )
    assert sent == [
        ({"epochs": 2, "lr": 0.1, "topology": {"num_processes": 2, "num_machines": 3}}, "k1")
    ]


def test_importing_ddpo_for_a_training_script_does_not_import_the_client() -> None:
    import subprocess
    import sys

    probe = "import sys, ddpo; ddpo.report; print('httpx' in sys.modules)"
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == "False"


def test_a_plain_read_of_the_logs_says_at_once_that_the_server_is_away() -> None:
    """Only a follow waits a server out; ``ddpo logs 3`` with no server must
    not sit there for ten minutes."""

    def away(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with Client("http://ddpo.test", "t", transport=httpx.MockTransport(away)) as client:
        with pytest.raises(ddpo.Unavailable, match=r"cannot reach the server at http://ddpo\.test"):
            list(client.logs(3))
        with pytest.raises(ddpo.Unavailable):
            list(client.logs(3, tail=5))
