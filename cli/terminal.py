"""Text from the server, made safe for a terminal: a node's address, a job's
name or a rank's log line could carry control sequences (clear the screen,
retitle the window, rewrite what was printed). Every control character but
newline and tab is shown escaped instead of acted on."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
