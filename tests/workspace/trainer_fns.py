"""Reward processors for the trainer-protocol tests: what they saw, and how they fail."""

from __future__ import annotations

import asyncio
import os
import time

from processors_base import AbstractRewardProcessor, Reward, RewardInput, RewardOutput


def _answer(input_data: RewardInput) -> str:
    messages = input_data.agent_output.messages or []
    assistant = [m for m in messages if m.get("role") == "assistant" and m.get("content")]
    return str(assistant[-1]["content"]).strip() if assistant else ""


class MatchReward(AbstractRewardProcessor):
    """1.0 when the last assistant text equals the ground truth. ``RAISE`` raises, ``HANG``
    never returns, and ``PAIR`` waits for a second ``PAIR`` to run at the same time (so a
    batch run one sample after the other would hang). The metrics say what it was given."""

    def setup(self) -> None:
        self.pairs = 0
        self.paired = asyncio.Event()

    async def process(self, input_data: RewardInput) -> RewardOutput:
        answer = _answer(input_data)
        if answer == "RAISE":
            raise ValueError("the judge broke")
        if answer == "HANG":
            await asyncio.sleep(3600)
        if answer == "PAIR":
            self.pairs += 1
            if self.pairs % 2 == 0:
                self.paired.set()
            await self.paired.wait()
        messages = input_data.agent_output.messages or []
        extra = input_data.agent_output.rollout_extra or {}
        metrics = {
            "messages": float(len(messages)),
            "user_turns": float(sum(m.get("role") == "user" for m in messages)),
            "tool_turns": float(sum(m.get("role") == "tool" for m in messages)),
            "answer_chars": float(len(answer)),
            "has_tools": 1.0 if extra.get("tools") else 0.0,
        }
        score = 1.0 if answer == str(input_data.ground_truth).strip() else 0.0
        return RewardOutput(reward=Reward(reward_score=score, reward_metrics=metrics))


class SyncHangReward(AbstractRewardProcessor):
    """Sync code that hangs on ``HANG``: only --isolation process can kill it."""

    def process(self, input_data: RewardInput) -> RewardOutput:
        if _answer(input_data) == "HANG":
            time.sleep(3600)
        return RewardOutput(reward=Reward(reward_score=1.0))


class PidReward(AbstractRewardProcessor):
    """Says which process answered and how many times setup() ran in it."""

    setups = 0

    def setup(self) -> None:
        PidReward.setups += 1

    async def process(self, input_data: RewardInput) -> RewardOutput:
        metrics = {"pid": float(os.getpid()), "setups": float(PidReward.setups)}
        return RewardOutput(reward=Reward(reward_score=1.0, reward_metrics=metrics))
