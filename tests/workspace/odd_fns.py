"""User code that leaks its key in odd places, fails in odd ways, or logs from threads the
runtime did not start."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    reward_func,
    sub_reward_func,
)

user_log = logging.getLogger("my_functions")


def _key(input_data: Any) -> str:
    return (input_data.model_extra or {}).get("model_resource", {}).get("api_key", "")


def _extra(input_data: Any) -> dict[str, Any]:
    return input_data.agent_output.rollout_extra or {}


@reward_func("judged")
class KeyInSubRewardError(AbstractRewardProcessor):
    """A judge sub-reward whose error names the URL it called, key and all."""

    @sub_reward_func("judge")
    def judge(self, input_data: RewardInput) -> RewardOutput:
        key = _key(input_data)
        raise ConnectionError(
            f"GET https://judge.example/score?k={quote(key, safe='')} failed (key {key})"
        )


class ReturnsFailedWithKey(AbstractRewardProcessor):
    """Returns a failed output itself, its error text holding the key."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        error = f"upstream refused {_key(input_data)}"
        return RewardOutput(reward=Reward(reward_score=0.0), status="failed", error=error)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


class _NoneStr(Exception):
    def __str__(self) -> Any:
        return None


class OddExceptions(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        if _extra(input_data).get("kind") == "none":
            raise _NoneStr()
        raise _Unprintable()


class HugeError(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        raise ValueError("x" * 2_000_000)


class LogsFromForeignThreads(AbstractRewardProcessor):
    """Logs its key from self.executor, loop.run_in_executor (default pool), a thread of its
    own, and warnings.warn."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        key = _key(input_data)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, user_log.warning, "executor %s", key)
        await loop.run_in_executor(None, user_log.warning, "default pool %s", key)
        thread = threading.Thread(target=user_log.warning, args=("own thread %s", key))
        thread.start()
        await asyncio.to_thread(thread.join)
        await loop.run_in_executor(None, warnings.warn, f"warned {key}")
        user_log.warning("surrogate \udcff end")
        return RewardOutput(reward=Reward(reward_score=1.0))


class SleepsSync(AbstractRewardProcessor):
    """Sleeps as long as asked (a call that will not end before its deadline)."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        time.sleep(float(_extra(input_data).get("sleep", 0)))
        return RewardOutput(reward=Reward(reward_score=1.0))


class SwallowsCancellation(AbstractRewardProcessor):
    """Ignores cancellation for ``hold`` seconds (a task that swallows CancelledError)."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        until = time.monotonic() + float(_extra(input_data).get("hold", 3))
        while time.monotonic() < until:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)
        return RewardOutput(reward=Reward(reward_score=1.0))


class WaitsInTheDefaultPool(AbstractRewardProcessor):
    """Async process() waiting on a sync call in the loop's default thread pool."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        sleep = float(_extra(input_data).get("sleep", 0))
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, sleep)
        return RewardOutput(reward=Reward(reward_score=1.0))


class SetupFailsWhenMarked(AbstractRewardProcessor):
    """setup() fails while the file ``fail-setup`` exists in TEST_MARKER_DIR (a GPU gone,
    a model server down), as a replacement isolation process would find it; if the file
    lists process ids, only in the isolation processes of those workers."""

    def setup(self) -> None:
        marker = Path(os.environ["TEST_MARKER_DIR"]) / "fail-setup"
        if marker.exists():
            pids = marker.read_text().split()
            if not pids or str(os.getppid()) in pids:
                raise RuntimeError("no GPU left")

    def process(self, input_data: RewardInput) -> RewardOutput:
        time.sleep(float(_extra(input_data).get("sleep", 0)))
        return RewardOutput(reward=Reward(reward_score=float(os.getpid())))


class NanInExtras(AbstractRewardProcessor):
    """A NaN in an extra field of the output; "NaN" as mere text when asked."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        if _extra(input_data).get("text"):
            return RewardOutput(reward=Reward(reward_score=1.0), note="NaN or Infinity")
        return RewardOutput(reward=Reward(reward_score=1.0), debug={"ratios": [0.5, float("nan")]})


def _log_after_the_request(key: str) -> None:
    time.sleep(0.5)  # the request has been answered by then: only its context knows the key
    user_log.warning("after the request %s", key)


class LogsAfterItsRequest(AbstractRewardProcessor):
    """Hands work to self.executor that logs the key once the request has ended."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        self.executor.submit(_log_after_the_request, _key(input_data))
        return RewardOutput(reward=Reward(reward_score=1.0))
