"""``ddpo study``: the scaling table, from one request."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

import httpx

from api.schemas import StudyPublic
from cli import render
from cli.commands import client_for
from cli.jobs import add_spec_arguments, spec_from_args


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


def run_study(
    client: httpx.Client, request: dict[str, object], out: TextIO = sys.stdout
) -> StudyPublic:
    response = client.post("/studies", json=request)
    if response.status_code == 422:
        problems = "; ".join(d["msg"] for d in response.json()["detail"])
        raise SystemExit(f"the server rejected the study: {problems}")
    study = StudyPublic.model_validate(response.raise_for_status().json())
    print(
        f"submitted study {study.id}: jobs {', '.join(str(r.job_id) for r in study.rows)}", file=out
    )
    seen: dict[int, str] = {}
    while True:
        for row in study.rows:
            if seen.get(row.job_id) != row.status.value:
                seen[row.job_id] = row.status.value
                print(
                    f"  {row.num_machines} x {row.num_processes} (job {row.job_id}): "
                    f"{row.status.value}",
                    file=out,
                    flush=True,
                )
        if study.status.is_terminal():
            return study
        time.sleep(1.0)
        study = StudyPublic.model_validate(client.get(f"/studies/{study.id}").json())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=os.environ.get("DDPO_SERVER", "http://127.0.0.1:8000"),
        help="the ddpo server [DDPO_SERVER, default http://127.0.0.1:8000]",
    )
    add_study_arguments(parser)
    add_spec_arguments(parser)


def run(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        study = run_study(client, study_request(args))
    print(render.study_table(study))
    return 0 if study.status.value == "succeeded" else 1
