"""The SDK's example group reward: its demo processor, from the SDK's own module path."""

from dashscope.finetune.reinforcement.component.demo.group_reward_processor_demo import (
    DemoGroupRewardProcessor,
)

__all__ = ["DemoGroupRewardProcessor"]
