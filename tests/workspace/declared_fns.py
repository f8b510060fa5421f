"""Reward processors that declare their metrics (tests/trainers/test_declared_metrics.py).

``DeclaredReward`` declares ``answer_found`` and ``format_ok``: ``RAISE`` raises, ``EXTRA``
also reports ``surprise``, which it does not declare. The others declare badly.
"""

from __future__ import annotations

from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput


def _answer(input_data: RewardInput) -> str:
    messages = input_data.agent_output.messages or []
    return str(messages[-1].get("content") or "").strip() if messages else ""


class DeclaredReward(AbstractRewardProcessor):
    metric_names = ("answer_found", "format_ok")

    async def process(self, input_data: RewardInput) -> RewardOutput:
        answer = _answer(input_data)
        if answer == "RAISE":
            raise ValueError("the judge broke")
        metrics = {"answer_found": float(bool(answer)), "format_ok": 1.0}
        if answer == "EXTRA":
            metrics["surprise"] = 1.0
        score = 1.0 if answer == str(input_data.ground_truth) else 0.0
        return RewardOutput(reward=Reward(reward_score=score, reward_metrics=metrics))


class NotANameReward(AbstractRewardProcessor):
    metric_names = ("answer_found", 3)  # type: ignore[assignment]  # the error under test

    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))


class ReservedNameReward(AbstractRewardProcessor):
    metric_names = ("answer_found", "reward_failed")

    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))
