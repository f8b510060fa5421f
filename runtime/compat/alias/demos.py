"""The SDK's three demo processors, with the same scoring rules and echo, on our bases."""

from __future__ import annotations

from processors_base.log import logger
from processors_base.models import (
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
from processors_base.processors import (
    AbstractGroupRewardProcessor,
    AbstractRewardProcessor,
    AbstractRolloutProcessor,
)

__all__ = ["DemoGroupRewardProcessor", "DemoRewardProcessor", "DemoRolloutProcessor"]


def _score(output: AgentOutput, ground_truth: object) -> Reward:
    """1.0 when the ground truth appears in a message's text, 0.5 for other non-empty
    trajectories, 0.0 without a ground truth or messages; metrics are the rollout's."""
    score = 0.0
    if ground_truth is not None and output.messages:
        needle = str(ground_truth)
        texts = (m.get("content") for m in output.messages)
        score = 1.0 if any(isinstance(t, str) and needle in t for t in texts) else 0.5
    return Reward(reward_score=score, reward_metrics=output.rollout_metrics)


class DemoRewardProcessor(AbstractRewardProcessor):
    def setup(self) -> None:
        logger.info("DemoRewardProcessor ready")

    def process(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=_score(input_data.agent_output, input_data.ground_truth))


class DemoGroupRewardProcessor(AbstractGroupRewardProcessor):
    def setup(self) -> None:
        logger.info("DemoGroupRewardProcessor ready")

    def process(self, input_data: GroupRewardInput) -> GroupRewardOutput:
        rewards = [_score(o, input_data.ground_truth) for o in input_data.agent_outputs]
        return GroupRewardOutput(reward=GroupReward(rewards=rewards))


class DemoRolloutProcessor(AbstractRolloutProcessor):
    """Calls no model: answers the last user message with an echo of it."""

    def setup(self) -> None:
        logger.info("DemoRolloutProcessor ready")

    def process(self, input_data: RolloutInput) -> RolloutOutput:
        messages = list(input_data.messages)
        last = next(
            (m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), ""
        )
        messages.append({"role": "assistant", "content": f"[DemoRolloutProcessor Echo] {last}"})
        return RolloutOutput(
            agent_output=AgentOutput(
                messages=messages, rollout_extra=input_data.rollout_extra, rollout_metrics={}
            )
        )
