"""A reward written for the SDK that the old registry refused at import."""

from __future__ import annotations

from processors_base import AbstractRewardProcessor, reward_func


@reward_func(processor_id="no_subs")
class NoSubRewards(AbstractRewardProcessor):
    """No sub-rewards: the SDK serves it, scoring 0.0."""
