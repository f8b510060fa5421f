"""Group reward: each output scored against ground_truth, then normalised within the group."""

from __future__ import annotations

import statistics

from functions.reward.reward import score
from processors_base import (
    AbstractGroupRewardProcessor,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
)


class DemoGroupRewardProcessor(AbstractGroupRewardProcessor):
    async def process(self, input_data: GroupRewardInput) -> GroupRewardOutput:
        raw = [score(o.messages, input_data.ground_truth)[0] for o in input_data.agent_outputs]
        mean = statistics.fmean(raw) if raw else 0.0
        spread = statistics.pstdev(raw) if len(raw) > 1 else 0.0
        rewards = [
            Reward(
                reward_score=(value - mean) / spread if spread > 0 else 0.0,
                reward_metrics={"raw_score": value, "group_mean": mean},
            )
            for value in raw
        ]
        return GroupRewardOutput(reward=GroupReward(rewards=rewards))
