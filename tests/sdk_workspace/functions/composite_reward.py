"""A decorated reward in the SDK's style: sync and async sub-rewards and an aggregate."""

import asyncio

from dashscope.finetune.reinforcement import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    aggregate_func,
    reward_func,
    sub_reward_func,
)


@reward_func("composite")
class CompositeReward(AbstractRewardProcessor):
    @sub_reward_func("has_answer", sub_weight=0.4)
    def has_answer(self, input_data: RewardInput) -> RewardOutput:
        messages = input_data.agent_output.messages or []
        return RewardOutput(reward=Reward(reward_score=1.0 if messages else 0.0))

    @sub_reward_func("correct", sub_weight=0.6)
    async def correct(self, input_data: RewardInput) -> RewardOutput:
        await asyncio.sleep(0)
        messages = input_data.agent_output.messages or []
        last = str(messages[-1].get("content", "")) if messages else ""
        return RewardOutput(
            reward=Reward(reward_score=1.0 if last.strip() == str(input_data.ground_truth) else 0.0)
        )

    @aggregate_func
    def aggregate(self, sub_rewards: dict) -> RewardOutput:
        total = sum(
            sub_rewards[name].reward.reward_score * weight
            for name, weight in {"has_answer": 0.4, "correct": 0.6}.items()
        )
        metrics = {name: out.reward.reward_score for name, out in sub_rewards.items()}
        return RewardOutput(reward=Reward(reward_score=total, reward_metrics=metrics))
