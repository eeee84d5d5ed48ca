"""What the CLI prints from the server cannot drive the terminal."""

from __future__ import annotations

from datetime import datetime, timezone

from cli import render
from cli.commands import _log_line
from cli.terminal import shown
from ddpo.lifecycle import NodeState
from ddpo.schemas import LogLinePublic, NodePublic, NodesPublic

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
CLEAR_SCREEN = "\x1b[2J\x1b[H"
RETITLE = "\x1b]0;owned\x07"


def test_control_characters_are_shown_escaped_newlines_and_tabs_kept() -> None:
    assert shown(f"a{CLEAR_SCREEN}b\r\x08\x9b") == "a\\x1b[2J\\x1b[Hb\\r\\x08\\x9b"
    assert shown("one\ttwo\nthree") == "one\ttwo\nthree"


def test_a_nodes_address_and_a_log_line_print_without_their_escapes() -> None:
    node = NodePublic(
        id=1,
        name="a",
        address=f"10.0.0.1{RETITLE}",
        slots=1,
        gpus=0,
        cpus=2,
        trainers=["mnist"],
        state=NodeState.LIVE,
        registered_at=NOW,
        last_heartbeat_at=NOW,
        parts=[],
    )
    table = render.nodes_table(NodesPublic(data=[node], count=1))
    line = _log_line(
        LogLinePublic(id=1, machine_id=0, rank=0, text=f"loss{CLEAR_SCREEN}", at=NOW), True
    )
    for printed in (table, line):
        assert "\x1b" not in printed and "\x07" not in printed
    assert "\\x1b]0;owned\\x07" in table
    assert line == "[m0 rank 0] loss\\x1b[2J\\x1b[H"
