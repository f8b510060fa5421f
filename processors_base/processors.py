"""The abstract bases a user's function derives from.

The base a class derives from decides its function type, and so the input model the
runtime validates requests into and the output model it serialises results from.
``process``, ``setup`` and ``shutdown`` may each be ``def`` or ``async def``: the
runtime runs async ones on the event loop and sync ones in its bounded thread pool.
"""

from __future__ import annotations

import contextvars
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, ClassVar

from processors_base.models import (
    BaseDataModel,
    FunctionType,
    GroupRewardInput,
    GroupRewardOutput,
    RewardInput,
    RewardOutput,
    RolloutInput,
    RolloutOutput,
    WireModel,
)
from processors_base.reward_meta import RewardMetaAttribute

__all__ = [
    "AbstractGroupRewardProcessor",
    "AbstractProcessor",
    "AbstractRewardProcessor",
    "AbstractRolloutProcessor",
    "declared_metrics",
]

_EXECUTOR_LOCK = threading.Lock()
MAX_METRIC_NAMES = 1000  # declared on one processor, at most (the client takes as many)
MAX_METRIC_NAME = 200  # characters of one declared name, at most


class AbstractProcessor(ABC):
    """One function: ``process`` turns one validated input into one output."""

    func_type: ClassVar[FunctionType]
    input_model: ClassVar[type[BaseDataModel]]
    output_model: ClassVar[type[WireModel]]

    def setup(self) -> Any:  # noqa: B027 - optional hook, empty by design
        """Runs once per worker before it reports ready: load models, open clients."""

    def shutdown(self) -> Any:  # noqa: B027 - optional hook, empty by design
        """Runs once on graceful stop, after the requests in flight have finished."""

    @abstractmethod
    def process(self, input_data: Any) -> Any:
        """Handle one request; may be ``def`` or ``async def``."""


class AbstractRolloutProcessor(AbstractProcessor):
    """Drives the agent for one sample and returns its trajectory."""

    func_type = FunctionType.ROLLOUT
    input_model = RolloutInput
    output_model = RolloutOutput

    @abstractmethod
    def process(self, input_data: RolloutInput) -> RolloutOutput | Awaitable[RolloutOutput]: ...


class _ContextThreadPool(ThreadPoolExecutor):
    """A thread pool whose tasks run in the submitter's context (contextvars), so work a
    request hands to ``self.executor`` keeps its request's ids and secrets (blanked from
    what that work logs), as the runtime's own threads do."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


class AbstractRewardProcessor(AbstractProcessor):
    """Scores one trajectory, directly or through ``@reward_func`` sub-rewards.

    ``metric_names`` declares the ``reward_metrics`` names the processor reports, so that
    every answer of the trainer protocols, and every result of the in-process client,
    carries each of them from the first request on (0.0 where a result has none, a
    failed one included): verl and OpenRLHF stack per-sample metrics by key and refuse
    a batch whose samples differ. ``/health`` lists them. The names of a decorated
    reward's sub-rewards need no declaration; a name reported but not declared (by a
    processor that declares any) is logged once. A name that is not a string, or one of
    the trainer protocols' own marks (``reward_failed``, ``prompt_mismatch``), stops the
    server at startup::

        class MathReward(AbstractRewardProcessor):
            metric_names = ("answer_found", "format_ok")
    """

    func_type = FunctionType.REWARD
    input_model = RewardInput
    output_model = RewardOutput
    metric_names: ClassVar[Sequence[str]] = ()

    def __init__(self, executor: Executor | None = None) -> None:
        if executor is not None:
            self.executor = executor

    @abstractmethod
    def process(self, input_data: RewardInput) -> RewardOutput | Awaitable[RewardOutput]: ...

    @property
    def executor(self) -> Executor | None:
        """A thread pool for the processor's own sync work, as the SDK's reward processors
        have (``await loop.run_in_executor(self.executor, f, x)``). Made on first use, or
        given to ``__init__``; one this processor made is shut down when it stops, and
        then reads None, as in the SDK."""
        executor = self.__dict__.get("_executor")
        if executor is None and not self.__dict__.get("_executor_closed"):
            with _EXECUTOR_LOCK:  # two sub-rewards asking at once get the same pool
                executor = self.__dict__.get("_executor")
                if executor is None:
                    executor = _ContextThreadPool(thread_name_prefix=f"{type(self).__name__}")
                    self.__dict__["_executor"] = executor
                    self.__dict__["_executor_owned"] = True
        return executor

    @executor.setter
    def executor(self, value: Executor | None) -> None:
        self.__dict__["_executor"] = value
        self.__dict__["_executor_closed"] = value is None
        self.__dict__["_executor_owned"] = False

    def close_executor(self) -> None:
        """Shut down ``executor`` if this processor made it (the runtime calls this on stop)."""
        executor = self.__dict__.pop("_executor", None)
        self.__dict__["_executor_closed"] = True
        if executor is not None and self.__dict__.pop("_executor_owned", False):
            executor.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> Any:
        """Runs once on graceful stop; closes ``executor``. Override freely."""
        self.close_executor()

    reward_meta = RewardMetaAttribute()

    def get_weights(self) -> dict[str, float]:
        """``{sub-reward name: weight}``, read from ``reward_meta`` (live, as in the SDK)."""
        return {name: sf.weight for name, sf in self.reward_meta.sub_functions.items()}

    def get_scores(self, sub_rewards: Mapping[str, RewardOutput]) -> dict[str, float]:
        """``{sub-reward name: score}``."""
        return {name: out.reward.reward_score for name, out in sub_rewards.items()}

    def get_total(self, sub_rewards: Mapping[str, RewardOutput]) -> float:
        """The weighted sum of the sub-reward scores, in the SDK's order and arithmetic
        (so the float is the same to the last bit), weights read from ``reward_meta``."""
        functions = self.reward_meta.sub_functions
        total = 0.0
        for name, out in sub_rewards.items():
            sub = functions.get(name)
            if sub is None:
                known = ", ".join(sorted(functions)) or "none"
                raise ValueError(
                    f"sub-reward {name!r} is not registered on {type(self).__name__} "
                    f"(registered: {known})"
                )
            total += out.reward.reward_score * sub.weight
        return total

    def get_reward_metrics(self, sub_rewards: Mapping[str, RewardOutput]) -> dict[str, float]:
        """Each sub-reward's own metrics, as ``{"<sub-name>.<key>": value}``."""
        return {
            f"{name}.{key}": value
            for name, out in sub_rewards.items()
            for key, value in (out.reward.reward_metrics or {}).items()
        }


class AbstractGroupRewardProcessor(AbstractProcessor):
    """Scores a group of trajectories together (for example, group-normalised)."""

    func_type = FunctionType.GROUP_REWARD
    input_model = GroupRewardInput
    output_model = GroupRewardOutput

    @abstractmethod
    def process(
        self, input_data: GroupRewardInput
    ) -> GroupRewardOutput | Awaitable[GroupRewardOutput]: ...


def declared_metrics(cls: type) -> tuple[str, ...]:
    """The metric names ``cls.metric_names`` declares, in order, once each (none for a class
    not derived from ``AbstractRewardProcessor``); TypeError for a malformed declaration."""
    if not (isinstance(cls, type) and issubclass(cls, AbstractRewardProcessor)):
        return ()
    names = cls.metric_names
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(
            f"{cls.__name__}.metric_names must be a sequence of metric names, such as "
            f"('answer_found',), not {type(names).__name__} {names!r}"
        )
    if len(names) > MAX_METRIC_NAMES:
        raise TypeError(
            f"{cls.__name__}.metric_names declares {len(names)} names: at most "
            f"{MAX_METRIC_NAMES} (every answer carries each of them)"
        )
    for name in names:
        if not isinstance(name, str) or not name or len(name) > MAX_METRIC_NAME:
            raise TypeError(
                f"{cls.__name__}.metric_names holds {name!r:.80}: each metric name must be a "
                f"string of 1 to {MAX_METRIC_NAME} characters"
            )
        try:
            name.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no JSON can carry it
            raise TypeError(f"{cls.__name__}.metric_names holds {name!r}: {exc}") from None
    return tuple(dict.fromkeys(names))
