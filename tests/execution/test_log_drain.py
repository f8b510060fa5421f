"""``runtime.logs.drain``: what a process about to ``os._exit`` calls so that the lines it
queued are written (the server's exit with stuck threads); at exit again, harmlessly."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging, os, sys
from runtime.logs import drain, setup_logging

setup_logging("info")
for n in range(200):
    logging.getLogger("runtime").warning("queued line %d", n)
drain()
drain()  # twice: a no-op
if sys.argv[1] == "exit-now":
    os._exit(3)  # no exit hooks run: only drain() wrote the lines
"""


def _run(how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=60
    )


def test_drain_writes_every_queued_line_before_os_exit() -> None:
    done = _run("exit-now")
    assert done.returncode == 3
    assert done.stderr.count("queued line") == 200, done.stderr[-2000:]


def test_drain_then_a_normal_exit_is_clean() -> None:
    done = _run("return")
    assert done.returncode == 0
    assert done.stderr.count("queued line") == 200
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
