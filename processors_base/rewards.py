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
ordinary method. The registry of a class is read once from its MRO, frozen, and cached
on the class: instances share no mutable state through it. Roles follow attribute
lookup: a subclass that redefines a sub-reward or the aggregate without the decorator
keeps its role (the override is what runs), and one that sets the name to a
non-callable (``b = None``) removes it. Whether each runs async is decided when it is
called (``processors_base.dispatch``), so a sync method behind an async wrapper, or an
async override of a sync parent, is awaited as it should be.

A failed sub-reward (it raised, returned a non-finite score, or returned status
``failed``) is never silent: it is logged with its traceback (once per
``SubRewardErrors.log_every`` seconds per sub-reward), reported to the runtime's
counter, and marked ``"<name>.failed": 1.0`` in the default result. What it does to the
result is the mode: ``zero`` (the SDK's semantics: it scores 0, the result succeeds) or
``fail`` (the whole result fails with ``SUB_REWARD_ERROR``, naming each failed one).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import anyio

from processors_base import dispatch
from processors_base.models import Reward, RewardInput, RewardOutput, TaskStatus

__all__ = [
    "SUB_REWARD_ERROR",
    "RewardRegistry",
    "SubReward",
    "SubRewardErrors",
    "aggregate_func",
    "registry_of",
    "reward_func",
    "sub_reward_func",
]

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)

SUB_REWARD_ERROR = "SUB_REWARD_ERROR"

_SUB_REWARD_TAG = "__sub_reward__"
_AGGREGATE_TAG = "__aggregate_func__"
_NAME_ATTR = "__reward_name__"
_CACHE_ATTR = "__reward_registry__"
_ERRORS_ATTR = "_runtime_sub_reward_errors"

log = logging.getLogger("processors_base.rewards")


@dataclass(frozen=True)
class SubReward:
    name: str
    weight: float
    attr: str


@dataclass(frozen=True)
class RewardRegistry:
    name: str | None
    sub_rewards: tuple[SubReward, ...]
    aggregate: str | None

    @property
    def processor_id(self) -> str | None:
        """The id given to ``@reward_func`` (the SDK's name for it)."""
        return self.name


class SubRewardErrors:
    """What a failed sub-reward does to the result, and who hears of it.

    One per processor instance: the runtime installs its own (with ``--sub-reward-errors``
    and its counter) as the instance's ``_runtime_sub_reward_errors``; without a runtime,
    a default one (mode ``zero``) is made on first use. ``on_failure(name)`` is called for
    every failure; the log line with the traceback at most once per ``log_every`` seconds
    per sub-reward name, so a broken judge cannot flood the log.
    """

    MODES = ("zero", "fail")

    def __init__(
        self,
        mode: str = "zero",
        on_failure: Callable[[str], None] | None = None,
        log_every: float = 60.0,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"sub-reward errors mode must be zero or fail, not {mode!r}")
        self.mode = mode
        self.on_failure = on_failure
        self.log_every = log_every
        self._lock = threading.Lock()
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def report(self, processor: str, name: str, error: str, exc: BaseException | None) -> None:
        if self.on_failure is not None:
            self.on_failure(name)
        now = time.monotonic()
        with self._lock:
            last = self._logged_at.get(name)
            if last is not None and now - last < self.log_every:
                self._unlogged[name] = self._unlogged.get(name, 0) + 1
                return
            self._logged_at[name] = now
            unlogged = self._unlogged.pop(name, 0)
        effect = "it scores 0" if self.mode == "zero" else "the result is failed"
        more = (
            f" ({unlogged} more failures of it were not logged in the last {self.log_every:g}s)"
            if unlogged
            else ""
        )
        log.error(
            "sub-reward %r of %s failed (%s): %s%s",
            name,
            processor,
            effect,
            error,
            more,
            exc_info=(type(exc), exc, _user_frames(exc.__traceback__)) if exc is not None else None,
        )


# Frames of the machinery that called the sub-reward: left out of its logged traceback.
_CALLERS = ("processors_base.", "runtime.", "anyio.", "asyncio.", "concurrent.", "threading")


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    first = tb
    while first is not None and str(first.tb_frame.f_globals.get("__name__")).startswith(_CALLERS):
        first = first.tb_next
    return first if first is not None else tb


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


def reward_func(processor_id: Any = None, *, name: str | None = None) -> Any:
    """Make a reward processor out of its sub-rewards; the class needs no ``process``.

    As in the SDK, the registry's processing replaces any ``process`` the class defines
    (a placeholder written to satisfy the abstract base), and a class with no sub-rewards
    is accepted (it scores 0.0).
    """
    if isinstance(processor_id, type):  # used bare, as ``@reward_func``
        return reward_func()(processor_id)
    given = processor_id if processor_id is not None else name

    def decorate(cls: C) -> C:
        from processors_base.processors import AbstractRewardProcessor

        if not (isinstance(cls, type) and issubclass(cls, AbstractRewardProcessor)):
            raise TypeError(
                f"@reward_func({given!r}) must decorate an AbstractRewardProcessor class"
            )
        own = cls.__dict__.get("process")
        if own is not None and own is not _process_registered:
            log.warning(
                "%s defines process(), but @reward_func serves its sub-rewards instead "
                "(as the SDK does); that process() is not used",
                cls.__name__,
            )
        setattr(cls, _NAME_ATTR, given if given is not None else cls.__name__)
        cls.process = _process_registered  # type: ignore[attr-defined]
        abc.update_abstractmethods(cls)
        setattr(cls, _CACHE_ATTR, _build_registry(cls))  # misuse is reported at import
        return cls

    return decorate


def registry_of(cls: type) -> RewardRegistry:
    """The frozen registry of a reward processor class (empty when undecorated)."""
    cached = cls.__dict__.get(_CACHE_ATTR)
    if cached is None:
        cached = _build_registry(cls)
        setattr(cls, _CACHE_ATTR, cached)
    return cached


def _is_method(value: Any) -> bool:
    return callable(value) or isinstance(value, (classmethod, staticmethod))


def _build_registry(cls: type) -> RewardRegistry:
    # Walk the MRO from the base down, so that what a subclass defines wins, as in lookup.
    roles: dict[str, tuple[str, float]] = {}  # attr -> (sub-reward name, weight)
    aggregate: str | None = None
    for klass in reversed(cls.__mro__):
        own_aggregates = []
        for attr, value in vars(klass).items():
            if not _is_method(value):  # ``b = None`` hides the parent's b: no role left
                roles.pop(attr, None)
                if attr == aggregate:
                    aggregate = None
                continue
            tag = getattr(value, _SUB_REWARD_TAG, None)
            if tag is not None:
                roles[attr] = tag
            if getattr(value, _AGGREGATE_TAG, False):
                own_aggregates.append(attr)
            # An undecorated method keeps the role its name had: the override is what runs.
        if len(own_aggregates) > 1:
            raise TypeError(
                f"{klass.__name__} has more than one @aggregate_func: {', '.join(own_aggregates)}"
            )
        if own_aggregates:
            aggregate = own_aggregates[0]
    seen: dict[str, str] = {}
    for attr, (name, _) in roles.items():
        if name in seen:
            raise TypeError(
                f"{cls.__name__}: sub-reward name {name!r} is used by both "
                f"{seen[name]}() and {attr}()"
            )
        seen[name] = attr
    return RewardRegistry(
        name=getattr(cls, _NAME_ATTR, None),
        sub_rewards=tuple(SubReward(name, weight, attr) for attr, (name, weight) in roles.items()),
        aggregate=aggregate,
    )


def _errors_of(processor: Any) -> SubRewardErrors:
    errors = getattr(processor, _ERRORS_ATTR, None)
    if errors is None:
        errors = SubRewardErrors()
        with contextlib.suppress(AttributeError):  # a class with __slots__: no rate limit kept
            setattr(processor, _ERRORS_ATTR, errors)
    return errors


def _as_reward_output(value: Any) -> RewardOutput:
    if isinstance(value, RewardOutput):
        output = value
    elif isinstance(value, bool):
        raise TypeError(f"returned a bool ({value}); return a RewardOutput")
    elif isinstance(value, (int, float)):
        output = RewardOutput(reward=Reward(reward_score=value))
    else:
        if hasattr(value, "model_dump"):  # the same model from another package (the SDK's)
            value = value.model_dump()
        if not isinstance(value, dict):
            raise TypeError(f"returned {type(value).__name__}; return a RewardOutput")
        output = RewardOutput.model_validate(value)
    # A NaN would poison the weighted sum and then the whole answer: fail this one alone.
    score = output.reward.reward_score
    if isinstance(score, float) and not math.isfinite(score):
        raise ValueError(f"returned a non-finite reward_score ({score})")
    for key, metric in (output.reward.reward_metrics or {}).items():
        if isinstance(metric, float) and not math.isfinite(metric):
            raise ValueError(f"returned a non-finite reward_metrics[{key!r}] ({metric})")
    return output


def _failed(error: str) -> RewardOutput:
    return RewardOutput(
        reward=Reward(reward_score=0.0),
        status=TaskStatus.FAILED,
        error=error,
        error_code=SUB_REWARD_ERROR,
    )


async def _run_sub_reward(
    processor: Any, sub: SubReward, input_data: RewardInput
) -> tuple[RewardOutput, BaseException | None]:
    try:
        return _as_reward_output(await dispatch.call(processor, sub.attr, input_data)), None
    except Exception as exc:  # one failing sub-reward must not sink the others
        return _failed(f"sub-reward {sub.name!r} failed: {type(exc).__name__}: {exc}"), exc


async def _process_registered(self: Any, input_data: RewardInput) -> Any:
    registry = registry_of(type(self))
    subs = registry.sub_rewards
    results: dict[str, tuple[RewardOutput, BaseException | None]] = {}
    if len(subs) == 1:
        results[subs[0].name] = await _run_sub_reward(self, subs[0], input_data)
    elif subs:

        async def run(sub: SubReward) -> None:
            results[sub.name] = await _run_sub_reward(self, sub, input_data)

        async with anyio.create_task_group() as tg:
            for sub in subs:
                tg.start_soon(run, sub)
    outputs = {sub.name: results[sub.name][0] for sub in subs}  # registration order

    failed = [name for name, out in outputs.items() if out.status == TaskStatus.FAILED]
    if failed:
        errors = _errors_of(self)
        messages = [_reported(errors, self, name, *results[name]) for name in failed]
        if errors.mode == "fail":
            return RewardOutput(
                reward=Reward(reward_score=0.0, reward_metrics=_metrics(self, outputs, failed)),
                status=TaskStatus.FAILED,
                error="; ".join(messages),
                error_code=SUB_REWARD_ERROR,
            )
    if registry.aggregate is not None:
        return await dispatch.call(self, registry.aggregate, outputs)
    return RewardOutput(
        reward=Reward(
            reward_score=self.get_total(outputs),
            reward_metrics=_metrics(self, outputs, failed) or None,  # none at all: as the SDK
        )
    )


def _reported(
    errors: SubRewardErrors,
    processor: Any,
    name: str,
    output: RewardOutput,
    exc: BaseException | None,
) -> str:
    """Report one failed sub-reward; its message for a failed result."""
    if exc is not None:
        detail = f"{type(exc).__name__}: {exc}"
        message = output.error or detail
    else:  # it returned a failed output rather than raising
        detail = f"returned status failed: {output.error or 'no error given'}"
        message = f"sub-reward {name!r} {detail}"
    errors.report(type(processor).__name__, name, detail, exc)
    return message


def _metrics(self: Any, outputs: dict[str, RewardOutput], failed: list[str]) -> dict[str, float]:
    metrics = self.get_scores(outputs)
    metrics.update(self.get_reward_metrics(outputs))
    metrics.update({f"{name}.failed": 1.0 for name in failed})
    return metrics
