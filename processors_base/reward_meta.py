"""The SDK's view of a decorated reward processor (``processor.reward_meta``), built from
the reward registry: for code written against the SDK that reads its sub-rewards."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from processors_base.rewards import registry_of

__all__ = ["AggregateFunction", "RewardProcessorMeta", "SubRewardFunction", "meta_of"]


class SubRewardFunction:
    """One sub-reward: its name, function and weight, and the last score it gave."""

    def __init__(self, name: str, func: Callable[..., Any], weight: float = 1.0) -> None:
        self.name = name
        self.func = func
        self.weight = weight
        self.score = 0.0
        self.reward_metrics: dict[str, float] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> SubRewardFunction:
        # a copy shares the function and starts with no score
        return SubRewardFunction(self.name, self.func, self.weight)


class AggregateFunction:
    """The function that combines the sub-rewards' outputs."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func

    def __deepcopy__(self, memo: dict[int, Any]) -> AggregateFunction:
        return AggregateFunction(self.func)


class RewardProcessorMeta:
    """A reward processor's id, its sub-rewards by name, and its aggregate (or None)."""

    def __init__(self, processor_id: str) -> None:
        self.processor_id = processor_id
        self.sub_functions: dict[str, SubRewardFunction] = {}
        self.aggregate_function: AggregateFunction | None = None
        self._copy: RewardProcessorMeta | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> RewardProcessorMeta:
        twin = RewardProcessorMeta(self.processor_id)
        twin.sub_functions = {n: copy.deepcopy(f, memo) for n, f in self.sub_functions.items()}
        twin.aggregate_function = copy.deepcopy(self.aggregate_function, memo)
        return twin

    def copy(self) -> RewardProcessorMeta:
        """A deep copy, made once and then reused."""
        if self._copy is None:
            self._copy = copy.deepcopy(self)
        return self._copy


def meta_of(cls: type) -> RewardProcessorMeta | None:
    """The meta of a ``@reward_func`` class; None for a class that was not decorated."""
    registry = registry_of(cls)
    if registry.name is None and not registry.sub_rewards:
        return None
    meta = RewardProcessorMeta(registry.name or cls.__name__)
    for sub in registry.sub_rewards:
        meta.sub_functions[sub.name] = SubRewardFunction(
            sub.name, getattr(cls, sub.attr), sub.weight
        )
    if registry.aggregate is not None:
        meta.aggregate_function = AggregateFunction(getattr(cls, registry.aggregate))
    return meta
