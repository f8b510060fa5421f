"""Reward processors for tests/serving/test_request_lines.py."""

from __future__ import annotations

import asyncio

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    logger,
    reward_func,
    sub_reward_func,
)


def _answer(input_data: RewardInput) -> str:
    messages = input_data.agent_output.messages or []
    return str(messages[-1].get("content") or "") if messages else ""


@reward_func("paired_judges")
class PairedJudgesReward(AbstractRewardProcessor):
    """Two requests judged at once: each waits in ``first`` until the other is there. Each
    logs a line of its own; answer ``A`` fails ``first``, ``B`` fails ``second`` (two names:
    a sub-reward's failures are logged once a minute)."""

    def setup(self) -> None:
        self.waiting = 0
        self.both = asyncio.Event()

    async def _judge(self, input_data: RewardInput, name: str) -> RewardOutput:
        answer = _answer(input_data)
        if name == "first":
            logger.warning("judging %s", answer)
            self.waiting += 1
            if self.waiting == 2:
                self.both.set()
            await asyncio.wait_for(self.both.wait(), 60)
        if answer == {"first": "A", "second": "B"}[name]:
            raise ConnectionError(f"judge {name} is down for {answer}")
        return RewardOutput(reward=Reward(reward_score=1.0))

    @sub_reward_func("first", sub_weight=0.5)
    async def first(self, input_data: RewardInput) -> RewardOutput:
        return await self._judge(input_data, "first")

    @sub_reward_func("second", sub_weight=0.5)
    async def second(self, input_data: RewardInput) -> RewardOutput:
        return await self._judge(input_data, "second")
