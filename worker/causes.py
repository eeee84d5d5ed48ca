"""Why a rank failed, from what it printed: its own doing, or only a peer
that went away first (a consequence: the server keeps looking for the
cause). Shared by the launcher, the script launcher and the daemon."""

from __future__ import annotations

from ddpo.failures import FailureReason

TRACEBACK_TAIL_CHARS = 4000

# What a rank sees when another rank of the job died first: its failure is a
# consequence, and the server keeps looking for the cause.
PEER_FAILURE_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    # gloo's other words for a peer's socket going away mid-collective
    # (libtorch_cpu's strings), and a write to it once it has.
    "Socket closed",
    "Socket unexpectedly closed",
    "Broken pipe",
    "NCCL communicator was aborted",
)


def classify(traceback_text: str) -> FailureReason:
    if "RendezvousTimeout" in traceback_text:
        return FailureReason.RENDEZVOUS_FAILED
    if any(sign in traceback_text for sign in PEER_FAILURE_SIGNS):
        return FailureReason.PEER_FAILURE
    return FailureReason.RANK_FAILED


def tail(text: str) -> str:
    return text[-TRACEBACK_TAIL_CHARS:].strip()
