"""How a machine becomes a node: what it offers, and the credential it
registers with (its own, kept from an earlier run, or the join token)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from pydantic import SecretStr

from ddpo import local_tokens
from ddpo.schemas import NodeRegistered, NodeRegistration
from worker import credentials
from worker.client import CredentialRefused, Refused, ServerClient, server_urls
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class CannotJoin(RuntimeError):
    """The server refused this node for good (revoked, name taken, bad token)."""


def count_gpus() -> int:
    """GPUs this node can offer, without importing torch into the daemon."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def _made_join_token(server_url: str) -> SecretStr | None:
    """The join token a server on this host made for itself (it was started
    without tokens), if this user may read it."""
    made = local_tokens.tokens_for(server_url)
    if made is None:
        return None
    log.info("joining with the join token the server on this host made for itself")
    return SecretStr(made.join)


def join(
    client: ServerClient, settings: WorkerSettings, registration: NodeRegistration
) -> NodeRegistered:
    """Register with the node's saved credential if this machine has one
    (a restart takes its node back), else with the join token; keep the
    credential the server hands out. Raises ServerUnavailable (try again)
    or CannotJoin (for good)."""
    path = settings.credential_path
    if settings.credential_file is None:
        credentials.move_from(settings.legacy_credential_path, path)
    saved = credentials.load(path)
    registered = None
    if saved is not None:
        try:
            registered = client.register(registration, saved)
            client.credential = saved
        except CredentialRefused:
            log.warning(
                "the server does not know the credential in %s (revoked, or a new "
                "database); joining with the join token",
                path,
            )
        except Refused as exc:
            raise CannotJoin(str(exc)) from None
    if registered is None:
        token = settings.join_token or _made_join_token(server_urls(settings.server_url)[0])
        try:
            registered = client.register(registration, token.get_secret_value() if token else None)
        except Refused as exc:
            hint = "" if token else " (DDPO_JOIN_TOKEN is not set)"
            raise CannotJoin(f"{exc}{hint}") from None
    if registered.credential is not None:
        credentials.save(path, registered.credential)
        client.credential = registered.credential
    return registered
