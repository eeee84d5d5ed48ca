"""Reports from workers about the parts they run."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CoordinatorDep, NotifierDep, PartId
from api.schemas import Ack, PartFinished, PartStarted, ProgressBatch, RendezvousBound

router = APIRouter(prefix="/parts", tags=["worker protocol"])


@router.post("/{part_id}/started", response_model=Ack)
def part_started(part_id: PartId, body: PartStarted, coordinator: CoordinatorDep) -> Ack:
    """``accepted: false`` tells the worker the part should not run (it was
    cancelled meanwhile); the next poll lists it under ``stop``."""
    return Ack(accepted=coordinator.part_started(part_id, body.node_id))


@router.post("/{part_id}/rendezvous", response_model=Ack)
def part_rendezvous(
    part_id: PartId, body: RendezvousBound, coordinator: CoordinatorDep, notifier: NotifierDep
) -> Ack:
    """Machine 0 reports the port its launcher's rendezvous store listens on."""
    accepted = coordinator.record_rendezvous(part_id, body)
    notifier.notify()
    return Ack(accepted=accepted)


@router.post("/{part_id}/progress", response_model=Ack)
def part_progress(part_id: PartId, body: ProgressBatch, coordinator: CoordinatorDep) -> Ack:
    return Ack(accepted=coordinator.record_progress(part_id, body))


@router.post("/{part_id}/finish", response_model=Ack)
def part_finished(
    part_id: PartId, body: PartFinished, coordinator: CoordinatorDep, notifier: NotifierDep
) -> Ack:
    accepted = coordinator.finish_part(part_id, body)
    notifier.notify()
    return Ack(accepted=accepted)
