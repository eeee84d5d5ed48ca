"""``ddpo sweep``: one job spec over many hyperparameters, each trial a job
on the same queue, the poor ones stopped early (README, "Sweeps").

  ddpo sweep submit sweep.yaml --watch
  ddpo sweep submit --space lr=log:0.01:5 --trials 12 --concurrent 2 \\
      --pruner asha --grace-steps 10 --objective train_loss --epochs 3
  ddpo sweep show 1 --watch
  ddpo sweep cancel 1
  ddpo sweep list
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cli import render
from cli.api import Api, CliError, riding_out_restarts
from cli.commands import add_connection_arguments, client_for
from cli.jobs import add_spec_arguments, spec_from_args
from ddpo.schemas.sweep import SweepPublic

SPACE_HELP = (
    "a dimension: NAME=log:LOW:HIGH (float, log scale), NAME=float:LOW:HIGH, "
    "NAME=int:LOW:HIGH[:STEP], NAME=choice:A,B,C (each read as JSON, else a string); NAME is "
    "lr, batch_size, seed, params.NAME or args.NAME (a script's --NAME VALUE); repeatable"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="sweep_command", required=True)
    submit = commands.add_parser(
        "submit",
        help="submit a sweep from a YAML or JSON file, or from flags",
        description="Submit a sweep: a file holding the whole request (README, 'Sweeps'), "
        "or the job spec's flags with --space.",
    )
    add_connection_arguments(submit)
    submit.add_argument(
        "file", nargs="?", type=Path, help="the request as YAML or JSON ('-': standard input)"
    )
    submit.add_argument(
        "--space", action="append", default=[], metavar="NAME=SPEC", help=SPACE_HELP
    )
    submit.add_argument(
        "--objective",
        default="loss",
        metavar="METRIC[:max]",
        help="what a trial is judged by (loss, a metric the trainer reports, a result field "
        "such as test_accuracy); ':max' to maximize it",
    )
    submit.add_argument("--trials", type=int, default=10, help="max_trials")
    submit.add_argument("--concurrent", type=int, default=1, help="max_concurrent")
    submit.add_argument("--sampler", choices=["tpe", "random", "grid"], default="tpe")
    submit.add_argument(
        "--sampler-seed", type=int, default=0, help="the same seed, the same trials"
    )
    submit.add_argument("--pruner", choices=["none", "median", "asha"], default="none")
    submit.add_argument("--reduction-factor", type=int, default=3, help="asha: keep 1 in this many")
    submit.add_argument("--grace-steps", type=int, default=None, help="asha: the first rung")
    submit.add_argument(
        "--watch", action="store_true", help="then show the trial table live until it ends"
    )
    submit.add_argument("-q", "--quiet", action="store_true", help="print only the sweep's id")
    add_spec_arguments(submit)
    submit.set_defaults(run=run_submit)

    show = commands.add_parser("show", help="a sweep's trial table")
    add_connection_arguments(show)
    show.add_argument("sweep_id", type=int)
    show.add_argument("--watch", action="store_true", help="redraw it until the sweep ends")
    show.set_defaults(run=run_show)

    cancel = commands.add_parser("cancel", help="start no more trials; cancel those running")
    add_connection_arguments(cancel)
    cancel.add_argument("sweep_id", type=int)
    cancel.set_defaults(run=run_cancel)

    listing = commands.add_parser("list", help="the newest sweeps")
    add_connection_arguments(listing)
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(run=run_list)


def dimension(text: str) -> tuple[str, dict[str, Any]]:
    """``lr=log:0.01:5`` -> ("lr", {"type": "float", "low": 0.01, "high": 5, "log": True})."""
    name, equals, rest = text.partition("=")
    kind, _, bounds = rest.partition(":")
    problem = CliError(f"--space {text!r}: {SPACE_HELP}")
    if not equals or not name or not bounds:
        raise problem
    if kind == "choice":
        return name, {
            "type": "categorical",
            "choices": [_json_or_text(c) for c in bounds.split(",")],
        }
    parts = bounds.split(":")
    try:
        if kind in ("log", "float") and len(parts) == 2:
            low, high = (float(p) for p in parts)
            return name, {"type": "float", "low": low, "high": high, "log": kind == "log"}
        if kind == "int" and len(parts) in (2, 3):
            numbers = [int(p) for p in parts]
            found: dict[str, Any] = {"type": "int", "low": numbers[0], "high": numbers[1]}
            if len(numbers) == 3:
                found["step"] = numbers[2]
            return name, found
    except ValueError:
        raise problem from None
    raise problem


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def request_from(args: argparse.Namespace) -> dict[str, Any]:
    if args.file is not None:
        if args.space:
            raise CliError("give the space in the file or with --space, not both")
        return _read(args.file)
    if not args.space:
        raise CliError("a sweep needs a file or at least one --space NAME=SPEC")
    metric, _, direction = args.objective.partition(":")
    if direction not in ("", "max", "min"):
        raise CliError(f"--objective {args.objective!r}: METRIC, METRIC:max or METRIC:min")
    pruner: dict[str, Any] = {"kind": args.pruner, "reduction_factor": args.reduction_factor}
    if args.grace_steps is not None:
        pruner["grace_steps"] = args.grace_steps
    request: dict[str, Any] = {
        "spec": spec_from_args(args),
        "space": dict(dimension(d) for d in args.space),
        "objective": {
            "metric": metric,
            "direction": "maximize" if direction == "max" else "minimize",
        },
        "max_trials": args.trials,
        "max_concurrent": args.concurrent,
        "sampler": {"kind": args.sampler, "seed": args.sampler_seed},
        "pruner": pruner,
    }
    if args.name:
        request["name"] = args.name
    return request


def _read(path: Path) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not YAML or JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CliError(f"{path}: must hold one mapping (the sweep request)")
    return data


def run_submit(args: argparse.Namespace) -> int:
    request = request_from(args)
    with client_for(args) as api:
        with api.doing("submit the sweep") as client:
            sweep = client.submit_sweep(request)
        if args.quiet:
            print(sweep.id)
            return 0
        if args.json and not args.watch:
            print(sweep.model_dump_json(indent=2))
            return 0
        jobs = ", ".join(str(t.job_id) for t in sweep.trials)
        print(f"submitted sweep {sweep.id}: first trial job(s) {jobs}", flush=True)
        if not args.watch:
            return 0
        return _watch(api, sweep.id, args.json)


def run_show(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        if args.watch:
            return _watch(api, args.sweep_id, args.json)
        sweep = _get(api, args.sweep_id)
        print(sweep.model_dump_json(indent=2) if args.json else render.sweep_table(sweep))
        return 0


def _get(api: Api, sweep_id: int) -> SweepPublic:
    with api.doing(f"sweep {sweep_id}") as client:
        return client.sweep(sweep_id)


def _watch(api: Api, sweep_id: int, as_json: bool) -> int:
    """The table, redrawn in place on a terminal (printed again only when it
    changes otherwise), until the sweep ends; exit 0 if it succeeded."""
    live = sys.stdout.isatty() and not as_json
    shown = ""

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    while True:
        sweep = riding_out_restarts(lambda: _get(api, sweep_id), say=say)
        table = sweep.model_dump_json(indent=2) if as_json else render.sweep_table(sweep)
        if sweep.status.is_terminal() or (not as_json and table != shown):
            if live:
                sys.stdout.write("\x1b[H\x1b[J")  # home, clear: redraw in place
            print(table, flush=True)
            shown = table
        if sweep.status.is_terminal():
            return 0 if sweep.status.value == "succeeded" else 1
        time.sleep(1.0)


def run_cancel(args: argparse.Namespace) -> int:
    with client_for(args) as api, api.doing(f"cancel sweep {args.sweep_id}") as client:
        sweep = client.cancel_sweep(args.sweep_id)
    print(sweep.model_dump_json(indent=2) if args.json else render.sweep_table(sweep))
    return 0


def run_list(args: argparse.Namespace) -> int:
    with client_for(args) as api, api.doing("list sweeps") as client:
        sweeps = client.sweeps(limit=args.limit)
    print(sweeps.model_dump_json(indent=2) if args.json else render.sweeps_table(sweeps))
    return 0
