"""``ddpo``: the command line."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from importlib.metadata import PackageNotFoundError, version

from cli import commands, local_cluster, people, studies, sweeps
from cli.api import DEFAULT_SERVER, CliError
from cli.terminal import shown


class Parser(argparse.ArgumentParser):
    """argparse, with a suggestion for a mistyped flag or subcommand."""

    def error(self, message: str) -> None:  # type: ignore[override]
        slip = re.search(r"unrecognized arguments: (\S+)|invalid choice: '([^']+)'", message)
        if slip:
            word = slip.group(1) or slip.group(2)
            close = difflib.get_close_matches(word, self._known_words(), n=1)
            if close and close[0] != word:
                message += f" (did you mean {close[0]}?)"
        super().error(message)

    def _known_words(self) -> list[str]:
        words: list[str] = []
        for action in self._actions:
            words += action.option_strings
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    words.append(name)
                    words += [o for a in sub._actions for o in a.option_strings]
        return words


def said(command: str, message: str) -> str:
    """``ddpo submit: ...``, once: a message that starts with what it was
    doing (``submit: ...``, ``show job 3: ...``) already names the command."""
    first = message.split(":", 1)[0].split(" ", 1)[0]
    return (
        f"ddpo {message}" if first == command and ":" in message else f"ddpo {command}: {message}"
    )


def _version() -> str:
    try:
        return version("ddpo")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="ddpo",
        description="Distributed PyTorch training, orchestrated.",
        epilog=f"{commands.ENVIRONMENT} `ddpo COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"ddpo {_version()}")
    parser.add_argument(
        "--server",
        default=None,
        help=f"the ddpo server [DDPO_SERVER, default {DEFAULT_SERVER}]; here or after the command",
    )
    subcommands = parser.add_subparsers(dest="command", required=True)
    for add in (
        commands.add_submit,
        commands.add_list,
        commands.add_show,
        commands.add_logs,
        commands.add_cancel,
        commands.add_priority,
        commands.add_queue,
        commands.add_nodes,
        commands.add_drain,
        commands.add_undrain,
        commands.add_model,
        commands.add_trainers,
        commands.add_dashboard,
        people.add_keys,
        people.add_audit,
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
    sweep = subcommands.add_parser(
        "sweep",
        help="hyperparameter sweeps: submit, show (live), cancel, list",
        description=sweeps.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweeps.add_arguments(sweep)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except CliError as exc:
        print(shown(said(args.command, str(exc))), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
