"""``python -m api`` / ``ddpo-server``: run the orchestrator's REST server."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os

import uvicorn
from pydantic import ValidationError

from api.main import create_app
from api.memory import give_large_blocks_back
from api.serving import allow_open_files, uvicorn_options
from api.settings import ServerSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpo-server",
        description="Run the ddpo REST server. Every flag has an environment "
        "variable (shown in brackets); flags win.",
        epilog="Tokens come from the environment only (a flag would show in ps): "
        "DDPO_ADMIN_TOKEN, DDPO_USER_TOKEN, DDPO_READ_TOKEN, DDPO_JOIN_TOKEN (workers join "
        "with it and get a credential of their own node). With none set, the server answers "
        "anyone and refuses to bind a non-loopback address. DDPO_CORS_ORIGINS opens the API "
        "to pages of other origins; DDPO_MAX_BODY_KB caps request bodies.",
    )
    parser.add_argument("--host", help="address to bind [DDPO_HOST, default 127.0.0.1]")
    parser.add_argument("--port", type=int, help="port to bind [DDPO_PORT, default 8000]")
    parser.add_argument(
        "--database-url",
        help="SQLAlchemy URL [DATABASE_URL, default sqlite:///./ddpo.db]",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        dest="heartbeat_timeout_s",
        help="seconds of silence before a node is lost [DDPO_HEARTBEAT_TIMEOUT_S, default 6]",
    )
    parser.add_argument("--log-level", help="[DDPO_LOG_LEVEL, default info]")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = ServerSettings(**overrides)
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        parser.exit(2, f"ddpo-server: {reasons}\n")
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not settings.tokens_configured and not is_loopback(settings.host):
        parser.exit(
            2,
            f"ddpo-server: refusing to serve on {settings.host}, which is not a loopback "
            "address, without tokens: anyone who reaches it could run jobs on every node. "
            "Set DDPO_ADMIN_TOKEN (or DDPO_USER_TOKEN) and DDPO_JOIN_TOKEN, or bind "
            "127.0.0.1.\n",
        )
    if settings.tokens_configured and settings.join_token is None:
        logging.getLogger("ddpo-server").warning(
            "tokens are set but DDPO_JOIN_TOKEN is not: no new worker can join"
        )
    if settings.nice:
        os.nice(settings.nice)
    give_large_blocks_back()
    allow_open_files(settings.max_connections)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
        **uvicorn_options(settings),
        # One process: the scheduler and long-poll wake-ups live in it.
        workers=1,
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


if __name__ == "__main__":
    main()
