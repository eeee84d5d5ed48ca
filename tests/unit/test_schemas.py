from __future__ import annotations

import pytest
from pydantic import ValidationError

from ddpo.schemas import MAX_WORLD_SIZE, JobSpec
from ddpo.schemas.protocol import LogBatch, PollRequest


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


def test_a_fields_json_type_is_judged_for_every_value_in_a_batch() -> None:
    """What a field takes is worked out once per field and JSON type
    (ddpo/schemas/strict.py): a later line of another type is still judged,
    each mistake named at its own line."""
    at = "2026-01-01T00:00:00Z"
    good = [{"rank": 0, "offset": 0, "text": "fine", "at": at}]
    wrong: list[tuple[str, object, str]] = [
        ("rank", True, "a boolean where the schema wants an integer"),
        ("rank", "0", "a string where the schema wants an integer"),
        ("offset", [1], "an array where the schema wants an integer"),
        ("at", 1767225600, "an integer where the schema wants a date-time string"),
    ]
    for _ in range(2):  # the second time, the field's answers are remembered
        lines = good + [
            {**good[0], "offset": i + 1, field: value} for i, (field, value, _) in enumerate(wrong)
        ]
        with pytest.raises(ValidationError) as info:
            LogBatch.model_validate({"node_id": 1, "lines": lines})
        said = [(e["loc"], e["msg"]) for e in info.value.errors()]
        assert said == [
            (("lines", i + 1, field), f"Value error, {message}")
            for i, (field, _, message) in enumerate(wrong)
        ]
        assert LogBatch.model_validate({"node_id": 1, "lines": good * 3}).lines[0].rank == 0


def test_an_arrays_items_are_judged_whatever_arrays_came_before() -> None:
    """An array's answer is remembered by the types of its items (every idle
    node's poll sends two): an array with an item of another type, or an
    array in it, is still judged after empty ones and good ones."""
    for _ in range(2):
        for fine in ([], [1, 2], [3]):
            assert PollRequest.model_validate({"active_part_ids": fine}).active_part_ids == fine
        for wrong in ([1, True], [1, "2"], [[1]], [1.0, [2]]):
            with pytest.raises(ValidationError) as info:
                PollRequest.model_validate({"active_part_ids": wrong})
            (error,) = info.value.errors()
            assert error["loc"] == ("active_part_ids",)
            assert error["msg"] == "Value error, an array where the schema wants an array"
