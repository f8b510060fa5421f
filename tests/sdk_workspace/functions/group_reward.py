"""A group reward in the SDK's style."""

from dashscope.finetune.reinforcement import (
    AbstractGroupRewardProcessor,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
)


class RankGroupReward(AbstractGroupRewardProcessor):
    async def process(self, input_data: GroupRewardInput) -> GroupRewardOutput:
        lengths = [len(o.messages or []) for o in input_data.agent_outputs]
        top = max(lengths) if lengths else 0
        return GroupRewardOutput(
            reward=GroupReward(
                rewards=[Reward(reward_score=1.0 if n == top else 0.0) for n in lengths]
            )
        )
