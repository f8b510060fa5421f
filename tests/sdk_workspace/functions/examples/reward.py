"""The SDK's example reward: its demo processor, imported from the SDK's own path."""

from dashscope.finetune.reinforcement.component.demo import DemoRewardProcessor

__all__ = ["DemoRewardProcessor"]
