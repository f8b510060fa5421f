"""Processors for tests/execution/test_stopping.py: deadlines that user code resists, stuck calls,
stops, and process isolation that meets odd exceptions and results.

They wait on marker files (in TEST_MARKER_DIR), never on fixed sleeps: ``started-<tag>``
says a call began, ``release`` lets a blocked call return, ``ended-<tag>`` says it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

import httpx

from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput

from .markers import MARKERS, mark


def _extra(input_data: RewardInput) -> dict:
    return input_data.agent_output.rollout_extra or {}


def _released() -> bool:
    return (MARKERS / "release").exists()


class ModalReward(AbstractRewardProcessor):
    """Async; rollout_extra.mode: ok, raise, sleep, swallow-once, swallow-always, block."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        extra = _extra(input_data)
        mode, tag = extra.get("mode", "ok"), extra.get("tag", "x")
        mark(f"started-{tag}", mode)
        try:
            if mode == "raise":
                raise ValueError("the scorer broke")
            if mode == "sleep":
                await asyncio.sleep(float(extra.get("sleep", 0)))
            elif mode == "swallow-once":  # the judge client's retry loop eats one cancellation
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(30)
                await asyncio.sleep(30)
            elif mode == "swallow-always":  # ignores every cancellation until released
                while not _released():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0.02)
            elif mode == "block":  # respects cancellation; otherwise runs until released
                while not _released():
                    await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            mark(f"ended-{tag}", "cancelled")
            raise
        mark(f"ended-{tag}", "returned")
        return RewardOutput(reward=Reward(reward_score=1.0))


class BlockingSyncReward(AbstractRewardProcessor):
    """Sync: marks its start, then blocks its thread until ``release`` exists."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        tag = _extra(input_data).get("tag", "x")
        mark(f"started-{tag}", "started")
        while not _released():
            time.sleep(0.02)
        mark(f"ended-{tag}", "returned")
        return RewardOutput(reward=Reward(reward_score=1.0))


class HungSetupReward(AbstractRewardProcessor):
    """Sync setup() that never returns (a model download that hangs)."""

    def setup(self) -> None:
        mark("setup-started", "started")
        while True:
            time.sleep(0.05)

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise AssertionError("never reached")


class CrossingReward(AbstractRewardProcessor):
    """Sync, for --isolation process: rollout_extra.mode ok (answers its pid), http-error
    (raises httpx.HTTPStatusError, whose constructor needs keyword arguments, as
    ``raise_for_status()`` on a 429 does), unpicklable (returns a value that cannot be
    pickled) or hang. setup() is slow while ``slow-setup`` exists."""

    def setup(self) -> None:
        mark(f"setup-{os.getpid()}", "ran")
        while (MARKERS / "slow-setup").exists():
            time.sleep(0.02)

    def process(self, input_data: RewardInput) -> RewardOutput:
        mode = _extra(input_data).get("mode", "ok")
        if mode == "http-error":
            request = httpx.Request("GET", "http://127.0.0.1:9/judge")
            response = httpx.Response(429, request=request)
            response.raise_for_status()
        if mode == "unpicklable":
            return RewardOutput(reward=Reward(reward_score=1.0), handle=threading.Lock())
        if mode == "hang":
            mark(f"started-{os.getpid()}", "hanging")
            while True:
                time.sleep(0.05)
        return RewardOutput(reward=Reward(reward_score=float(os.getpid())))
