"""Reward processors for tests/trainers/test_trainer_attacks.py."""

from __future__ import annotations

from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput, TaskStatus


class OwnCodeReward(AbstractRewardProcessor):
    """An answer ``CODE <text>`` fails with ``<text>`` as its error_code (a code of the
    function's own: unbounded text); ``RAISE`` raises; the ``LONE_*`` answers carry a lone
    surrogate (bytes decoded with surrogateescape, as sandbox output often is) in their
    error, exception or metric name; anything else scores 1.0."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        messages = input_data.agent_output.messages or []
        answer = str(messages[-1].get("content") or "") if messages else ""
        if answer.startswith("CODE "):
            return RewardOutput(
                reward=Reward(reward_score=0.0),
                status=TaskStatus.FAILED,
                error="the judge said no",
                error_code=answer.removeprefix("CODE "),
            )
        if answer == "RAISE":
            raise ValueError("the judge broke")
        lone = b"\xff".decode("utf-8", "surrogateescape")
        if answer == "LONE_ERROR":
            failed = RewardOutput(reward=Reward(reward_score=0.0), status=TaskStatus.FAILED)
            return failed.model_copy(update={"error": f"sandbox said {lone}"})
        if answer == "LONE_RAISE":
            raise ValueError(f"sandbox said {lone}")
        if answer == "LONE_METRIC":
            return RewardOutput(reward=Reward(reward_score=1.0, reward_metrics={f"m{lone}": 1.0}))
        return RewardOutput(reward=Reward(reward_score=1.0))
