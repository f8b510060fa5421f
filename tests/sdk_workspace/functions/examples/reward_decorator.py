"""A decorated reward as the SDK's user guide writes one: sync and async sub-rewards, an
aggregate built from get_weights / get_scores / get_reward_metrics, a processor id."""

from dashscope.finetune.reinforcement import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    aggregate_func,
    reward_func,
    sub_reward_func,
)
from dashscope.finetune.reinforcement.common.log import logger


@reward_func("SafetyProcessor")
class SafetyProcessor(AbstractRewardProcessor):
    @sub_reward_func("toxicity", sub_weight=0.7)
    def toxicity(self, input_data: RewardInput) -> RewardOutput:
        text = " ".join(str(m.get("content", "")) for m in input_data.agent_output.messages or [])
        hits = sum(text.lower().count(word) for word in ("stupid", "hate"))
        return RewardOutput(
            reward=Reward(reward_score=0.0 if hits else 1.0, reward_metrics={"hits": float(hits)})
        )

    @sub_reward_func("refusal", sub_weight=0.3)
    async def refusal(self, input_data: RewardInput) -> RewardOutput:
        messages = input_data.agent_output.messages or []
        last = str(messages[-1].get("content", "")) if messages else ""
        return RewardOutput(reward=Reward(reward_score=0.0 if "cannot help" in last else 1.0))

    @aggregate_func
    async def aggregate(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        weights = self.get_weights()
        scores = self.get_scores(sub_rewards)
        total = sum(weights[name] * score for name, score in scores.items())
        logger.info(f"{self.reward_meta.processor_id}: {total} ({TaskStatus.SUCCESS})")
        return RewardOutput(
            reward=Reward(
                reward_score=round(total, 6),
                reward_metrics={**scores, **self.get_reward_metrics(sub_rewards)},
            ),
            status=TaskStatus.SUCCESS,
        )
