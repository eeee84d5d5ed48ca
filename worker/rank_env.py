"""What a rank's environment holds: an allow-list, not the daemon's whole
environment. A job's code (a script, any package it imports) runs in the
ranks; the daemon's environment holds the node's secrets (DDPO_JOIN_TOKEN
enrols new nodes), and a script that prints its environment would show
them to every reader of the job's logs.

A rank gets what Python, the C libraries, torch and its collectives read
(the names and prefixes below), what the launcher sets for it (torchrun's
variables, DDPO_RUN_DIR and the like), and the names the worker's
DDPO_RANK_ENV adds (a W&B key, a proxy of the site's own). Nothing else of
the daemon's, and no DDPO_ variable at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ddpo.schemas import Assignment

NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "PWD",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONDONTWRITEBYTECODE",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
    }
)
PREFIXES = (
    "LC_",
    "XDG_",
    # torch and the libraries under it: threads, allocators, kernels, devices.
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "GOTO_",
    "MALLOC_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "CUDA_",
    "CUDNN_",
    "NVIDIA_",
    "NCCL_",
    "GLOO_",
    "TP_",
    "HIP_",
    "ROCR_",
    "HSA_",
)
# The worker's own variables never reach a rank, whatever DDPO_RANK_ENV says:
# the launcher sets the few a rank needs (ddpo.RUN_DIR_ENV and the like).
NEVER = "DDPO_"


def allowed(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a variable of this name passes to the ranks. ``extra``: names,
    or prefixes ending in ``*``."""
    if name.startswith(NEVER):
        return False
    if name in NAMES or name.startswith(PREFIXES):
        return True
    return any(name.startswith(e[:-1]) if e.endswith("*") else name == e for e in extra)


def for_ranks(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The part of ``environ`` a rank may see."""
    extra = tuple(extra)
    return {name: value for name, value in environ.items() if allowed(name, extra)}


def tracking(assignment: Assignment) -> dict[str, str]:
    """MLflow's variables for the job's run (``assignment.tracking``): a
    script's own ``mlflow.log_metric`` (and Lightning's or Hugging Face's
    MLflow loggers) land in the run the server writes the reports to."""
    run = assignment.tracking
    if run is None or run.tracking_uri is None or run.run_id is None:
        return {}
    return {"MLFLOW_TRACKING_URI": run.tracking_uri, "MLFLOW_RUN_ID": run.run_id}
