"""A reward written in the DashScope SDK's import style (our code, their style)."""

from dashscope.finetune.reinforcement.common.log import logger
from dashscope.finetune.reinforcement.component.data.base_data_model import TaskStatus
from dashscope.finetune.reinforcement.component.data.reward_input import RewardInput
from dashscope.finetune.reinforcement.component.data.reward_output import Reward, RewardOutput
from dashscope.finetune.reinforcement.component.processor.abstract_reward_processor import (
    AbstractRewardProcessor,
)


class ExactMatchReward(AbstractRewardProcessor):
    def setup(self) -> None:
        self.normalise = str.strip
        logger.info("ExactMatchReward ready")

    def process(self, input_data: RewardInput) -> RewardOutput:
        messages = input_data.agent_output.messages or []
        answer = self.normalise(str(messages[-1].get("content", ""))) if messages else ""
        matched = answer == self.normalise(str(input_data.ground_truth))
        return RewardOutput(
            reward=Reward(
                reward_score=1.0 if matched else 0.0, reward_metrics={"len": float(len(answer))}
            ),
            status=TaskStatus.SUCCESS,
        )
