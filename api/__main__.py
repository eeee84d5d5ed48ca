"""``python -m api`` / ``ddpo-server``: run the orchestrator's REST server."""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import logging
import os
import signal
import sys
from pathlib import Path

import uvicorn
from pydantic import SecretStr, ValidationError
from sqlalchemy.engine import make_url

from api.main import create_app, redacted
from api.memory import give_large_blocks_back
from api.serving import allow_open_files, uvicorn_options
from api.settings import ServerSettings
from db import migrate
from db.engine import Database
from ddpo.local_tokens import TokenFileExposed, announce, load_or_make, withdraw


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpo-server",
        description="Run the ddpo REST server. Every flag has an environment "
        "variable (shown in brackets); flags win.",
        epilog="Tokens come from the environment only (a flag would show in ps): "
        "DDPO_ADMIN_TOKEN, DDPO_USER_TOKEN, DDPO_READ_TOKEN, DDPO_JOIN_TOKEN (workers join "
        "with it and get a credential of their own node). With none set, the server makes an "
        "admin and a join token on its first start and keeps them beside its database "
        "(DDPO_TOKEN_FILE), where ddpo and workers on this host find them; DDPO_NO_AUTH=1 "
        "serves loopback without tokens instead. DDPO_CORS_ORIGINS opens the API "
        "to pages of other origins; DDPO_MAX_BODY_KB caps request bodies; DDPO_TRUSTED_PROXIES "
        "names reverse proxies whose X-Forwarded-For the audit log believes. "
        "`ddpo-server db upgrade` brings an older database's schema up to date.",
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


def build_db_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpo-server db",
        description="The database's schema. A server refuses a database whose schema is "
        "behind its own; `upgrade` brings it up to date, keeping every row (back it up "
        "first). Stop every server using it before you upgrade.",
    )
    parser.add_argument("action", choices=["upgrade", "current"])
    parser.add_argument(
        "--database-url", help="SQLAlchemy URL [DATABASE_URL, default sqlite:///./ddpo.db]"
    )
    return parser


def db_main(argv: list[str]) -> None:
    parser = build_db_parser()
    args = parser.parse_args(argv)
    overrides = {"database_url": args.database_url} if args.database_url else {}
    url = ServerSettings(**overrides).database_url
    database = Database(url)
    try:
        if args.action == "current":
            print(f"{migrate.current(database.engine) or 'empty'} (this release: {migrate.head()})")
            return
        was, now = migrate.upgrade(database.engine)
        said = "already at" if was == now else f"upgraded from {was or 'empty'} to"
        print(f"{redacted(url)}: {said} revision {now}")
    finally:
        database.dispose()


def refuse_a_schema_behind(settings: ServerSettings, parser: argparse.ArgumentParser) -> None:
    """Before serving: a database this release cannot use stops the server
    with what to do, not with errors on every request."""
    database = Database(settings.database_url)
    try:
        migrate.prepare(database.engine)
    except migrate.SchemaMismatch as exc:
        parser.exit(2, f"ddpo-server: {redacted(settings.database_url)}: {exc}\n")
    finally:
        database.dispose()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["db"]:
        db_main(argv[1:])
        return
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
    # The database, its WAL, the token file and checkpoints hold secrets and
    # people's work: readable by the server's user alone, whatever the shell's umask.
    os.umask(0o077)
    # Before the schema check (the first large allocations): glibc's
    # threshold is fixed from the start (api/memory.py).
    give_large_blocks_back()
    refuse_a_schema_behind(settings, parser)
    settings, announced = _tokens(settings, parser)
    if settings.nice:
        os.nice(settings.nice)
    allow_open_files(settings.max_connections)
    if announced is not None:
        announce(local_url(settings), announced)
        atexit.register(withdraw, local_url(settings))
        # uvicorn shuts down on SIGTERM, then raises it again with the
        # handler it found: the default one would end the process before
        # atexit, leaving the note behind. An exit runs atexit.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
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


def _tokens(
    settings: ServerSettings, parser: argparse.ArgumentParser
) -> tuple[ServerSettings, Path | None]:
    """The settings with the tokens the server will check, and the token
    file to announce to clients on this host (when it made or kept them)."""
    log = logging.getLogger("ddpo-server")
    if settings.no_auth:
        if not is_loopback(settings.host):
            parser.exit(
                2,
                f"ddpo-server: refusing to serve on {settings.host}, which is not a loopback "
                "address, with DDPO_NO_AUTH: anyone who reaches it could run jobs on every "
                "node. Unset DDPO_NO_AUTH (the server then makes tokens), or bind 127.0.0.1.\n",
            )
        log.warning(
            "DDPO_NO_AUTH: serving without tokens; any process on this host, and any page "
            "its browsers open that gets past the Host and Origin checks, may do anything"
        )
        return settings, None
    if not settings.tokens_configured:
        try:
            settings = with_local_tokens(settings, log)
        except TokenFileExposed as exc:
            parser.exit(2, f"ddpo-server: {exc}\n")
        return settings, settings.token_file
    if settings.join_token is None:
        log.warning("tokens are set but DDPO_JOIN_TOKEN is not: no new worker can join")
    return settings, None


def with_local_tokens(settings: ServerSettings, log: logging.Logger) -> ServerSettings:
    """No tokens configured: the ones kept beside the database, made now if
    there are none yet (an admin token and a join token)."""
    path = settings.token_file or default_token_file(settings.database_url)
    tokens, made = load_or_make(path)
    log.warning(
        "no tokens configured: %s an admin token and a join token in %s (mode 0600). "
        "ddpo and workers on this host, for this user, find them there; `ddpo dashboard` "
        "prints the dashboard's link with the token; elsewhere, `source` that file. "
        "DDPO_NO_AUTH=1 serves loopback without tokens instead.",
        "made" if made else "using",
        path,
    )
    return settings.model_copy(
        update={
            "admin_token": SecretStr(tokens.admin),
            "join_token": SecretStr(tokens.join),
            "token_file": path,
        }
    )


def default_token_file(database_url: str) -> Path:
    """Beside a SQLite file (``x.db`` -> ``x-tokens.env``); else the
    working directory's ``ddpo-tokens.env``."""
    url = make_url(database_url)
    database = url.database
    if url.get_backend_name() == "sqlite" and database and database != ":memory:":
        where = Path(database).expanduser().resolve()
        return where.with_name(f"{where.stem}-tokens.env")
    return Path("ddpo-tokens.env").resolve()


def local_url(settings: ServerSettings) -> str:
    """How a client on this host reaches the server."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


if __name__ == "__main__":
    main()
