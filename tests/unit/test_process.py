from __future__ import annotations

import signal
import subprocess
import sys
import time

from worker._process import group_alive, signal_group


def test_a_process_group_is_alive_until_all_its_processes_are_gone() -> None:
    # A session leader with a child of its own, like a launcher and its ranks.
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        assert group_alive(leader.pid)
        signal_group(leader.pid, signal.SIGKILL)
        leader.wait(10)
        while group_alive(leader.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not group_alive(leader.pid)
    finally:
        signal_group(leader.pid, signal.SIGKILL)
        leader.wait(10)
