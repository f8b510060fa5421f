"""Functions for the eval tests: broken in the ways eval must catch."""

from __future__ import annotations

import os
import time
from pathlib import Path

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    reward_func,
    sub_reward_func,
)


class AlwaysRaises(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise ZeroDivisionError("the judge divided by zero")


class SlowReward(AbstractRewardProcessor):
    """Takes SLOW_SECONDS per call (a plain ``def``: it runs in a worker thread); touches
    EVAL_MARKER, when set, once it is called."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        marker = os.environ.get("EVAL_MARKER")
        if marker:
            Path(marker).touch()
        time.sleep(float(os.environ.get("SLOW_SECONDS", "0.9")))
        return RewardOutput(reward=Reward(reward_score=0.5))


@reward_func("half-broken")
class BrokenSubReward(AbstractRewardProcessor):
    """One sub-reward always raises: under --sub-reward-errors zero it scores 0, silently."""

    @sub_reward_func("format", sub_weight=0.5)
    def format_ok(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))

    @sub_reward_func("judge", sub_weight=0.5)
    def judge(self, input_data: RewardInput) -> RewardOutput:
        raise TimeoutError("the judge did not answer")


class RaisesBrackets(AbstractRewardProcessor):
    """Its error reads like rich markup: an LLM's chat template tokens."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise ValueError("no answer after [/INST] in [bold]the output")


class ExitsOnCall(AbstractRewardProcessor):
    """Its server dies on the first call, with exit code 3 and a last word in its log."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        print("ExitsOnCall: going down", flush=True)
        os._exit(3)


class WaitsForRelease(AbstractRewardProcessor):
    """Touches EVAL_MARKER once called, then waits (two minutes at most) until the file
    EVAL_RELEASE exists: a test acts while eval is mid-run, then lets it finish."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        Path(os.environ["EVAL_MARKER"]).touch()
        release = Path(os.environ["EVAL_RELEASE"])
        deadline = time.monotonic() + 120
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return RewardOutput(reward=Reward(reward_score=0.5))
