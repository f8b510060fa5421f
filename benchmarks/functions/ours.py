"""The benchmark's processors, written against this runtime."""

import asyncio
from typing import TYPE_CHECKING

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
)

if TYPE_CHECKING:  # imported by the rollout's first call: not in the cold start of the
    import aiohttp  # echo rewards, which this module also serves


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


class LongRollout(AbstractRolloutProcessor):
    """An agent's turn: one chat completion from the model the request names, which takes
    seconds (the stand-in LLM of scenario 9), and the trajectory with its answer. Through
    aiohttp: with httpx's pool at 5,000 connections the bare app served 2 req/s here, its
    core saturated."""

    llm: "aiohttp.ClientSession | None" = None

    async def process(self, input_data: RolloutInput) -> RolloutOutput:
        if self.llm is None:  # one pool for every rollout: thousands of connections at once
            import aiohttp

            self.llm = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        url = f"{input_data.model_resource.base_url}/chat/completions"
        async with self.llm.post(url, json={"messages": input_data.messages}) as answer:
            reply = {"role": "assistant", "content": await answer.text()}
        return RolloutOutput(agent_output=AgentOutput(messages=[*input_data.messages, reply]))
