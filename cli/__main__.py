"""``ddpo``: the command line."""

from __future__ import annotations

import argparse
import sys

from cli import local_cluster, studies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddpo", description="Distributed PyTorch training, orchestrated."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    local = commands.add_parser(
        "local-cluster",
        help="start a server and workers here, run one job through them, print its timing",
        description=local_cluster.__doc__,
    )
    local_cluster.add_arguments(local)
    local.set_defaults(run=local_cluster.run)
    study = commands.add_parser(
        "study",
        help="run a scaling study on a server and print its table",
        description=studies.__doc__,
    )
    studies.add_arguments(study)
    study.set_defaults(run=studies.run)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
