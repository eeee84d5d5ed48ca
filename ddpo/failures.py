"""Why a part or a job failed: one type for every reason, made on the worker
(the launcher, a part, the daemon) or on the server (a lost node, a
deadline), and read by the retry policy, the wire schemas (so the OpenAPI
document lists them) and RELIABILITY.md (a test checks its table against
this one). Pure: no I/O, imported by the worker too."""

from __future__ import annotations

from ddpo.lifecycle import Named


class Retry(Named):
    """Whether a new attempt may fix a failure."""

    YES = "yes"
    NO = "no"
    ON_SIGNAL = "if killed by a signal"


class FailureReason(Named):
    """A failure's cause, with whether a retry may help and what it means.

    Failures of the machinery (a node, a daemon, a launcher, the network) are
    retried: the same code elsewhere or a moment later may well succeed.
    Failures of the training code or its inputs are not: they would happen
    again. ``peer_failure`` is a symptom: a rank saw a collective break
    because another process went away, and a report naming the cause
    replaces it when one arrives.
    """

    summary: str
    retry: Retry

    def __new__(cls, value: str, retry: Retry, summary: str) -> FailureReason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.retry = retry
        member.summary = summary
        return member

    RANK_FAILED = ("rank_failed", Retry.NO, "a rank's training code raised")
    RANK_EXITED = (
        "rank_exited",
        Retry.ON_SIGNAL,
        "a rank exited non-zero on its own, or was killed by a signal (the OOM killer, kill -9)",
    )
    PEER_FAILURE = (
        "peer_failure",
        Retry.YES,
        "a collective broke because another process went away (a symptom: the cause, "
        "when it is reported, replaces it)",
    )
    RENDEZVOUS_FAILED = (
        "rendezvous_failed",
        Retry.YES,
        "the ranks could not meet (a port taken, a slow peer)",
    )
    PREPARE_FAILED = (
        "prepare_failed",
        Retry.NO,
        "the node could not prepare the training (its data missing or unreadable, the "
        "trainer not importable): the same node would fail the same way, so it is fixed "
        "on the node, not retried",
    )
    LAUNCH_FAILED = (
        "launch_failed",
        Retry.YES,
        "the worker could not start the part's processes (resources, a port)",
    )
    LAUNCHER_DIED = (
        "launcher_died",
        Retry.YES,
        "the process holding the part's ranks was killed",
    )
    WORKER_SHUTDOWN = (
        "worker_shutdown",
        Retry.YES,
        "the worker daemon was stopped while the part ran",
    )
    WORKER_RESTARTED = (
        "worker_restarted",
        Retry.YES,
        "the worker daemon came back without the part's processes",
    )
    NODE_LOST = ("node_lost", Retry.YES, "the node was silent for longer than the timeout")
    NODE_REVOKED = ("node_revoked", Retry.YES, "an admin revoked the node's credential")
    PART_STOPPED = (
        "part_stopped",
        Retry.YES,
        "a part ended without being asked to and without saying why",
    )
    DEADLINE = ("deadline", Retry.NO, "the job ran past its max_run_seconds")

    def is_retryable(self, exit_code: int | None) -> bool:
        """Whether a new attempt may succeed where this one failed. A rank
        killed by a signal may; a rank that exited non-zero itself would do
        it again."""
        if self.retry is Retry.ON_SIGNAL:
            return exit_code is not None and exit_code < 0
        return self.retry is Retry.YES

    @property
    def is_symptom(self) -> bool:
        """A failure that only says another one happened."""
        return self is FailureReason.PEER_FAILURE


def names_the_cause(new: FailureReason, current: FailureReason | None) -> bool:
    """Whether a failure heard of now should replace the one on record: the
    first one does, and later ones only where the record is a symptom and
    the new one is not."""
    if current is None:
        return True
    return current.is_symptom and not new.is_symptom
