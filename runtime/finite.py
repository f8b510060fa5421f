"""Non-finite scores and metrics in an output: found before the output is sent.

JSON has no NaN or Infinity: serialised, they become ``null``, which the platform (and
our own models) then reject, or worse read as a missing score. So a processor that
returns one gets a 500 ``INVALID_OUTPUT`` naming the field instead. Only the typed
numbers are checked (scores and metrics), on the attributes directly: a few hundred
nanoseconds per request, and free-form fields (messages, ``rollout_extra``) keep
serialising as they always have.
"""

from __future__ import annotations

from collections.abc import Callable
from math import isfinite
from typing import Any

from processors_base.models import GroupRewardOutput, RewardOutput, RolloutOutput

__all__ = ["Found", "finder_for"]

Found = tuple[str, float]  # (the field's path, its value)


def finder_for(output_model: type) -> Callable[[Any], Found | None]:
    """For one output model, a function that finds its first non-finite score or metric."""
    if issubclass(output_model, RewardOutput):
        return _reward_output
    if issubclass(output_model, GroupRewardOutput):
        return _group_reward_output
    if issubclass(output_model, RolloutOutput):
        return _rollout_output
    return _nothing


def _bad(value: Any) -> bool:
    return isinstance(value, float) and not isfinite(value)


def _in_metrics(metrics: Any, path: str) -> Found | None:
    if metrics:
        for key, value in metrics.items():
            if _bad(value):
                return f"{path}[{key!r}]", value
    return None


def _in_reward(reward: Any, path: str) -> Found | None:
    score = reward.reward_score
    if _bad(score):
        return f"{path}.reward_score", score
    return _in_metrics(reward.reward_metrics, f"{path}.reward_metrics")


def _reward_output(output: Any) -> Found | None:
    reward = output.reward
    try:  # the hot path (echo rewards): one finite score, no metrics
        if isfinite(reward.reward_score) and not reward.reward_metrics:
            return None
    except (TypeError, OverflowError):  # not a float at all: the serialiser will say so
        return None
    return _in_reward(reward, "reward")


def _group_reward_output(output: Any) -> Found | None:
    for index, reward in enumerate(output.reward.rewards):
        found = _in_reward(reward, f"reward.rewards[{index}]")
        if found is not None:
            return found
    return None


def _rollout_output(output: Any) -> Found | None:
    agent_output = output.agent_output
    if agent_output is None:
        return None
    if _bad(agent_output.reward_score):
        return "agent_output.reward_score", agent_output.reward_score
    return _in_metrics(agent_output.rollout_metrics, "agent_output.rollout_metrics")


def _nothing(output: Any) -> Found | None:
    return None
