"""``ddpo``'s help names what each command reads, and a slip of the keyboard
gets a suggestion rather than a bare usage line."""

from __future__ import annotations

import pytest

from cli.__main__ import main

TALKS_TO_A_SERVER = [
    "submit",
    "list",
    "show",
    "logs",
    "cancel",
    "priority",
    "queue",
    "nodes",
    "trainers",
    "study",
    "keys create",
    "keys list",
    "keys revoke",
    "audit",
]


def help_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["", *TALKS_TO_A_SERVER])
def test_help_names_the_variables_read(capsys: pytest.CaptureFixture[str], command: str) -> None:
    shown = help_of(capsys, *command.split())
    assert "DDPO_SERVER" in shown and "DDPO_TOKEN" in shown


def test_spec_flags_say_what_they_are_and_their_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = " ".join(help_of(capsys, "submit").split())
    for words in (
        "--batch-size BATCH_SIZE batch size per process (default: 128)",
        "--epochs EPOCHS epochs to train (default: 1)",
        "--backend {gloo,nccl} gloo (CPU) or nccl (a GPU per process) (default: gloo)",
        "--max-run-seconds MAX_RUN_SECONDS fail with reason deadline",
    ):
        assert words in shown, words


def test_local_cluster_help_names_its_files_and_data(capsys: pytest.CaptureFixture[str]) -> None:
    shown = help_of(capsys, "local-cluster")
    assert "DDPO_DATA_DIR" in shown and "DDPO_CLUSTER_FILE" in shown and "--keep" in shown


@pytest.mark.parametrize(
    "argv,suggestion",
    [
        (["submit", "--batchsize", "64"], "did you mean --batch-size?"),
        (["sumbit"], "did you mean submit?"),
        (["list", "--limt", "3"], "did you mean --limit?"),
    ],
)
def test_a_mistyped_flag_or_command_gets_a_suggestion(
    capsys: pytest.CaptureFixture[str], argv: list[str], suggestion: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert suggestion in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("ddpo ")
