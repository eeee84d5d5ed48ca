"""Text from the server, made safe for a terminal: a node's address, a job's
name or a rank's log line could carry control sequences (clear the screen,
retitle the window, rewrite what was printed). Every control character but
newline and tab is shown escaped instead of acted on."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """A table cell: newlines and tabs escaped too, so a value from the
    server cannot start a row of its own (a fake node or job)."""
    return _BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
