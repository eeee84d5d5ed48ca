"""``python -m worker`` / ``ddpo-worker``: the node daemon."""

from __future__ import annotations

import argparse
import logging
import sys

from worker import cores
from worker.daemon import Worker
from worker.settings import WorkerSettings


def _trainer(value: str) -> tuple[str, str]:
    name, sep, target = value.partition("=")
    if not sep or ":" not in target:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=module:attribute")
    return name, target


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpo-worker",
        description="Run a ddpo node: register with the server, take job parts, "
        "run their DDP ranks (torch.multiprocessing, launchers forked from a fork "
        "server that imported torch once), report back. "
        "Every flag has an environment variable (in brackets); flags win.",
    )
    parser.add_argument(
        "--server",
        dest="server_url",
        help="server URL, or several servers on one database, comma-separated: the "
        "worker moves to the next when one cannot be reached "
        "[DDPO_SERVER_URL, default http://127.0.0.1:8000]",
    )
    parser.add_argument(
        "--name",
        help="unique node name [DDPO_WORKER_NAME, default: SLURMD_NODENAME in a Slurm "
        "job, else the host name]",
    )
    _add_network_arguments(parser)
    _add_capacity_arguments(parser)
    parser.add_argument(
        "--data-dir", dest="data_dir", help="datasets directory [DDPO_DATA_DIR, default ./data]"
    )
    parser.add_argument(
        "--work-dir",
        dest="work_dir",
        help="run directories, logs and the node's credential "
        "[DDPO_WORKER_WORK_DIR, default ./runs/NAME: one per node name]",
    )
    parser.add_argument(
        "--trainer",
        action="append",
        type=_trainer,
        dest="trainers",
        metavar="NAME=module:attribute",
        help="offer an extra installed trainer (repeatable) [DDPO_WORKER_TRAINERS, a JSON object]",
    )
    parser.add_argument(
        "--script-dir",
        dest="script_dir",
        help="let jobs run the torchrun-style scripts in this directory (read when the worker "
        "starts) [DDPO_SCRIPT_DIR, default: none]",
    )
    parser.add_argument("--log-level", default="INFO")
    parser.epilog = (
        "Secrets come from the environment only: DDPO_JOIN_TOKEN lets a new node join "
        "(the server's own). The node's credential the server hands out is kept in "
        "<work-dir>.node-credential [DDPO_WORKER_CREDENTIAL_FILE]; a restarted worker "
        "takes its node back with it. Exits 3 if the server refuses the node for good "
        "(revoked, name taken); exits 2 if --address is on none of this host's "
        "interfaces."
    )
    return parser


def _add_network_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        help="address other nodes reach this one at; used as MASTER_ADDR when "
        "this node runs machine 0, and the ranks' collectives use the interface that "
        "holds it [DDPO_WORKER_ADDRESS, default: the local address of the route to "
        "the server, 127.0.0.1 when the server is on loopback]",
    )
    parser.add_argument(
        "--interface",
        help="network interface for the ranks' collectives (sets GLOO_SOCKET_IFNAME, "
        "NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME unless already set) "
        "[DDPO_WORKER_INTERFACE, default: the one holding --address]",
    )


def _add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpus",
        type=int,
        help="cores this node's ranks share (threads per rank = cpus // processes) "
        "[DDPO_WORKER_CPUS, default: SLURM_CPUS_ON_NODE in a Slurm job, else the affinity "
        "mask and the cgroup CPU quota]",
    )
    parser.add_argument(
        "--cpu-set",
        dest="cpu_set",
        metavar="LIST",
        help="run this worker and its ranks on these CPUs only (0-3,6), e.g. its share of a "
        "host other workers share; --cpus defaults to their number [DDPO_WORKER_CPU_SET]",
    )
    parser.add_argument(
        "--slots", type=int, help="job parts run at once [DDPO_WORKER_SLOTS, default 1]"
    )
    parser.add_argument(
        "--gpus",
        type=int,
        help="GPUs offered [DDPO_WORKER_GPUS, default: SLURM_GPUS_ON_NODE in a Slurm "
        "job, else counted]",
    )
    parser.add_argument(
        "--rank-env",
        metavar="NAMES",
        help="variables the ranks get besides the allow-list (PATH, PYTHONPATH, CUDA_*, "
        "NCCL_*, OMP_* ...): comma-separated names or PREFIX* [DDPO_WORKER_RANK_ENV]; no "
        "DDPO_ variable ever reaches a rank",
    )


def parse_settings(argv: list[str] | None = None) -> WorkerSettings:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per request would drown the state changes.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    overrides = {
        k: v for k, v in vars(args).items() if v is not None and k not in ("log_level", "trainers")
    }
    settings = WorkerSettings(**overrides)
    if args.trainers:
        settings = settings.model_copy(
            update={"trainers": {**settings.trainers, **dict(args.trainers)}}
        )
        WorkerSettings.model_validate(settings.model_dump())
    return settings


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    if settings.cpus_pinned is not None:
        # Before anything starts: the fork server and every rank inherit it,
        # and the node's cores are counted from it.
        try:
            cores.pin(settings.cpus_pinned)
        except ValueError as exc:
            sys.exit(f"ddpo-worker: --cpu-set: {exc}")
    sys.exit(Worker(settings).run())


if __name__ == "__main__":
    main()
