"""Rewards for the tests of verl's own reward managers (tests/trainers/test_verl_own_code.py).

``VerlBatchReward`` scores the answer's number when it equals the ground truth (else 0.0), so
every sample of a batch has a score of its own; its metrics say which sample
(``extra_info.index``) it was given and what verl added to it. ``RAISE`` raises, ``FAILED``
answers a failed result. A sample
whose ``extra_info`` says ``hold`` waits (at most 60 s) for a ``RELEASE`` request, so that
a test can have a failed sample's result read before any other's; one whose ``extra_info``
says ``sleep`` takes that many seconds.
"""

from __future__ import annotations

import asyncio
import contextlib

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
)


class VerlBatchReward(AbstractRewardProcessor):
    def setup(self) -> None:
        self.released = asyncio.Event()

    async def process(self, input_data: RewardInput) -> RewardOutput:
        messages = input_data.agent_output.messages or []
        answer = str(messages[-1].get("content") or "").strip() if messages else ""
        if answer == "RELEASE":
            self.released.set()
            return RewardOutput(reward=Reward(reward_score=0.0))
        if answer == "RAISE":
            raise ValueError("the judge broke")
        if answer == "FAILED":
            failed = RewardOutput(reward=Reward(reward_score=0.0), status=TaskStatus.FAILED)
            return failed.model_copy(update={"error": "the sandbox was down"})
        extra = input_data.agent_output.rollout_extra or {}
        info = extra.get("extra_info") or {}
        if info.get("sleep"):  # a judge that takes this long
            await asyncio.sleep(float(info["sleep"]))
        if info.get("hold"):
            with contextlib.suppress(asyncio.TimeoutError):  # not the builtin before 3.11
                await asyncio.wait_for(self.released.wait(), 60)
        score = float(answer) if answer == str(input_data.ground_truth).strip() else 0.0
        metrics = {
            "index": float(info.get("index", -1)),
            "gsm8k": 1.0 if extra.get("data_source") == "openai/gsm8k" else 0.0,
            # verl's batch manager adds the rollout's own scores to every extra_info
            "has_rollout_scores": 1.0 if "rollout_reward_scores" in info else 0.0,
        }
        return RewardOutput(reward=Reward(reward_score=score, reward_metrics=metrics))


class VerlDeclaredReward(VerlBatchReward):
    """The same, with its metric names declared: known before any sample has succeeded."""

    metric_names = ("index", "gsm8k", "has_rollout_scores")
