"""The SDK's view of a decorated reward processor (``processor.reward_meta``), built from
the reward registry: for code written against the SDK that reads its sub-rewards."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from processors_base.rewards import registry_of

__all__ = [
    "AggregateFunction",
    "RewardMetaAttribute",
    "RewardProcessorMeta",
    "SubRewardFunction",
    "meta_of",
]


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


_CLASS_META = "__reward_meta_of_class__"


def meta_of(cls: type, instance: Any = None) -> RewardProcessorMeta | None:
    """The meta of a reward processor class, with its sub-rewards as plain functions;
    None for a class that was not decorated (as under the SDK, it has none).

    With ``instance``: that instance's own meta, its functions bound to it (so
    ``run_in_executor(self.executor, sf.func, x)`` works); an undecorated class gets the
    SDK's ``RewardProcessorMeta("default")`` with whatever sub-rewards it tags."""
    registry = registry_of(cls)
    if registry.name is None and instance is None:
        return None
    owner: Any = cls if instance is None else instance
    meta = RewardProcessorMeta(registry.name if registry.name is not None else "default")
    for sub in registry.sub_rewards:
        meta.sub_functions[sub.name] = SubRewardFunction(
            sub.name, getattr(owner, sub.attr), sub.weight
        )
    if registry.aggregate is not None:
        meta.aggregate_function = AggregateFunction(getattr(owner, registry.aggregate))
    return meta


class RewardMetaAttribute:
    """``reward_meta`` of a reward processor, as the SDK has it.

    On the class: the class's meta (``Cls.reward_meta.processor_id``); AttributeError on
    an undecorated class, as under the SDK. On an instance: its own meta, made on first
    use and then kept in the instance (a plain attribute from there on, so reading it on
    every request costs a dict lookup, and changing a weight in ``setup()`` counts)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type) -> RewardProcessorMeta:
        if instance is None:
            meta = owner.__dict__.get(_CLASS_META)
            if meta is None:
                meta = meta_of(owner)
                if meta is None:
                    raise AttributeError(
                        f"{owner.__name__} is not a @reward_func processor: it has no "
                        "reward_meta (its instances have the SDK's default one)"
                    )
                setattr(owner, _CLASS_META, meta)
            return meta
        meta = meta_of(owner, instance)
        assert meta is not None
        instance.__dict__[self.name] = meta
        return meta
