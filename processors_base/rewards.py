"""The reward registry: a reward composed of weighted sub-rewards.

    @reward_func("math")
    class MathReward(AbstractRewardProcessor):
        @sub_reward_func("format", sub_weight=0.2)
        def format_ok(self, input_data): ...

        @sub_reward_func("answer", sub_weight=0.8)
        async def answer_ok(self, input_data): ...

        @aggregate_func                          # optional
        def combine(self, sub_rewards): ...

The decorators only tag functions; nothing is wrapped, so a sub-reward stays an
ordinary method. The registry of a class is read once from its MRO (so subclasses
inherit and may add sub-rewards), frozen, and cached on the class: instances share no
mutable state through it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio.to_thread

from processors_base.models import Reward, RewardInput, RewardOutput, TaskStatus

__all__ = [
    "RewardRegistry",
    "SubReward",
    "aggregate_func",
    "registry_of",
    "reward_func",
    "sub_reward_func",
]

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)

_SUB_REWARD_TAG = "__sub_reward__"
_AGGREGATE_TAG = "__aggregate_func__"
_NAME_ATTR = "__reward_name__"
_CACHE_ATTR = "__reward_registry__"


@dataclass(frozen=True)
class SubReward:
    name: str
    weight: float
    attr: str
    is_async: bool


@dataclass(frozen=True)
class RewardRegistry:
    name: str | None
    sub_rewards: tuple[SubReward, ...]
    aggregate: str | None
    aggregate_is_async: bool


def sub_reward_func(name: str | None = None, sub_weight: float = 1.0) -> Callable[[F], F]:
    """Register a method as a sub-reward named ``name`` (default: the method's name)."""
    if callable(name):  # used bare, as ``@sub_reward_func``
        return sub_reward_func()(name)
    if isinstance(sub_weight, bool) or not isinstance(sub_weight, (int, float)):
        raise TypeError(f"sub_weight must be a number, got {sub_weight!r}")

    def tag(func: F) -> F:
        setattr(func, _SUB_REWARD_TAG, (name or func.__name__, float(sub_weight)))
        return func

    return tag


def aggregate_func(func: F) -> F:
    """Register the method that combines ``{name: RewardOutput}`` into the final output."""
    setattr(func, _AGGREGATE_TAG, True)
    return func


def reward_func(name: str) -> Callable[[C], C]:
    """Make a reward processor out of its sub-rewards; the class needs no ``process``."""

    def decorate(cls: C) -> C:
        from processors_base.processors import AbstractRewardProcessor

        if not (isinstance(cls, type) and issubclass(cls, AbstractRewardProcessor)):
            raise TypeError(
                f"@reward_func({name!r}) must decorate an AbstractRewardProcessor class"
            )
        setattr(cls, _NAME_ATTR, name)
        if "process" in getattr(cls, "__abstractmethods__", ()):
            cls.process = _process_registered
            cls.__abstractmethods__ = frozenset(cls.__abstractmethods__ - {"process"})
        registry = _build_registry(cls)
        if not registry.sub_rewards:
            raise TypeError(f"@reward_func({name!r}) on {cls.__name__}: no @sub_reward_func method")
        return cls

    return decorate


def registry_of(cls: type) -> RewardRegistry:
    """The frozen registry of a reward processor class (empty when undecorated)."""
    cached = cls.__dict__.get(_CACHE_ATTR)
    if cached is None:
        cached = _build_registry(cls)
        setattr(cls, _CACHE_ATTR, cached)
    return cached


def _build_registry(cls: type) -> RewardRegistry:
    by_attr: dict[str, SubReward] = {}
    aggregate: tuple[str, bool] | None = None
    for klass in reversed(cls.__mro__):
        own_aggregates = []
        for attr, value in vars(klass).items():
            if not callable(value):
                continue
            func = inspect.unwrap(value)
            tag = getattr(value, _SUB_REWARD_TAG, None)
            if tag is not None:
                by_attr[attr] = SubReward(tag[0], tag[1], attr, inspect.iscoroutinefunction(func))
            elif attr in by_attr:  # overridden without the decorator: no longer a sub-reward
                del by_attr[attr]
            if getattr(value, _AGGREGATE_TAG, False):
                own_aggregates.append((attr, inspect.iscoroutinefunction(func)))
        if len(own_aggregates) > 1:
            names = ", ".join(a for a, _ in own_aggregates)
            raise TypeError(f"{klass.__name__} has more than one @aggregate_func: {names}")
        if own_aggregates:
            aggregate = own_aggregates[0]
    seen: dict[str, str] = {}
    for sub in by_attr.values():
        if sub.name in seen:
            raise TypeError(
                f"{cls.__name__}: sub-reward name {sub.name!r} is used by both "
                f"{seen[sub.name]}() and {sub.attr}()"
            )
        seen[sub.name] = sub.attr
    return RewardRegistry(
        name=getattr(cls, _NAME_ATTR, None),
        sub_rewards=tuple(by_attr.values()),
        aggregate=aggregate[0] if aggregate else None,
        aggregate_is_async=aggregate[1] if aggregate else False,
    )


async def _call(processor: Any, attr: str, is_async: bool, arg: Any) -> Any:
    if is_async:
        return await getattr(processor, attr)(arg)
    # Sync user code never runs on the event loop. A runtime may offload it (a bounded
    # thread pool, or killable child processes) by giving the instance an awaitable
    # ``_runtime_offload(attr, arg)``; otherwise it runs in anyio's worker threads.
    offload = getattr(processor, "_runtime_offload", None)
    if offload is not None:
        return await offload(attr, arg)
    return await anyio.to_thread.run_sync(getattr(processor, attr), arg, abandon_on_cancel=True)


def _as_reward_output(value: Any) -> RewardOutput:
    if isinstance(value, RewardOutput):
        return value
    if isinstance(value, bool):
        raise TypeError(f"returned a bool ({value}); return a RewardOutput")
    if isinstance(value, (int, float)):
        return RewardOutput(reward=Reward(reward_score=value))
    if hasattr(value, "model_dump"):  # the same model from another package (the SDK's)
        value = value.model_dump()
    if isinstance(value, dict):
        return RewardOutput.model_validate(value)
    raise TypeError(f"returned {type(value).__name__}; return a RewardOutput")


def _failed(error: str) -> RewardOutput:
    return RewardOutput(
        reward=Reward(reward_score=0.0),
        status=TaskStatus.FAILED,
        error=error,
        error_code="SUB_REWARD_ERROR",
    )


async def _run_sub_reward(processor: Any, sub: SubReward, input_data: RewardInput) -> RewardOutput:
    try:
        return _as_reward_output(await _call(processor, sub.attr, sub.is_async, input_data))
    except Exception as exc:  # one failing sub-reward must not sink the others
        return _failed(f"sub-reward {sub.name!r} failed: {type(exc).__name__}: {exc}")


async def _process_registered(self: Any, input_data: RewardInput) -> Any:
    registry = registry_of(type(self))
    subs = registry.sub_rewards
    results: dict[str, RewardOutput] = {}
    if len(subs) == 1:
        results[subs[0].name] = await _run_sub_reward(self, subs[0], input_data)
    else:

        async def run(sub: SubReward) -> None:
            results[sub.name] = await _run_sub_reward(self, sub, input_data)

        async with anyio.create_task_group() as tg:
            for sub in subs:
                tg.start_soon(run, sub)
        results = {sub.name: results[sub.name] for sub in subs}  # registration order

    if registry.aggregate is not None:
        return await _call(self, registry.aggregate, registry.aggregate_is_async, results)
    metrics = self.get_scores(results)
    metrics.update(self.get_reward_metrics(results))
    return RewardOutput(reward=Reward(reward_score=self.get_total(results), reward_metrics=metrics))
