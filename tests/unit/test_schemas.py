from __future__ import annotations

import pytest
from pydantic import ValidationError

from ddpo.schemas import MAX_WORLD_SIZE, JobSpec


def locs(exc: ValidationError) -> list[tuple[object, ...]]:
    return [tuple(e["loc"]) for e in exc.errors()]


def test_an_empty_spec_is_the_recipe_default() -> None:
    spec = JobSpec.model_validate({})
    assert (spec.topology.num_machines, spec.topology.num_processes) == (1, 1)
    assert (spec.backend, spec.batch_size, spec.epochs, spec.lr) == ("gloo", 128, 1, 0.5)


@pytest.mark.parametrize(
    "body,loc",
    [
        ({"topology": {"num_machines": 0}}, ("topology", "num_machines")),
        ({"topology": {"num_processes": -1}}, ("topology", "num_processes")),
        ({"batch_size": 0}, ("batch_size",)),
        ({"epochs": 0}, ("epochs",)),
        ({"lr": 0}, ("lr",)),
        ({"lr": "nan"}, ("lr",)),
        ({"backend": "mpi"}, ("backend",)),
        ({"trainer": "../../etc/passwd"}, ("trainer",)),
        ({"max_steps_per_epoch": 0}, ("max_steps_per_epoch",)),
        ({"surprise": 1}, ("surprise",)),
        ({"topology": {"num_machines": 1, "gpus": 2}}, ("topology", "gpus")),
    ],
)
def test_bad_fields_are_named(body: dict[str, object], loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(body)
    assert loc in locs(info.value)


def test_world_size_is_bounded() -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({"topology": {"num_machines": 64, "num_processes": 64}})
    assert ("topology",) in locs(info.value)
    assert str(MAX_WORLD_SIZE) in str(info.value)
