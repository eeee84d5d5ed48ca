"""The failure reasons: which are retried, which only say another failure
happened, and RELIABILITY.md's table agreeing with them."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from ddpo.failures import FailureReason, Retry, names_the_cause
from ddpo.schemas import PartFinished
from tests.conftest import REPO
from worker import causes, launcher

R = FailureReason


@pytest.mark.parametrize(
    "reason,exit_code,retryable",
    [
        (R.NODE_LOST, None, True),
        (R.NODE_REVOKED, None, True),
        (R.WORKER_RESTARTED, None, True),
        (R.WORKER_SHUTDOWN, None, True),
        (R.LAUNCHER_DIED, -9, True),
        (R.RENDEZVOUS_FAILED, 1, True),
        (R.LAUNCH_FAILED, None, True),
        (R.PEER_FAILURE, 1, True),
        (R.PART_STOPPED, None, True),
        (R.RANK_EXITED, -9, True),  # killed by SIGKILL: the OOM killer, an operator
        (R.RANK_EXITED, -15, True),
        (R.RANK_EXITED, 3, False),  # the code chose to exit non-zero
        (R.RANK_EXITED, None, False),
        (R.RANK_FAILED, 1, False),  # the training code raised
        (R.PREPARE_FAILED, 1, False),  # the node's data or trainer: the same node fails again
        (R.DEADLINE, None, False),
    ],
)
def test_which_failures_are_retried(
    reason: FailureReason, exit_code: int | None, retryable: bool
) -> None:
    assert reason.is_retryable(exit_code) is retryable


def test_an_unknown_reason_is_refused_where_it_arrives() -> None:
    with pytest.raises(ValidationError, match="reason"):
        PartFinished.model_validate({"node_id": 1, "status": "failed", "reason": "something_new"})


def test_a_cause_replaces_a_symptom_and_nothing_else_replaces_a_cause() -> None:
    assert names_the_cause(R.RANK_FAILED, None)
    assert names_the_cause(R.PEER_FAILURE, None)
    assert names_the_cause(R.RANK_EXITED, R.PEER_FAILURE)
    assert not names_the_cause(R.PEER_FAILURE, R.PEER_FAILURE)
    assert not names_the_cause(R.RANK_FAILED, R.NODE_LOST)
    assert not names_the_cause(R.PEER_FAILURE, R.RANK_FAILED)


def reliability_table() -> dict[str, str]:
    """RELIABILITY.md's table of reasons: reason -> its "retried" cell."""
    text = (REPO / "RELIABILITY.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| (.+?) \| (.+?) \|$", text, re.M)
    return {reason: retried for reason, _, retried in rows}


def test_reliability_md_lists_every_reason_with_its_retry_rule() -> None:
    assert reliability_table() == {r.value: r.retry.value for r in FailureReason}


def test_the_openapi_document_lists_the_reasons() -> None:
    schema = PartFinished.model_json_schema()
    assert set(schema["$defs"]["FailureReason"]["enum"]) == {r.value for r in FailureReason}
    assert {r.retry for r in FailureReason} == set(Retry)


@pytest.mark.parametrize(
    ("printed", "reason"),
    [
        ("ValueError: shard 1 of 2 has no labels", FailureReason.RANK_FAILED),
        ("[pair.cc:534] Connection closed by peer [10.0.0.2]:41234", FailureReason.PEER_FAILURE),
        ("Read error [10.0.0.2]:41234: Connection reset by peer", FailureReason.PEER_FAILURE),
        ("DistBackendError: [pair.cc:598] Socket closed", FailureReason.PEER_FAILURE),
        ("[pair.cc:210] Socket unexpectedly closed", FailureReason.PEER_FAILURE),
        ("Write error [10.0.0.2]:41234: Broken pipe", FailureReason.PEER_FAILURE),
        ("worker.runfiles.RendezvousTimeout: no port", FailureReason.RENDEZVOUS_FAILED),
    ],
)
def test_a_ranks_traceback_says_whether_it_failed_or_only_saw_a_peer_go(
    printed: str, reason: FailureReason
) -> None:
    assert causes.classify(f"Traceback (most recent call last):\n{printed}") is reason


def test_a_peer_failure_yields_to_a_rank_of_the_same_machine_that_raised(tmp_path: Path) -> None:
    """torch's join names the first rank it saw exit; the one that raised
    (its traceback in its error file) is the part's cause."""
    files = [tmp_path / f"error-{i}" for i in range(3)]
    files[0].write_bytes(pickle.dumps("RuntimeError: [pair.cc:534] Connection closed by peer"))
    files[2].write_bytes(pickle.dumps("Traceback (most recent call last):\nValueError: rank 2"))
    ranks = SimpleNamespace(error_files=[str(f) for f in files])
    index, text = launcher._the_cause(ranks, 0, "RuntimeError: Connection closed by peer")
    assert index == 2 and "ValueError: rank 2" in text
    # A first failure that names its own cause stays the cause.
    assert launcher._the_cause(ranks, 1, "ValueError: mine")[0] == 1
