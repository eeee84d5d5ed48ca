"""A minimal HTTP/1.1 keep-alive connection for simulated nodes.

httpx's connection pool walks every connection it holds on each request:
with thousands of nodes in one process that walk, not the server, is what
a latency measures (a profile of 200 nodes showed the client's pool in
most of its samples and polls 1.7 s late). Each simulated node holds its
own two connections (one polling, one beating) as a real worker does, so
this client does a constant amount of work per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class ConnectionLost(Exception):
    """The connection closed or failed before a whole answer came back."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class KeepAliveConnection:
    """One connection to one server, opened on first use and again after it
    is lost; one request at a time."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"an http:// URL with a host is needed, not {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self._authority = f"{self.host}:{self.port}".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: Any, headers: dict[str, str]) -> Answer:
        payload = json.dumps(body).encode()
        head = [
            b"POST " + path.encode() + b" HTTP/1.1",
            b"Host: " + self._authority,
            b"Content-Type: application/json",
            b"Content-Length: " + str(len(payload)).encode(),
        ]
        head += [f"{name}: {value}".encode() for name, value in headers.items()]
        request = b"\r\n".join(head) + b"\r\n\r\n" + payload
        if self._reader is not None and self._reader.at_eof():
            await self.close()  # the server closed it while it was idle
        try:
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            assert self._reader is not None
            self._writer.write(request)
            return await self._answer(self._reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            await self.close()
            raise ConnectionLost(f"{type(e).__name__}: {e}") from e

    async def _answer(self, reader: asyncio.StreamReader) -> Answer:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        headers = {}
        for line in head[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                body += (await reader.readexactly(size + 2))[:-2]
            await reader.readuntil(b"\r\n")
        else:
            body = await reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return Answer(status, headers, body)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
