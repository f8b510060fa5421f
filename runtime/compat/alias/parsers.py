"""The SDK's request parsers: a raw request body (a dict) in, the function's input model out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from processors_base.models import (
    BaseDataModel,
    FunctionType,
    GroupRewardInput,
    RewardInput,
    RolloutInput,
)

__all__ = [
    "BaseRequestParser",
    "GroupRewardRequestParser",
    "RewardRequestParser",
    "RolloutRequestParser",
    "parser_for",
]


class BaseRequestParser(ABC):
    """Turns one raw request body into a function's input model."""

    @abstractmethod
    def parse(self, raw: dict[str, Any]) -> BaseDataModel:
        """The validated input; raises pydantic's ValidationError for a body that does not fit."""


class _ModelParser(BaseRequestParser):
    input_model: ClassVar[type[BaseDataModel]]

    def parse(self, raw: dict[str, Any]) -> BaseDataModel:
        return self.input_model.model_validate(raw)


class RolloutRequestParser(_ModelParser):
    input_model = RolloutInput

    def parse(self, raw: dict[str, Any]) -> RolloutInput:
        return RolloutInput.model_validate(raw)


class RewardRequestParser(_ModelParser):
    input_model = RewardInput

    def parse(self, raw: dict[str, Any]) -> RewardInput:
        return RewardInput.model_validate(raw)


class GroupRewardRequestParser(_ModelParser):
    input_model = GroupRewardInput

    def parse(self, raw: dict[str, Any]) -> GroupRewardInput:
        return GroupRewardInput.model_validate(raw)


_BY_TYPE: dict[FunctionType, type[BaseRequestParser]] = {
    FunctionType.ROLLOUT: RolloutRequestParser,
    FunctionType.REWARD: RewardRequestParser,
    FunctionType.GROUP_REWARD: GroupRewardRequestParser,
}


def parser_for(func_type: FunctionType) -> type[BaseRequestParser]:
    return _BY_TYPE[FunctionType(func_type)]
