"""The benchmark's processors, written against this runtime."""

import asyncio

from processors_base import (
    AbstractGroupRewardProcessor,
    AbstractRewardProcessor,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RewardInput,
    RewardOutput,
)


class EchoReward(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=len(input_data.agent_output.messages or [])))


class SyncEchoReward(AbstractRewardProcessor):
    def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=len(input_data.agent_output.messages or [])))


class WaitReward(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        await asyncio.sleep(0.1)
        return RewardOutput(reward=Reward(reward_score=len(input_data.agent_output.messages or [])))


class GroupEcho(AbstractGroupRewardProcessor):
    async def process(self, input_data: GroupRewardInput) -> GroupRewardOutput:
        rewards = [Reward(reward_score=len(o.messages or [])) for o in input_data.agent_outputs]
        return GroupRewardOutput(reward=GroupReward(rewards=rewards))
