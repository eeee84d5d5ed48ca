"""``ddpo keys create | list | revoke`` and ``ddpo audit``: per-person keys
and the audit log, for admins (the admin token, or an admin's key, in
DDPO_TOKEN)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli import render
from cli.api import Api, CliError
from cli.commands import add_connection_arguments, client_for
from cli.terminal import shown
from ddpo.schemas.people import KEY_ROLES, AuditAction, AuditPublic, KeyCreated, KeysPublic


def add_keys(commands: Any) -> None:
    parser = commands.add_parser(
        "keys",
        help="per-person API keys: create, list, revoke (admins)",
        description="Per-person API keys. Each has a name and a role; what its holder "
        "submits is theirs, and the audit log names them. Admins only.",
    )
    # No action: list them, as `git remote` does.
    add_connection_arguments(parser)
    parser.set_defaults(run=run_list)
    actions = parser.add_subparsers(dest="keys_command", metavar="ACTION")
    create = actions.add_parser("create", help="make a key; its secret is printed this once")
    add_connection_arguments(create)
    create.add_argument("name", help="who it is for: lower case, digits, . _ @ -")
    create.add_argument(
        "--role",
        choices=[r.value for r in KEY_ROLES],
        default="user",
        help="admin: everything; user: submit, steer their own jobs, read; reader: read",
    )
    create.set_defaults(run=run_create)
    listing = actions.add_parser("list", help="every key, revoked ones too (never secrets)")
    add_connection_arguments(listing)
    listing.set_defaults(run=run_list)
    revoke = actions.add_parser("revoke", help="refuse a key from now on")
    add_connection_arguments(revoke)
    revoke.add_argument("key", help="the key's id or name")
    revoke.set_defaults(run=run_revoke)


def run_create(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        response = api.post(
            "/keys", f"create key {args.name!r}", json={"name": args.name, "role": args.role}
        )
    if args.json:
        print(json.dumps(response.json(), indent=2))
        return 0
    made = KeyCreated.model_validate(response.json())
    print(shown(f"key {made.id}: {made.name} ({made.role.value})"))
    print(made.key)
    print(
        "Shown this once: the server keeps only its digest. Its holder sets "
        "DDPO_TOKEN to it (or sends Authorization: Bearer ...).",
    )
    return 0


def run_list(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        data = api.get("/keys", "list keys")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(render.keys_table(KeysPublic.model_validate(data)))
    return 0


def _key_id(api: Api, given: str) -> int:
    if given.isdigit():
        return int(given)
    keys = KeysPublic.model_validate(api.get("/keys", "list keys"))
    found = next((k.id for k in keys.data if k.name == given), None)
    if found is None:
        raise CliError(f"no key is named {given!r} (ddpo keys list)")
    return found


def run_revoke(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        key_id = _key_id(api, args.key)
        response = api.post(f"/keys/{key_id}/revoke", f"revoke key {args.key}")
    if args.json:
        print(json.dumps(response.json(), indent=2))
    else:
        print(shown(f"key {key_id} ({response.json()['name']}) revoked"))
    return 0


def add_audit(commands: Any) -> None:
    parser = commands.add_parser(
        "audit",
        help="who did what, when, from where (admins)",
        description="The audit log, newest first: submissions, cancels, priority changes, "
        "node revocations and key changes. Admins only.",
    )
    add_connection_arguments(parser)
    parser.add_argument("--actor", help="only this key's name (or token:admin, token:user)")
    parser.add_argument("--action", choices=[a.value for a in AuditAction], help="only this action")
    parser.add_argument("--target", help='only what acted on this, e.g. "job 12"')
    parser.add_argument("--limit", type=int, default=50, help="at most this many")
    parser.add_argument("--before", type=int, help="only entries older than this id")
    parser.set_defaults(run=run_audit)


def run_audit(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        data = api.get(
            "/audit",
            "read the audit log",
            actor=args.actor,
            action=args.action,
            target=args.target,
            limit=args.limit,
            before=args.before,
        )
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(render.audit_table(AuditPublic.model_validate(data)))
    return 0
