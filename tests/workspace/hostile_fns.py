"""Processors whose failures once escaped the runtime's JSON error path."""

from __future__ import annotations

import sys

from processors_base import AbstractRewardProcessor, RewardInput, RewardOutput


def _kind(input_data: RewardInput) -> str:
    return str((input_data.agent_output.rollout_extra or {}).get("raise", "surrogate"))


def _fail(input_data: RewardInput) -> RewardOutput:
    kind = _kind(input_data)
    if kind == "exit":
        sys.exit(4)
    if kind == "interrupt":
        raise KeyboardInterrupt
    # a lone surrogate (as decoding bytes with errors="surrogateescape" leaves behind)
    raise ValueError("cannot decode b'\\xff': \udcff")


class BaseExceptionReward(AbstractRewardProcessor):
    """Async process() that raises SystemExit, KeyboardInterrupt or a surrogate message."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        return _fail(input_data)


class SyncBaseExceptionReward(AbstractRewardProcessor):
    """The same from sync code, which runs in a worker thread."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        return _fail(input_data)


class ExitInSetupReward(AbstractRewardProcessor):
    def setup(self) -> None:
        sys.exit("no GPU found")

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise AssertionError("never reached")


class AsyncExitInSetupReward(AbstractRewardProcessor):
    async def setup(self) -> None:
        sys.exit("no GPU found")

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise AssertionError("never reached")
