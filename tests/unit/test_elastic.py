"""Elastic sizing (api/elastic.py): where a job of a range of machines
starts, what it shrinks to when a node is lost, when it grows and to what,
and where a resized run picks its epoch up."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

from api.elastic import Size, Waiting, after_loss, grow_to, spare, start_size
from api.scheduling import Pending, Placement, place_gang
from ddpo.lifecycle import PendingCode
from ddpo.schemas import JobSpec
from tests.unit.test_scheduling import node
from worker import checkpoints
from worker.checkpoints import resumed_batches

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
ONE_TO_THREE = Size(1, 3)


@pytest.mark.parametrize(
    "size,free,expected",
    [
        (ONE_TO_THREE, 0, None),  # waits
        (ONE_TO_THREE, 1, 1),
        (ONE_TO_THREE, 3, 3),
        (ONE_TO_THREE, 7, 3),  # never beyond max
        (Size(2, 4), 1, None),  # below min: it waits for a second
        (Size(2, 2), 2, 2),  # min = max: a job of one size
    ],
)
def test_an_elastic_job_starts_on_what_is_free_between_min_and_max(
    size: Size, free: int, expected: int | None
) -> None:
    assert start_size(size, free) == expected


def test_a_lost_node_shrinks_the_job_to_its_survivors_down_to_min() -> None:
    assert after_loss(ONE_TO_THREE, running=3, lost=1) == 2
    assert after_loss(ONE_TO_THREE, running=2, lost=1) == 1
    assert after_loss(ONE_TO_THREE, running=1, lost=1) is None  # none left
    assert after_loss(Size(2, 4), running=3, lost=2) is None  # one left, below min


def test_growth_leaves_the_nodes_queued_jobs_of_its_priority_or_higher_need() -> None:
    waiting = [Waiting(priority=5, machines=2), Waiting(priority=0, machines=1)]
    assert spare(free_suitable=4, waiting=waiting, priority=0) == 1  # both come first
    assert spare(free_suitable=4, waiting=waiting, priority=5) == 2  # the priority-5 one
    assert spare(free_suitable=4, waiting=waiting, priority=6) == 4  # neither: lower
    assert spare(free_suitable=1, waiting=waiting, priority=0) == 0


def grown(running: int, spare_nodes: int, resized_s_ago: float | None = None) -> int | None:
    last = None if resized_s_ago is None else NOW - timedelta(seconds=resized_s_ago)
    return grow_to(ONE_TO_THREE, running, spare_nodes, last, NOW, interval_s=300)


def test_a_job_grows_up_to_max_at_most_once_per_interval() -> None:
    assert grown(2, spare_nodes=1, resized_s_ago=600) == 3
    assert grown(1, spare_nodes=5) == 3  # never beyond max
    assert grown(3, spare_nodes=2) is None  # at max already
    assert grown(2, spare_nodes=0) is None
    assert grown(2, spare_nodes=1, resized_s_ago=60) is None  # resized a minute ago


def test_a_resized_run_picks_its_epoch_up_where_its_samples_left_off() -> None:
    # 30 batches of 3 machines' global batch = 45 of 2 machines'.
    assert resumed_batches(30, old_world=3, new_world=2) == 45
    # 45 of 2 machines' = 30 of 3; 31 of 2 = 20.67 of 3: rounded down, none skipped.
    assert resumed_batches(45, old_world=2, new_world=3) == 30
    assert resumed_batches(31, old_world=2, new_world=3) == 20
    assert resumed_batches(0, old_world=1, new_world=3) == 0
    with pytest.raises(ValueError):
        resumed_batches(5, old_world=0, new_world=2)


def test_a_size_is_a_range_from_one() -> None:
    for low, high in ((0, 2), (3, 2)):
        with pytest.raises(ValueError, match="min <= max"):
            Size(low, high)


def saved_by(tmp_path: Path, machines: int, batches_done: int, epoch_loss: float) -> Path:
    spec = JobSpec.model_validate({"topology": {"num_machines": machines}})
    model = torch.nn.Linear(2, 1)
    return checkpoints.save(
        tmp_path,
        model=model,
        optimizer=torch.optim.Adadelta(model.parameters()),
        epoch=2,
        step=100 + batches_done,
        spec=spec,
        batches_done=batches_done,
        epoch_loss=epoch_loss,
    )


def test_a_checkpoint_resumed_by_another_world_size_maps_its_place_in_the_epoch(
    tmp_path: Path,
) -> None:
    path = saved_by(tmp_path, machines=3, batches_done=30, epoch_loss=6.0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adadelta(model.parameters())
    same = checkpoints.resume(path, model, optimizer, world_size=3)
    assert (same.epoch, same.batches_done, same.epoch_loss) == (2, 30, 6.0)
    fewer = checkpoints.resume(path, model, optimizer, world_size=2)
    # 45 batches of 2 ranks: the same samples; the mean loss per batch kept.
    assert (fewer.epoch, fewer.batches_done, fewer.epoch_loss) == (2, 45, 9.0)


def test_only_the_newest_checkpoint_is_kept_in_the_run_directory(tmp_path: Path) -> None:
    saved_by(tmp_path, machines=1, batches_done=20, epoch_loss=1.0)
    newest = saved_by(tmp_path, machines=1, batches_done=40, epoch_loss=2.0)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [newest.name]


@pytest.mark.parametrize(
    "free,placed",
    [(4, 3), (2, 2), (1, None)],
    ids=["more than max", "between", "below min"],
)
def test_placement_takes_every_free_node_up_to_max(free: int, placed: int | None) -> None:
    ranged = JobSpec.model_validate({"topology": {"num_machines": {"min": 2, "max": 3}}})
    nodes = [node(i) for i in range(1, free + 1)] + [node(9, free=0)]
    decision = place_gang(ranged, nodes)
    if placed is None:
        assert isinstance(decision, Pending) and decision.code is PendingCode.WAITING_FOR_SLOTS
        assert decision.nodes_needed == 2
    else:
        assert isinstance(decision, Placement) and len(decision.node_ids) == placed
        assert 9 not in decision.node_ids
