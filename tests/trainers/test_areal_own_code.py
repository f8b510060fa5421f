"""AReaL 1.0.4's own ``AsyncRewardWrapper`` calling the runtime's AReaL hook (issue 22).

AReaL's RLVR workflow wraps ``reward_fn`` in ``areal.api.reward_api.AsyncRewardWrapper``,
which runs it in a process pool, waits ``timeout_seconds`` (15 by default), retries a
raising call and gives 0 on a timeout. That module comes from AReaL's wheel
(``TRAINER_WHEELS``, see ``trainer_wheels.py``) and runs as written. AReaL's package
``__init__`` starts its whole infrastructure
(torch, its controllers), so only this module is loaded, with its one helper import, AReaL's
logger factory, given as a plain ``logging.getLogger``.

AReaL needs Python 3.11 or 3.12: elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Server, free_port
from helpers import started
from trainer_wheels import load_module, needs_wheel, wheel

from processors_base.trainer_hooks import AReaLReward

AREAL_VERSION = "1.0.4"  # the release these tests prove

pytestmark = [
    needs_wheel("areal", AREAL_VERSION),
    pytest.mark.skipif(
        not (3, 11) <= sys.version_info[:2] <= (3, 12),
        reason=f"AReaL {AREAL_VERSION} runs on Python 3.11 and 3.12 only",
    ),
    pytest.mark.xdist_group("areal-own-code"),
]

TARGET = "workspace.trainer_fns:MatchReward"  # "42" scores 1.0; RAISE, HANG, FAILEDSCORE


def _reward_api() -> types.ModuleType:
    """``areal/api/reward_api.py`` from the wheel, its logger factory a plain one."""
    return load_module(
        wheel("areal", AREAL_VERSION),
        "areal/api/reward_api.py",
        "areal_reward_api",
        {"areal.utils.logging": {"getLogger": lambda name=None, *a, **k: logging.getLogger(name)}},
    )


@pytest.fixture(scope="module")
def areal() -> Iterator[types.ModuleType]:
    module = _reward_api()
    yield module
    # what AReaL runs at exit: its pools' worker processes stopped, none left behind
    module.AsyncRewardWrapper._atexit_shutdown_all()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from started(TARGET, "--timeout", "30")


def _score(wrapper: Any, completion: str, **data: Any) -> Any:
    # as AReaL's RLVR workflow calls it: prompt, completion, their token ids, the row's columns
    return asyncio.run(wrapper("What is 6*7?", completion, [1, 2], [3], **data))


def test_areal_1_0_4_scores_through_its_own_wrapper(
    areal: types.ModuleType, server: Server
) -> None:
    wrapper = areal.AsyncRewardWrapper(AReaLReward(server.url), max_workers=1)
    assert _score(wrapper, "42", answer="42") == 1.0
    assert _score(wrapper, "41", answer="42") == 0.0
    # the function's own failures: 0.0 at once, not an exception AReaL retries, then raises
    assert _score(wrapper, "RAISE", answer="42") == 0.0
    assert _score(wrapper, "FAILEDSCORE", answer="42") == 0.0


def test_areal_1_0_4_a_hanging_reward_is_0_before_its_own_timeout(
    areal: types.ModuleType, server: Server
) -> None:
    # the hook's deadline (1 s here, 10 s by default) ends the call before AReaL's wait
    # (3 s here, 15 s by default) would: a 0.0 from the hook, not AReaL's timeout and retries
    wrapper = areal.AsyncRewardWrapper(AReaLReward(server.url, timeout=1), 3, max_workers=1)
    started = time.monotonic()
    assert _score(wrapper, "HANG", answer="42") == 0.0
    assert time.monotonic() - started < 3 * 4  # one try, not AReaL's four timed-out ones


def test_areal_1_0_4_a_server_that_is_down_scores_0(
    areal: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    # the hook as AReaL users set it, its deadline 10 s: the first call gives up after the
    # circuit breaker's 5 refused connections, the next ones fail at once
    hook = AReaLReward(f"http://127.0.0.1:{free_port()}")
    wrapper = areal.AsyncRewardWrapper(hook, max_workers=1)
    with caplog.at_level(logging.WARNING):
        assert _score(wrapper, "42", answer="42") == 0.0
        started = time.monotonic()
        assert [_score(wrapper, "42", answer="42") for _ in range(3)] == [0.0] * 3
        fast = time.monotonic() - started
    # neither AReaL's timeout nor its retries were reached: the hook answered every call
    assert "timeout" not in caplog.text and "Reward computation error" not in caplog.text
    assert fast < 10  # not a deadline's wait per call (a bound no busy machine reaches)
