"""Reward processors for the server-level tests of the reward registry and output checks."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from typing import Any

from processors_base import (
    AbstractGroupRewardProcessor,
    AbstractRewardProcessor,
    AbstractRolloutProcessor,
    AgentOutput,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RewardInput,
    RewardOutput,
    RolloutInput,
    RolloutOutput,
    aggregate_func,
    reward_func,
    sub_reward_func,
)


def _out(score: float) -> RewardOutput:
    return RewardOutput(reward=Reward(reward_score=score))


def _extra(input_data: Any) -> dict[str, Any]:
    return input_data.agent_output.rollout_extra or {}


@reward_func("flaky_judge")
class FlakyJudge(AbstractRewardProcessor):
    """The judge sub-reward raises (a timed-out LLM judge); format still scores."""

    @sub_reward_func("format", sub_weight=0.2)
    def format_ok(self, input_data: RewardInput) -> RewardOutput:
        return _out(1.0)

    @sub_reward_func("judge", sub_weight=0.8)
    async def judge(self, input_data: RewardInput) -> RewardOutput:
        raise ConnectionError("judge endpoint timed out")


@reward_func("flaky_judge_aggregate")
class FlakyJudgeAggregate(FlakyJudge):
    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        return _out(self.get_total(sub_rewards))


@reward_func("placeholder")
class Placeholder(AbstractRewardProcessor):
    """Written for the SDK: a placeholder process() that the decorator replaces."""

    @sub_reward_func("answer", sub_weight=0.8)
    def answer(self, input_data: RewardInput) -> RewardOutput:
        return _out(1.0)

    def process(self, input_data: RewardInput) -> RewardOutput:
        return _out(0.0)


@reward_func("sync_aggregate")
class SyncAggregate(AbstractRewardProcessor):
    @sub_reward_func("a")
    def a(self, input_data: RewardInput) -> RewardOutput:
        return _out(1.0)

    @sub_reward_func("b")
    def b(self, input_data: RewardInput) -> RewardOutput:
        return _out(0.5)

    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        return _out(self.get_total(sub_rewards))


class AsyncAggregateOverride(SyncAggregate):
    """Overrides the aggregate with an undecorated async def: as in the SDK, an override
    without the decorator is no aggregate, and the default weighted sum answers."""

    async def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:  # type: ignore[override]
        await asyncio.sleep(0)
        return _out(10 * self.get_total(sub_rewards))


class WithoutB(SyncAggregate):
    b = None  # unregisters sub-reward b
    combine = None  # and the aggregate: the default weighted sum answers


def _async_wrapper(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


@reward_func("wrapped")
class WrappedSync(AbstractRewardProcessor):
    """A sync sub-reward behind an async decorator (a retry or tracing wrapper)."""

    @sub_reward_func("wrapped", sub_weight=1.0)
    @_async_wrapper
    def wrapped(self, input_data: RewardInput) -> RewardOutput:
        return _out(1.0)


@reward_func("uses_executor")
class UsesExecutor(AbstractRewardProcessor):
    """SDK-style code that offloads its own work to ``self.executor``."""

    @sub_reward_func("offloaded")
    async def offloaded(self, input_data: RewardInput) -> RewardOutput:
        loop = asyncio.get_running_loop()
        score = await loop.run_in_executor(self.executor, len, "abc")
        return _out(float(score))


class NonFiniteReward(AbstractRewardProcessor):
    """Returns a non-finite score or metric, as rollout_extra.kind asks."""

    async def process(self, input_data: RewardInput) -> Any:
        kind = _extra(input_data).get("kind")
        if kind == "nan-score":
            return _out(math.nan)
        if kind == "inf-metric":
            return RewardOutput(reward=Reward(reward_score=1.0, reward_metrics={"acc": math.inf}))
        if kind == "dict":
            return {"reward": {"reward_score": -math.inf}}
        return _out(1.0)


@reward_func("nan_sub")
class NaNSubReward(AbstractRewardProcessor):
    @sub_reward_func("ok", sub_weight=1.0)
    def ok(self, input_data: RewardInput) -> RewardOutput:
        return _out(1.0)

    @sub_reward_func("broken", sub_weight=1.0)
    def broken(self, input_data: RewardInput) -> float:
        return math.nan


class NonFiniteGroupReward(AbstractGroupRewardProcessor):
    async def process(self, input_data: GroupRewardInput) -> GroupRewardOutput:
        rewards = [Reward(reward_score=1.0) for _ in input_data.agent_outputs]
        rewards[-1] = Reward(reward_score=0.0, reward_metrics={"z": -math.inf})
        return GroupRewardOutput(reward=GroupReward(rewards=rewards))


class NonFiniteRollout(AbstractRolloutProcessor):
    async def process(self, input_data: RolloutInput) -> RolloutOutput:
        return RolloutOutput(
            agent_output=AgentOutput(
                messages=input_data.messages, rollout_metrics={"turns": math.nan}
            )
        )


@reward_func("forgot_return")
class ForgotReturn(AbstractRewardProcessor):
    """A sub-reward without its ``return``: the SDK answers 500, and so do we."""

    @sub_reward_func("ok")
    def ok(self, input_data: RewardInput) -> RewardOutput:
        return _out(1.0)

    @sub_reward_func("forgot")
    def forgot(self, input_data: RewardInput) -> RewardOutput:
        _out(1.0)  # type: ignore[return-value]  # no return


class NullMetricsRollout(AbstractRolloutProcessor):
    """Returns ``rollout_metrics=None``, which the SDK's model accepts."""

    async def process(self, input_data: RolloutInput) -> RolloutOutput:
        return RolloutOutput(
            agent_output=AgentOutput(messages=input_data.messages, rollout_metrics=None)
        )
