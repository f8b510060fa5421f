"""The SDK's example rollout that calls no model: its demo processor."""

from dashscope.finetune.reinforcement.component.demo import DemoRolloutProcessor

__all__ = ["DemoRolloutProcessor"]
