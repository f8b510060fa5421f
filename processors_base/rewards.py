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
ordinary method. The registry of a class is collected as the SDK collects it (the
public names of ``dir(cls)``, sorted, each as attribute lookup finds it: an override
without the decorator has no role, ``b = None`` neither, and of two sub-rewards of one
name the later wins), once per class, frozen and cached on it. The sub-rewards run
concurrently; their outputs are handed on in that name order and summed in it with the
weights read from ``self.reward_meta``, so the total is the SDK's to the last bit.
Whether each runs async is decided when it is called (``processors_base.dispatch``).

A failed sub-reward (it raised, returned a non-finite score, or returned status
``failed``) is never silent: it is logged with its traceback (once per
``SubRewardErrors.log_every`` seconds per sub-reward), reported to the runtime's
counter, and marked ``"<name>.failed": 1.0`` in the default result; the failures left
out meanwhile are counted, and their number is logged when that interval ends. An aggregate sees
what the SDK's sees (for one that raised: score 0.0, ``reward_metrics={}``,
``error=str(exc)``). What it does to the result is the mode: ``zero`` (the SDK's
semantics: it counts with its score, 0 for one that raised), ``fail`` (the whole result
fails with ``SUB_REWARD_ERROR``, naming each failed one) or ``renormalize`` (it is left
out of the weighted sum and the weights of the others are scaled to the same sum, marked
``"renormalized": 1.0``; with nothing left to carry the weight, the result fails as with
``fail``). A sub-reward that returns no reward at all (None) raises
``InvalidSubRewardOutput`` out of ``process``.
"""

from __future__ import annotations

import abc
import functools
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import anyio

from processors_base import dispatch
from processors_base.models import Reward, RewardInput, RewardOutput, TaskStatus

if TYPE_CHECKING:  # processors imports this module
    from processors_base.processors import AbstractRewardProcessor

__all__ = [
    "SUB_REWARD_ERROR",
    "InvalidSubRewardOutput",
    "RewardRegistry",
    "SubReward",
    "SubRewardErrors",
    "aggregate_func",
    "errors_for",
    "registry_of",
    "reward_func",
    "sub_reward_func",
]

# The decorators hand back what they were given, typed as given (a user's type checker
# sees the decorated class or method, not Any).
F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound="type[AbstractRewardProcessor]")

SUB_REWARD_ERROR = "SUB_REWARD_ERROR"

_SUB_REWARD_TAG = "__sub_reward__"
_AGGREGATE_TAG = "__aggregate_func__"
_NAME_ATTR = "__reward_name__"
_CACHE_ATTR = "__reward_registry__"
_PROCESS = "process"  # the method @reward_func replaces with the registry's processing

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

    The runtime lends its own (with ``--sub-reward-errors`` and its counter) to the user
    code it runs (see :func:`errors_for`); without a runtime, one shared default (mode
    ``zero``) is used. ``on_failure(name)`` is called for
    every failure; the log line with the traceback at most once per ``log_every`` seconds
    per sub-reward name, so a broken judge cannot flood the log. That line opens a window
    of ``log_every`` seconds: the failures within it are counted, and the count is logged
    when the window closes (a timer thread, started by the first failure left out; or
    ``flush()``, at the runtime's shutdown), with the window's true length.
    """

    MODES = ("zero", "fail", "renormalize")

    def __init__(
        self,
        mode: str = "zero",
        on_failure: Callable[[str], None] | None = None,
        log_every: float = 60.0,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(
                f"sub-reward errors mode must be zero, fail or renormalize, not {mode!r}"
            )
        self.mode = mode
        self.on_failure = on_failure
        self.log_every = log_every
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}  # by sub-reward name: since its logged failure

    def report(self, processor: str, name: str, error: str, exc: BaseException | None) -> None:
        if self.on_failure is not None:
            self.on_failure(name)
        now = time.monotonic()
        with self._lock:
            window = self._windows.get(name)
            if window is not None and now - window.opened < self.log_every:
                window.unlogged += 1
                if window.timer is None:
                    window.timer = threading.Timer(
                        window.opened + self.log_every - now, self._close, (name, window)
                    )
                    window.timer.daemon = True
                    window.timer.start()
                return
            self._windows[name] = _Window(processor, now)
        if window is not None:  # over, its timer not run yet: its count before this line
            self._close(name, window)
        effect = _EFFECTS[self.mode]
        log.error(
            "sub-reward %r of %s failed (%s): %s",
            name,
            processor,
            effect,
            error,
            exc_info=(type(exc), exc, _user_frames(exc.__traceback__)) if exc is not None else None,
        )

    def flush(self) -> None:
        """Log the count of every window's failures left out so far (at shutdown)."""
        with self._lock:
            windows = list(self._windows.items())
        for name, window in windows:
            self._close(name, window)

    def _close(self, name: str, window: _Window) -> None:
        with self._lock:
            if self._windows.get(name) is window:
                del self._windows[name]
            if window.timer is not None:
                window.timer.cancel()
            unlogged, window.unlogged = window.unlogged, 0  # logged once, whoever closes it
        if unlogged:
            log.error(
                "sub-reward %r of %s: %d more %s in the %.1fs after the one logged, not "
                "logged one by one",
                name,
                window.processor,
                unlogged,
                "failure" if unlogged == 1 else "failures",
                time.monotonic() - window.opened,
            )


@dataclass
class _Window:
    processor: str
    opened: float  # time.monotonic() of its logged failure
    unlogged: int = 0
    timer: threading.Timer | None = None


_EFFECTS = {
    "zero": "it scores 0",
    "fail": "the result is failed",
    "renormalize": "it is left out, the weights of the others renormalised",
}
RENORMALIZED = "renormalized"  # the metric that marks a renormalised result

# Frames of the machinery that called the sub-reward: left out of its logged traceback.
_CALLERS = ("processors_base.", "runtime.", "anyio.", "asyncio.", "concurrent.", "threading")


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    first = tb
    while first is not None and str(first.tb_frame.f_globals.get("__name__")).startswith(_CALLERS):
        first = first.tb_next
    return first if first is not None else tb


@overload
def sub_reward_func(name: F, sub_weight: float = 1.0) -> F: ...
@overload
def sub_reward_func(name: str | None = None, sub_weight: float = 1.0) -> Callable[[F], F]: ...
def sub_reward_func(
    name: str | Callable[..., Any] | None = None, sub_weight: float = 1.0
) -> Callable[..., Any]:
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


@overload
def reward_func(processor_id: C, *, name: str | None = None) -> C: ...
@overload
def reward_func(
    processor_id: str | None = None, *, name: str | None = None
) -> Callable[[C], C]: ...
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
        own = cls.__dict__.get(_PROCESS)
        if own is not None and own is not _process_registered:
            log.warning(
                "%s defines process(), but @reward_func serves its sub-rewards instead "
                "(as the SDK does); that process() is not used",
                cls.__name__,
            )
        setattr(cls, _NAME_ATTR, given if given is not None else cls.__name__)
        setattr(cls, _PROCESS, _process_registered)
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


def _build_registry(cls: type) -> RewardRegistry:
    # As the SDK collects them: the public names of ``dir(cls)`` in sorted order, each as
    # attribute lookup finds it. An override without the decorator is no sub-reward (nor
    # aggregate), a non-callable (``b = None``) neither; two sub-rewards of one name: the
    # later one in that order wins, keeping the first one's place; so does the aggregate.
    subs: dict[str, SubReward] = {}
    aggregate: str | None = None
    for attr in dir(cls):
        if attr.startswith("_") or attr == "reward_meta":
            continue
        static = inspect.getattr_static(cls, attr, None)
        if isinstance(static, (property, functools.cached_property)):
            continue  # the SDK would evaluate it on an instance; never a sub-reward
        value = getattr(cls, attr, None)
        if not callable(value):
            continue
        tag = getattr(value, _SUB_REWARD_TAG, None)
        if tag is not None:
            subs[tag[0]] = SubReward(tag[0], tag[1], attr)
        if getattr(value, _AGGREGATE_TAG, False):
            aggregate = attr
    return RewardRegistry(
        name=getattr(cls, _NAME_ATTR, None),
        sub_rewards=tuple(subs.values()),
        aggregate=aggregate,
    )


# what a sub-reward run where no runtime lends its own reports to
_UNSERVED = SubRewardErrors()


def errors_for(processor: Any) -> SubRewardErrors:
    """The ``SubRewardErrors`` that a failed sub-reward of ``processor`` reports to now:
    the runtime's (``dispatch.runtime_services``), else, where no runtime runs it (a test,
    a script), one shared default (it only rate-limits the log lines)."""
    services = dispatch.runtime_services.get()
    if services is not None and services.sub_reward_errors is not None:
        return services.sub_reward_errors
    return _UNSERVED


class InvalidSubRewardOutput(TypeError):
    """A sub-reward returned something that is not a reward (None: a forgotten ``return``).

    A bug in the function, not a failure of the moment: the SDK's server answers such a
    request 500, and so does the runtime (``INVALID_OUTPUT``, naming the sub-reward),
    rather than scoring it 0 and training on that."""


def _as_reward_output(name: str, value: Any) -> RewardOutput:
    if isinstance(value, RewardOutput):
        output = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        output = RewardOutput(reward=Reward(reward_score=value))
    else:
        if hasattr(value, "model_dump"):  # the same model from another package (the SDK's)
            value = value.model_dump()
        if not isinstance(value, dict):
            hint = " (a missing return?)" if value is None else ""
            raise InvalidSubRewardOutput(
                f"sub-reward {name!r} returned {type(value).__name__}{hint}, "
                "expected a RewardOutput"
            )
        try:
            output = RewardOutput.model_validate(value)
        except ValueError as exc:
            raise InvalidSubRewardOutput(
                f"sub-reward {name!r} returned a dict that is not a RewardOutput: {exc}"
            ) from None
    # A NaN would poison the weighted sum and then the whole answer: fail this one alone.
    score = output.reward.reward_score
    if isinstance(score, float) and not math.isfinite(score):
        raise ValueError(f"returned a non-finite reward_score ({score})")
    for key, metric in (output.reward.reward_metrics or {}).items():
        if isinstance(metric, float) and not math.isfinite(metric):
            raise ValueError(f"returned a non-finite reward_metrics[{key!r}] ({metric})")
    return output


@dataclass(frozen=True)
class _Outcome:
    """What one sub-reward gave: the output an aggregate sees (for a failure, the SDK's
    placeholder) and, kept apart from it, our own record of the failure."""

    output: RewardOutput
    exc: BaseException | None = None
    detail: str | None = None  # set when it failed: what went wrong


def _placeholder(exc: BaseException) -> RewardOutput:
    # Exactly what the SDK hands an aggregate for a sub-reward that raised.
    return RewardOutput(
        reward=Reward(reward_score=0.0, reward_metrics={}),
        status=TaskStatus.FAILED,
        error=str(exc),
    )


async def _run_sub_reward(processor: Any, sub: SubReward, input_data: RewardInput) -> _Outcome:
    try:
        output = _as_reward_output(sub.name, await dispatch.call(processor, sub.attr, input_data))
    except InvalidSubRewardOutput as exc:
        return _Outcome(_placeholder(exc), exc, str(exc))  # raised once all have finished
    except Exception as exc:  # one failing sub-reward must not sink the others
        return _Outcome(_placeholder(exc), exc, f"{type(exc).__name__}: {exc}")
    if output.status == TaskStatus.FAILED:  # it said so itself: it keeps its score
        return _Outcome(output, None, f"returned status failed: {output.error or 'no error given'}")
    return _Outcome(output)


async def _process_registered(self: Any, input_data: RewardInput) -> Any:
    registry = registry_of(type(self))
    subs = registry.sub_rewards
    results: dict[str, _Outcome] = {}
    if len(subs) == 1:
        results[subs[0].name] = await _run_sub_reward(self, subs[0], input_data)
    elif subs:

        async def run(sub: SubReward) -> None:
            results[sub.name] = await _run_sub_reward(self, sub, input_data)

        # Concurrently (the SDK awaits them one after another, in the same order).
        async with anyio.create_task_group() as tg:
            for sub in subs:
                tg.start_soon(run, sub)
    for sub in subs:
        if isinstance(results[sub.name].exc, InvalidSubRewardOutput):
            raise results[sub.name].exc  # type: ignore[misc]
    outputs = {sub.name: results[sub.name].output for sub in subs}  # the SDK's order

    failed = [name for name in outputs if results[name].detail is not None]
    scale: float | None = None  # renormalising: the factor of the weights left
    if failed:
        errors = errors_for(self)
        messages = [_reported(errors, self, name, results[name]) for name in failed]
        if errors.mode == "renormalize":
            if len(failed) < len(outputs):  # an aggregate weighs them itself
                scale = 1.0 if registry.aggregate else _scale(self, outputs, failed)
            if scale is None:
                messages.append("no sub-reward that succeeded carries weight to renormalise")
        if errors.mode == "fail" or (errors.mode == "renormalize" and scale is None):
            return RewardOutput(
                reward=Reward(reward_score=0.0, reward_metrics=_metrics(self, outputs, failed)),
                status=TaskStatus.FAILED,
                error="; ".join(messages),
                error_code=SUB_REWARD_ERROR,
            )
    if registry.aggregate is not None:  # it decides, seeing the failed outputs (as zero)
        return await dispatch.call(self, registry.aggregate, outputs)
    if scale is not None:
        kept = {name: output for name, output in outputs.items() if name not in failed}
        metrics = _metrics(self, outputs, failed)
        metrics[RENORMALIZED] = 1.0
        return RewardOutput(
            reward=Reward(reward_score=self.get_total(kept) * scale, reward_metrics=metrics)
        )
    return RewardOutput(
        reward=Reward(
            reward_score=self.get_total(outputs),
            reward_metrics=_metrics(self, outputs, failed) or None,  # none at all: as the SDK
        )
    )


def _scale(self: Any, outputs: dict[str, RewardOutput], failed: list[str]) -> float | None:
    """What the weights of the sub-rewards that succeeded (some did) are multiplied by to
    sum as all the weights did; None when theirs sum to 0 or to the other sign of the
    whole (scaling would then turn a penalty into a bonus), or the whole to 0 (scaling
    would erase what is left: a bonus whose penalty failed scored 0.0 as a success)."""
    weights = self.get_weights()
    whole = sum(weights.get(name, 0.0) for name in outputs)
    left = sum(weights.get(name, 0.0) for name in outputs if name not in failed)
    if left == whole:  # the failed ones weigh nothing (0.0 / 0.0 included)
        return 1.0
    if left == 0 or whole / left <= 0:
        return None
    return whole / left


def _reported(errors: SubRewardErrors, processor: Any, name: str, outcome: _Outcome) -> str:
    """Report one failed sub-reward; its message for a failed result."""
    detail = outcome.detail or ""
    errors.report(type(processor).__name__, name, detail, outcome.exc)
    if outcome.exc is None:
        return f"sub-reward {name!r} {detail}"
    return f"sub-reward {name!r} failed: {detail}"


def _metrics(self: Any, outputs: dict[str, RewardOutput], failed: list[str]) -> dict[str, float]:
    metrics = self.get_scores(outputs)
    metrics.update(self.get_reward_metrics(outputs))
    metrics.update({f"{name}.failed": 1.0 for name in failed})
    return metrics
