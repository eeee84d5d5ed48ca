"""``ddpo study``: the scaling table, from one request."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from cli import render
from cli.api import Api, riding_out_restarts
from cli.commands import add_connection_arguments, client_for
from cli.jobs import add_spec_arguments, spec_from_args
from ddpo.schemas import StudyPublic


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows",
        nargs="+",
        metavar="[MACHINESx]PROCESSES:BATCH",
        default=["1:128", "2:64", "4:32", "8:16"],
        help="processes per machine and batch size per process, one per row, "
        "optionally with the machines (2x1:64; default --machines) "
        "(default 1:128 2:64 4:32 8:16: the global batch stays 128)",
    )


def study_request(args: argparse.Namespace) -> dict[str, object]:
    rows = []
    for row in args.rows:
        topology, _, batch = row.partition(":")
        machines, x, processes = topology.rpartition("x")
        try:
            rows.append(
                {
                    "num_machines": int(machines) if x else args.machines,
                    "num_processes": int(processes),
                    "batch_size": int(batch),
                }
            )
        except ValueError:
            raise SystemExit(f"--rows: {row!r} is not [MACHINESx]PROCESSES:BATCH") from None
    return {"name": args.name, "spec": spec_from_args(args), "rows": rows}


def run_study(api: Api, request: dict[str, object], out: TextIO = sys.stdout) -> StudyPublic:
    response = api.post("/studies", "submit the study", json=request)
    study = StudyPublic.model_validate(response.json())
    print(
        f"submitted study {study.id}: jobs {', '.join(str(r.job_id) for r in study.rows)}", file=out
    )
    seen: dict[int, str] = {}
    path, doing = f"/studies/{study.id}", f"study {study.id}"

    def say(message: str) -> None:
        print(message, file=out, flush=True)

    while True:
        for row in study.rows:
            if seen.get(row.job_id) != row.status.value:
                seen[row.job_id] = row.status.value
                topology = f"{row.num_machines} x {row.num_processes}"
                say(f"  {topology} (job {row.job_id}): {row.status.value}")
        if study.status.is_terminal():
            return study
        time.sleep(1.0)
        data = riding_out_restarts(lambda: api.get(path, doing), say=say)
        study = StudyPublic.model_validate(data)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    add_study_arguments(parser)
    add_spec_arguments(parser)


def run(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        study = run_study(api, study_request(args), out=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(study.model_dump_json(indent=2))
    else:
        print(render.study_table(study))
    return 0 if study.status.value == "succeeded" else 1
