"""What the live nodes offer (trainers with their parameter schemas, scripts
with their content hashes), and a job spec checked against it at submit:
a parameter its trainer refuses is a 422 now, not a crash on a node later."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlmodel import Session

from api.core.errors import InvalidFields
from db import queries
from db.engine import memoized
from db.models import Node
from ddpo.schemas import JobSpec, params_schema
from ddpo.schemas.public import ScriptPublic, TrainerPublic, TrainersPublic

log = logging.getLogger(__name__)

# A submit reports this many refused parameters at most.
MAX_REPORTED_ERRORS = 20


@dataclass
class _Variant:
    """One (name, version, schema) of a trainer and the nodes that have it."""

    name: str
    version: str
    params_schema: dict[str, Any] | None
    nodes: list[str] = field(default_factory=list)


def _trainer_variants(session: Session) -> list[_Variant]:
    return memoized(session, "trainer_variants", (Node,), lambda: _read_trainer_variants(session))


def _read_trainer_variants(session: Session) -> list[_Variant]:
    variants: dict[tuple[str, str, str], _Variant] = {}
    for node, offers, _scripts in queries.live_node_offers(session=session):
        for offer in offers:
            schema = offer.get("params_schema")
            key = (offer["name"], offer.get("version", "0"), json.dumps(schema, sort_keys=True))
            if schema is not None and not _safe(key[2]):
                continue  # kept before schemas were checked at registration
            variant = variants.setdefault(
                key, _Variant(offer["name"], offer.get("version", "0"), schema)
            )
            variant.nodes.append(node)
    return sorted(variants.values(), key=lambda v: (v.name, v.version))


@lru_cache(maxsize=1024)
def _safe(schema_json: str) -> bool:
    """Once per distinct schema: the nodes' rows are read again whenever the
    node table changes (heartbeat times included), and most share a schema."""
    try:
        params_schema.check(json.loads(schema_json))
    except params_schema.SchemaRefused as exc:
        log.warning("a node's schema kept from before it was checked is refused: %s", exc)
        return False
    return True


def _script_hashes(session: Session) -> dict[tuple[str, str], list[str]]:
    """(path, sha256) -> the live nodes that have that content at that path."""
    found: dict[tuple[str, str], list[str]] = {}
    for node, _offers, scripts in queries.live_node_offers(session=session):
        for path, sha256 in scripts.items():
            found.setdefault((path, sha256), []).append(node)
    return found


def offered(session: Session) -> TrainersPublic:
    return TrainersPublic(
        trainers=[
            TrainerPublic(
                name=v.name, version=v.version, params_schema=v.params_schema, nodes=sorted(v.nodes)
            )
            for v in _trainer_variants(session)
        ],
        scripts=[
            ScriptPublic(path=path, sha256=sha256, nodes=sorted(nodes))
            for (path, sha256), nodes in sorted(_script_hashes(session).items())
        ],
    )


def checked(session: Session, spec: JobSpec) -> JobSpec:
    """The spec as it will be stored: its params valid for its trainer as the
    live nodes declare it, its script pinned to the content they have.

    The params must satisfy every schema the live nodes declare for the
    trainer (for ``trainer_version`` alone, when the job names one); a node
    that declares none takes any params. So one node can make a submit
    stricter, never looser: a node offering a permissive "version 0" does
    not let through what the others refuse.

    A trainer or script no live node has yet is let through: the job waits,
    queued, with a pending reason naming it (GET /jobs/{id}).

    Run it outside the write transaction: it takes CPU, never I/O, and no
    other write should wait for it."""
    if spec.script is not None:
        return _pinned(session, spec)
    variants = [
        v
        for v in _trainer_variants(session)
        if v.name == spec.trainer and spec.trainer_version in (None, v.version)
    ]
    declared = [v for v in variants if v.params_schema is not None]
    for variant in declared:
        assert variant.params_schema is not None
        errors = _refusals(variant.params_schema, spec.params)
        if errors and len(declared) > 1:
            whose = f" (version {variant.version!r} on {', '.join(variant.nodes)})"
            errors = [(loc, msg + whose) for loc, msg in errors]
        if errors:
            raise InvalidFields(errors[:MAX_REPORTED_ERRORS])
    return spec


def _refusals(schema: dict[str, Any], params: dict[str, Any]) -> list[tuple[list[str | int], str]]:
    """Each reason the schema refuses ``params``, under the parameter's own
    name (``params.hidden``), not under the object that holds it."""
    found: dict[tuple[str | int, ...], str] = {}
    for error in params_schema.validator_for(schema).iter_errors(params):
        at: tuple[str | int, ...] = ("params", *error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = set((error.schema or {}).get("properties", {}))
            for name in set(error.instance) - known:
                found[(*at, name)] = "not a parameter of this trainer"
        elif error.validator == "required" and isinstance(error.instance, dict):
            for name in error.validator_value:
                if name not in error.instance:
                    found[(*at, name)] = "required"
        else:
            found.setdefault(at, error.message)
    return [(list(loc), msg) for loc, msg in sorted(found.items(), key=lambda kv: str(kv[0]))]


def _pinned(session: Session, spec: JobSpec) -> JobSpec:
    assert spec.script is not None
    if spec.script.sha256 is not None:
        return spec
    holders = {
        sha256: nodes
        for (path, sha256), nodes in _script_hashes(session).items()
        if path == spec.script.path
    }
    if len(holders) > 1:
        versions = "; ".join(
            f"{sha256[:12]} on {', '.join(nodes)}" for sha256, nodes in sorted(holders.items())
        )
        raise InvalidFields(
            [
                (
                    ["script", "path"],
                    f"'{spec.script.path}' differs between the live nodes ({versions}): "
                    "make them the same, or choose one with script.sha256",
                )
            ]
        )
    if not holders:
        return spec
    (sha256,) = holders
    return spec.model_copy(update={"script": spec.script.model_copy(update={"sha256": sha256})})
