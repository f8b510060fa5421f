"""Non-finite scores and metrics in an output: found before the output is sent.

JSON has no NaN or Infinity: serialised, they become ``null``, which the platform (and
our own models) then reject, or worse read as a missing score. So a processor that
returns one gets a 500 ``INVALID_OUTPUT`` naming the field instead. Only the typed
numbers are checked (scores and metrics), on the attributes directly: a few hundred
nanoseconds per request, and free-form fields (messages, ``rollout_extra``) keep
serialising as they always have.

Free-form fields (``rollout_extra``, extra fields of an output) are checked as they are
serialised: with a serialiser that writes ``NaN``/``Infinity`` instead of ``null``
(``ser_json_inf_nan="constants"``, the same cost), a search of the bytes for those two
words (well under a microsecond for a reward's body; about 1 us per KB of a text with
capital Ns and Is) and, only when one is there (it may be inside a string), a parse that
names the field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from math import isfinite
from typing import Any, cast

from pydantic import BaseModel, ConfigDict
from pydantic_core import SchemaSerializer

from processors_base.models import GroupRewardOutput, RewardOutput, RolloutOutput

__all__ = ["Found", "constant_in", "finder_for", "strict_serializer"]

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
    rewards = output.reward.rewards
    try:  # the hot path: finite scores, no metrics; a path is built only for a bad one
        if all(isfinite(r.reward_score) and not r.reward_metrics for r in rewards):
            return None
    except (TypeError, OverflowError):  # not a float: the serialiser will say so
        pass
    for index, reward in enumerate(rewards):
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


@functools.lru_cache(maxsize=64)
def strict_serializer(model: type[BaseModel]) -> SchemaSerializer:
    """``model``'s serialiser, writing NaN and Infinity as such (not as ``null``) so that
    ``constant_in`` can find them; the model's own one if it cannot be derived."""
    try:
        config = ConfigDict(**model.model_config, ser_json_inf_nan="constants")
        # type()'s three-argument form is typed as returning a bare `type`: here a subclass
        strict = cast(
            "type[BaseModel]",
            type(
                model.__name__, (model,), {"model_config": config, "__module__": model.__module__}
            ),
        )
        return strict.__pydantic_serializer__
    except Exception:
        return model.__pydantic_serializer__


def constant_in(data: bytes) -> Found | None:
    """The first NaN or Infinity in JSON written by ``strict_serializer``: its path and value."""
    # single bytes first (memchr: a microsecond per 100 KB, where a three-byte search
    # takes 50 times that); most reward outputs have neither a capital N nor an I
    if (b"N" not in data or b"NaN" not in data) and (b"I" not in data or b"Infinity" not in data):
        return None
    return _find(json.loads(data), "")


def _find(value: Any, path: str) -> Found | None:
    if isinstance(value, float):
        return None if isfinite(value) else (path or "(output)", value)
    if isinstance(value, dict):
        items: Any = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for inner_path, item in items:
        found = _find(item, inner_path)
        if found is not None:
            return found
    return None
