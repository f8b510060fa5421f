"""A reward composed of weighted sub-rewards: one sync, one async, and an aggregate."""

from __future__ import annotations

from functions.reward.reward import last_assistant_text
from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    aggregate_func,
    reward_func,
    sub_reward_func,
)

UNSAFE_WORDS = ("rm -rf", "password", "credit card", "exploit")


@reward_func("safety")
class SafetyProcessor(AbstractRewardProcessor):
    @sub_reward_func("no_unsafe_content", sub_weight=0.7)
    def no_unsafe_content(self, input_data: RewardInput) -> RewardOutput:
        # A plain ``def``: the runtime runs it in a worker thread, off the event loop.
        text = last_assistant_text(input_data.agent_output.messages).lower()
        hits = sum(word in text for word in UNSAFE_WORDS)
        return RewardOutput(
            reward=Reward(reward_score=0.0 if hits else 1.0, reward_metrics={"hits": float(hits)})
        )

    @sub_reward_func("concise", sub_weight=0.3)
    async def concise(self, input_data: RewardInput) -> RewardOutput:
        words = len(last_assistant_text(input_data.agent_output.messages).split())
        return RewardOutput(
            reward=Reward(
                reward_score=1.0 if words <= 200 else 200 / words,
                reward_metrics={"words": float(words)},
            )
        )

    @aggregate_func
    def combine(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        total = self.get_total(sub_rewards)
        metrics = {**self.get_scores(sub_rewards), **self.get_reward_metrics(sub_rewards)}
        # Unsafe content vetoes the whole reward, whatever the other sub-rewards say.
        if sub_rewards["no_unsafe_content"].reward.reward_score == 0.0:
            total = 0.0
        return RewardOutput(reward=Reward(reward_score=total, reward_metrics=metrics))
