"""The reward registry: sub-rewards, weights, aggregation, failures and inheritance."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import pytest

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    aggregate_func,
    reward_func,
    sub_reward_func,
)

INPUT = RewardInput(agent_output={"messages": [{"role": "assistant", "content": "42"}]})


def out(score: float, **metrics: float) -> RewardOutput:
    return RewardOutput(reward=Reward(reward_score=score, reward_metrics=metrics or None))


@reward_func("weighted")
class Weighted(AbstractRewardProcessor):
    def __init__(self) -> None:
        self.threads: dict[str, str] = {}

    @sub_reward_func("a", sub_weight=0.25)
    def sub_a(self, input_data: RewardInput) -> RewardOutput:
        self.threads["a"] = threading.current_thread().name
        return out(1.0, hits=2)

    @sub_reward_func(sub_weight=0.75)
    async def sub_b(self, input_data: RewardInput) -> RewardOutput:
        return out(0.5)


def run(processor: AbstractRewardProcessor) -> RewardOutput:
    return anyio.run(processor.process, INPUT)


def test_default_aggregate_is_the_weighted_sum_with_metrics():
    processor = Weighted()
    result = run(processor)
    assert result.status is TaskStatus.SUCCESS
    assert result.reward.reward_score == pytest.approx(0.25 * 1.0 + 0.75 * 0.5)
    assert result.reward.reward_metrics == {"a": 1.0, "sub_b": 0.5, "a.hits": 2.0}
    assert processor.threads["a"] != threading.main_thread().name  # sync ran off the loop


def test_helpers():
    processor = Weighted()
    subs = {"a": out(1.0, x=3), "sub_b": out(0.0)}
    assert processor.get_weights() == {"a": 0.25, "sub_b": 0.75}
    assert processor.get_scores(subs) == {"a": 1.0, "sub_b": 0.0}
    assert processor.get_total(subs) == 0.25
    assert processor.get_reward_metrics(subs) == {"a.x": 3.0}
    with pytest.raises(ValueError, match="'nope'"):
        processor.get_total({"nope": out(1.0)})


@reward_func("failing")
class Failing(AbstractRewardProcessor):
    @sub_reward_func("bad", sub_weight=1.0)
    def bad(self, input_data: RewardInput) -> RewardOutput:
        raise RuntimeError("sandbox down")

    @sub_reward_func("good", sub_weight=2.0)
    async def good(self, input_data: RewardInput) -> RewardOutput:
        return out(1.0)

    @aggregate_func
    async def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        self.seen = sub_rewards
        return out(self.get_total(sub_rewards), failed=float(sub_rewards["bad"].status == "failed"))


def test_a_failing_sub_reward_does_not_sink_the_others():
    processor = Failing()
    result = run(processor)
    bad = processor.seen["bad"]
    assert bad.status is TaskStatus.FAILED and bad.reward.reward_score == 0.0
    assert "sandbox down" in bad.error
    assert processor.seen["good"].status is TaskStatus.SUCCESS
    assert result.reward.reward_score == 2.0
    assert result.reward.reward_metrics == {"failed": 1.0}


@reward_func("concurrent")
class Concurrent(AbstractRewardProcessor):
    @sub_reward_func("s1")
    def s1(self, input_data: RewardInput) -> RewardOutput:
        time.sleep(0.3)
        return out(1.0)

    @sub_reward_func("s2")
    def s2(self, input_data: RewardInput) -> RewardOutput:
        time.sleep(0.3)
        return out(1.0)

    @sub_reward_func("a1")
    async def a1(self, input_data: RewardInput) -> RewardOutput:
        await asyncio.sleep(0.3)
        return out(1.0)

    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        return out(sum(r.reward.reward_score for r in sub_rewards.values()))


def test_sub_rewards_run_concurrently_and_the_loop_stays_free():
    ticks = 0

    async def main() -> RewardOutput:
        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        try:
            return await Concurrent().process(INPUT)
        finally:
            ticker.cancel()

    started = time.monotonic()
    result = anyio.run(main)
    elapsed = time.monotonic() - started
    assert result.reward.reward_score == 3.0
    assert elapsed < 0.8  # three 0.3 s sub-rewards, run together, not one after another
    assert ticks >= 10  # the sync ones never held the event loop


def test_subclass_inherits_and_extends_sub_rewards():
    class More(Weighted):
        @sub_reward_func("c", sub_weight=2.0)
        def sub_c(self, input_data: RewardInput) -> RewardOutput:
            return out(1.0)

    assert More().get_weights() == {"a": 0.25, "sub_b": 0.75, "c": 2.0}
    assert Weighted().get_weights() == {"a": 0.25, "sub_b": 0.75}
    assert run(More()).reward.reward_score == pytest.approx(0.625 + 2.0)


def test_instances_share_no_mutable_state():
    first, second = Weighted(), Weighted()
    first.get_weights()["a"] = 100.0
    assert second.get_weights()["a"] == 0.25
    run(first)
    assert second.threads == {}


def test_sub_rewards_may_return_plain_numbers_or_dicts():
    @reward_func("loose")
    class Loose(AbstractRewardProcessor):
        @sub_reward_func("n")
        def number(self, input_data: RewardInput) -> float:
            return 0.5

        @sub_reward_func("d")
        def mapping(self, input_data: RewardInput) -> dict:
            return {"reward": {"reward_score": 0.25}}

        @sub_reward_func("x")
        def wrong(self, input_data: RewardInput) -> str:
            return "high"

    result = run(Loose())
    assert result.reward.reward_metrics == {"n": 0.5, "d": 0.25, "x": 0.0}
    assert result.reward.reward_score == 0.75


def test_decorator_misuse_is_reported():
    with pytest.raises(TypeError, match="no @sub_reward_func"):

        @reward_func("empty")
        class Empty(AbstractRewardProcessor):
            pass

    with pytest.raises(TypeError, match="AbstractRewardProcessor"):

        @reward_func("plain")
        class Plain:
            pass

    with pytest.raises(TypeError, match="'same'"):

        @reward_func("dup")
        class Dup(AbstractRewardProcessor):
            @sub_reward_func("same")
            def one(self, input_data): ...

            @sub_reward_func("same")
            def two(self, input_data): ...


def test_undecorated_subclass_without_process_is_abstract():
    class Forgot(AbstractRewardProcessor):
        pass

    with pytest.raises(TypeError):
        Forgot()
