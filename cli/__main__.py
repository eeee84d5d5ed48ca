"""``ddpo``: the command line."""

from __future__ import annotations

import argparse
import sys

from cli import commands, local_cluster, studies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ddpo", description="Distributed PyTorch training, orchestrated."
    )
    subcommands = parser.add_subparsers(dest="command", required=True)
    for add in (
        commands.add_submit,
        commands.add_list,
        commands.add_show,
        commands.add_logs,
        commands.add_cancel,
        commands.add_nodes,
    ):
        add(subcommands)
    local = subcommands.add_parser(
        "local-cluster",
        help="start a server and workers here, run one job through them, print its timing",
        description=local_cluster.__doc__,
    )
    local_cluster.add_arguments(local)
    local.set_defaults(run=local_cluster.run)
    study = subcommands.add_parser(
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
