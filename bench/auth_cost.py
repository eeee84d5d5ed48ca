"""What checking a token costs a request: the server's outer layers (the
authentication middleware and the body cap) around an app that does
nothing, called in this process on ``GET /jobs/{id}`` with a read token,
with a reader's own key (100 people's keys loaded), and with no tokens
configured, alternated.

    python -m bench.auth_cost --rounds 5

Prints microseconds per request for each, and the differences: what every
dashboard poll pays for its token or key.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time

from pydantic import SecretStr
from starlette.types import Receive, Scope, Send

from api.auth import AuthMiddleware, NodeCredentials, Role, TokenBook
from api.credentials import ApiKeys, KeyHolder, digest
from api.limits import BodyLimitMiddleware

CALLS = 20_000


async def _nothing(scope: Scope, receive: Receive, send: Send) -> None:
    return None


def _layers(book: TokenBook) -> AuthMiddleware:
    capped = BodyLimitMiddleware(_nothing, lambda method, path: (16 * 2**20, "DDPO_MAX_BODY_KB"))
    return AuthMiddleware(capped, book)


async def _per_call_us(app: AuthMiddleware, token: str) -> float:
    headers = [(b"host", b"server"), (b"authorization", f"Bearer {token}".encode())]
    started = time.perf_counter()
    for _ in range(CALLS):
        scope = {"type": "http", "method": "GET", "path": "/jobs/17", "headers": headers}
        await app(scope, _never, _never)  # type: ignore[arg-type]
    return (time.perf_counter() - started) / CALLS * 1e6


async def _never(*_: object) -> None:
    raise AssertionError("the app under test neither receives nor sends")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    tokens = {
        role: SecretStr(secrets.token_urlsafe(32))
        for role in (Role.ADMIN, Role.USER, Role.READER, Role.JOIN)
    }
    read = tokens[Role.READER].get_secret_value()
    nodes = NodeCredentials()
    nodes.load([(i, secrets.token_hex(32)) for i in range(1, 101)])  # 100 nodes joined
    people = [secrets.token_urlsafe(32) for _ in range(100)]  # 100 people's keys
    keys = ApiKeys()
    keys.load(
        [(digest(k), KeyHolder(i, f"person-{i}", Role.READER)) for i, k in enumerate(people, 1)]
    )
    checked, open_ = _layers(TokenBook(tokens, nodes, keys)), _layers(TokenBook({}, nodes))
    with_tokens: list[float] = []
    with_keys: list[float] = []
    without: list[float] = []
    for _ in range(args.rounds):
        with_tokens.append(asyncio.run(_per_call_us(checked, read)))
        with_keys.append(asyncio.run(_per_call_us(checked, people[-1])))
        without.append(asyncio.run(_per_call_us(open_, read)))
    on, key, off = (statistics.median(t) for t in (with_tokens, with_keys, without))
    print(f"a role token:   {on:.1f} us a request (median of {args.rounds} x {CALLS})")
    print(f"a person's key: {key:.1f} us a request")
    print(f"no tokens:      {off:.1f} us a request")
    print(f"a token costs:  {on - off:.1f} us a request; a key {key - off:.1f} us")


if __name__ == "__main__":
    main()
