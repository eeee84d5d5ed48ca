"""Job spec flags, and following a job until it ends."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import TextIO

from cli import render
from cli.api import Api, riding_out_restarts
from ddpo.schemas import JobPublic, JobSpec


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = JobSpec()
    group = parser.add_argument_group("job spec (README, 'The job spec')")
    group.add_argument("--name", help="a label for the job")
    group.add_argument(
        "--trainer", default=defaults.trainer, help="a trainer the workers offer (ddpo trainers)"
    )
    group.add_argument(
        "--param",
        action="append",
        type=_param,
        default=[],
        metavar="NAME=VALUE",
        help="one of the trainer's params (repeatable; VALUE is read as JSON, else as a string)",
    )
    group.add_argument(
        "--params", type=_json_object, default=None, metavar="JSON", help="the trainer's params"
    )
    group.add_argument(
        "--script",
        metavar="PATH",
        help="run this torchrun-style script from the workers' --script-dir instead of a trainer",
    )
    group.add_argument(
        "--script-args",
        type=shlex.split,
        default=[],
        metavar="'ARGS'",
        help="the script's arguments, as one shell-quoted string: --script-args '--epochs 3'",
    )
    group.add_argument(
        "--machines",
        type=_machines,
        default=defaults.topology.num_machines,
        metavar="N|MIN:MAX",
        help="num_machines: nodes the job spans; MIN:MAX makes it elastic (it starts on as "
        "many as are free, shrinks past a lost node, grows onto free ones)",
    )
    group.add_argument(
        "--processes",
        type=int,
        default=defaults.topology.num_processes,
        help="num_processes: training processes per machine",
    )
    group.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=defaults.backend,
        help="gloo (CPU) or nccl (a GPU per process)",
    )
    group.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="batch size per process"
    )
    group.add_argument("--epochs", type=int, default=defaults.epochs, help="epochs to train")
    group.add_argument("--lr", type=float, default=defaults.lr, help="Adadelta learning rate")
    group.add_argument(
        "--seed", type=int, default=defaults.seed, help="model init and sampler shuffling"
    )
    group.add_argument(
        "--max-steps-per-epoch", type=int, default=None, help="cut epochs short (smoke runs)"
    )
    group.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="STEPS",
        help="checkpoint_every_steps: also checkpoint within epochs, so a lost node costs at "
        "most this many steps",
    )
    group.add_argument(
        "--max-restarts",
        type=int,
        default=defaults.max_restarts,
        help="new attempts after a retryable failure, each from the last checkpoint",
    )
    group.add_argument(
        "--priority",
        type=int,
        default=defaults.priority,
        help="queued jobs of a higher priority start first (-1000 to 1000); "
        "change it later with `ddpo priority`",
    )
    group.add_argument(
        "--max-run-seconds",
        type=float,
        default=None,
        help="fail with reason deadline this long after the first start",
    )
    group.add_argument(
        "--not-preemptible",
        action="store_true",
        help="never stopped for a job of a higher priority once started",
    )
    group.add_argument(
        "--stop-grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="when asked to stop (preempted, drained), how long to reach a step and "
        "checkpoint before SIGTERM (default: the server's DDPO_STOP_GRACE_S)",
    )
    group.add_argument(
        "--performance",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="performance options, e.g. '{\"channels_last\": false}' (README)",
    )


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _machines(text: str) -> int | dict[str, int]:
    """N, or MIN:MAX (an elastic job's range); the server checks the bounds."""
    low, colon, high = text.partition(":")
    try:
        if not colon:
            return int(text)
        return {"min": int(low), "max": int(high)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or MIN:MAX") from None


def _param(text: str) -> tuple[str, object]:
    name, equals, raw = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


def spec_from_args(args: argparse.Namespace) -> dict[str, object]:
    spec: dict[str, object] = {
        "topology": {"num_machines": args.machines, "num_processes": args.processes},
        "backend": args.backend,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "lr": args.lr,
        "seed": args.seed,
        "max_restarts": args.max_restarts,
        "priority": args.priority,
    }
    if args.script is not None:
        spec["script"] = {"path": args.script, "args": args.script_args}
    else:
        spec["trainer"] = args.trainer
    params = {**(args.params or {}), **dict(args.param)}
    if params:
        spec["params"] = params
    if args.name:
        spec["name"] = args.name
    if args.max_steps_per_epoch is not None:
        spec["max_steps_per_epoch"] = args.max_steps_per_epoch
    if args.checkpoint_every is not None:
        spec["checkpoint_every_steps"] = args.checkpoint_every
    if args.max_run_seconds is not None:
        spec["max_run_seconds"] = args.max_run_seconds
    if args.not_preemptible:
        spec["preemptible"] = False
    if args.stop_grace is not None:
        spec["stop_grace_s"] = args.stop_grace
    if args.performance is not None:
        spec["performance"] = args.performance
    return spec


def submit(api: Api, spec: dict[str, object], idempotency_key: str | None = None) -> JobPublic:
    job, _ = submit_once(api, spec, idempotency_key)
    return job


def submit_once(
    api: Api, spec: dict[str, object], idempotency_key: str | None = None
) -> tuple[JobPublic, bool]:
    """The job, and whether it is new (False: the Idempotency-Key's job)."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    response = api.post("/jobs", "submit", json=spec, headers=headers)
    return JobPublic.model_validate(response.json()), response.status_code == 201


def follow(
    api: Api, job_id: int, *, interval_s: float = 1.0, out: TextIO = sys.stdout
) -> JobPublic:
    """Print progress about once a second until the job ends; return it. A
    server that goes away meanwhile (a restart) is waited for: the job runs
    on without it."""
    tty = out.isatty()
    last = ""

    def say(message: str) -> None:
        out.write(("\n" if tty and last else "") + message + "\n")
        out.flush()

    while True:
        data = riding_out_restarts(lambda: api.get(f"/jobs/{job_id}", f"job {job_id}"), say=say)
        job = JobPublic.model_validate(data)
        line = render.progress_line(job)
        if line != last:
            out.write(("\r\033[K" + line) if tty else line + "\n")
            out.flush()
            last = line
        if job.status.is_terminal():
            if tty:
                out.write("\n")
            return job
        time.sleep(interval_s)
