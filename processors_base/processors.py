"""The abstract bases a user's function derives from.

The base a class derives from decides its function type, and so the input model the
runtime validates requests into and the output model it serialises results from.
``process``, ``setup`` and ``shutdown`` may each be ``def`` or ``async def``: the
runtime runs async ones on the event loop and sync ones in its bounded thread pool.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
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
from processors_base.rewards import registry_of

__all__ = [
    "AbstractGroupRewardProcessor",
    "AbstractProcessor",
    "AbstractRewardProcessor",
    "AbstractRolloutProcessor",
]


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
    def process(self, input_data: RolloutInput) -> RolloutOutput: ...


class AbstractRewardProcessor(AbstractProcessor):
    """Scores one trajectory, directly or through ``@reward_func`` sub-rewards."""

    func_type = FunctionType.REWARD
    input_model = RewardInput
    output_model = RewardOutput

    @abstractmethod
    def process(self, input_data: RewardInput) -> RewardOutput: ...

    def get_weights(self) -> dict[str, float]:
        """``{sub-reward name: weight}`` for every registered sub-reward."""
        return {sub.name: sub.weight for sub in registry_of(type(self)).sub_rewards}

    def get_scores(self, sub_rewards: Mapping[str, RewardOutput]) -> dict[str, float]:
        """``{sub-reward name: score}``."""
        return {name: out.reward.reward_score for name, out in sub_rewards.items()}

    def get_total(self, sub_rewards: Mapping[str, RewardOutput]) -> float:
        """The weighted sum of the sub-reward scores."""
        weights = self.get_weights()
        total = 0.0
        for name, out in sub_rewards.items():
            if name not in weights:
                known = ", ".join(sorted(weights)) or "none"
                raise ValueError(
                    f"sub-reward {name!r} is not registered on {type(self).__name__} "
                    f"(registered: {known})"
                )
            total += weights[name] * out.reward.reward_score
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
    def process(self, input_data: GroupRewardInput) -> GroupRewardOutput: ...
