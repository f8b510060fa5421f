"""An exception of user code crosses from an isolation process as a CrossedError, with its
traceback as a note where Python has notes (3.11+) and in ``remote_traceback`` always:
on Python 3.10, which the project supports and which has no ``add_note``, every user
exception under --isolation process became an AttributeError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.execution import offload

TESTS = Path(__file__).resolve().parents[1]
TRACEBACK = 'Traceback (most recent call last):\n  File "judge.py", line 3\nValueError: no\n'


def test_a_crossed_error_keeps_its_traceback_as_a_note() -> None:
    error = offload.crossed("ValueError", "builtins", "no", TRACEBACK)
    assert type(error).__name__ == "ValueError" and str(error) == "no"
    assert error.remote_traceback == TRACEBACK
    if sys.version_info >= (3, 11):
        assert error.__notes__ == [TRACEBACK.rstrip()]


def test_without_notes_a_crossed_error_still_crosses(monkeypatch: pytest.MonkeyPatch) -> None:
    # Python 3.10: no BaseException.add_note; the traceback travels in remote_traceback only
    monkeypatch.setattr(offload.CrossedError, "add_note", None, raising=False)
    error = offload.crossed("KeyError", "builtins", "'answer'", TRACEBACK)
    assert isinstance(error, offload.CrossedError)
    assert type(error).__name__ == "KeyError" and str(error) == "'answer'"
    assert error.remote_traceback == TRACEBACK
    assert not hasattr(error, "__notes__")


# Run in a child Python of its own: the isolation pool's resource tracker lives as long as
# the process that started it.
ISOLATED_CALL = """
import anyio
from processors_base import RewardInput
from runtime.execution.function import Function, ProcessorFailure
from runtime.execution.loading import load_target

async def main():
    function = Function(load_target("workspace.fns:RaisingReward", "."), isolation="process")
    await function.setup()
    try:
        await function.call(RewardInput(agent_output={"messages": []}))
    except ProcessorFailure as failure:
        print("failure:", failure)
        print("cause:", type(failure.__cause__).__mro__[1].__name__)
        print(failure.__cause__.remote_traceback)
    finally:
        await function.shutdown()

anyio.run(main)
"""


def test_a_user_exception_under_process_isolation_is_the_users() -> None:
    # the whole path, on the Python that runs the tests (3.10 included)
    done = subprocess.run(
        [sys.executable, "-c", ISOLATED_CALL],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "failure: ValueError: boom: the scorer broke" in done.stdout, done.stdout
    assert "cause: CrossedError" in done.stdout
    assert 'raise ValueError("boom: the scorer broke")' in done.stdout
