"""Wire models: the JSON the training platform sends to a function and expects back.

Field names, types and defaults follow the platform's protocol exactly. Every model
keeps unknown fields (``extra="allow"``) so that a newer platform can add fields
without breaking older functions, and user code can still reach them as attributes.
"""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr

__all__ = [
    "AgentOutput",
    "BaseDataModel",
    "FunctionType",
    "GroupReward",
    "GroupRewardInput",
    "GroupRewardOutput",
    "ModelProtocol",
    "ModelResource",
    "RequestMetadata",
    "Resource",
    "Reward",
    "RewardInput",
    "RewardOutput",
    "RolloutInput",
    "RolloutOutput",
    "Task",
    "TaskStatus",
    "WireModel",
]


class _QualifiedStr(str, Enum):
    """``str()`` and f-strings give ``Class.MEMBER``, as the SDK's enums do on every Python
    version, so user code that formats a status prints the same; JSON carries the value."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class TaskStatus(_QualifiedStr):
    SUCCESS = "success"
    FAILED = "failed"


class ModelProtocol(_QualifiedStr):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    DASHSCOPE = "dashscope"


class FunctionType(str, Enum):
    ROLLOUT = "rollout"
    REWARD = "reward"
    GROUP_REWARD = "group_reward"

    def __str__(self) -> str:
        return self.value


def _error_code_as_str(value: Any) -> Any:
    # The protocol carries error codes as strings; users often return ints.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


ErrorCode = Annotated[str | None, BeforeValidator(_error_code_as_str)]


class WireModel(BaseModel):
    """Base of every wire model: unknown fields are accepted and kept."""

    model_config = ConfigDict(extra="allow")


class ModelResource(WireModel):
    """The LLM endpoint a rollout talks to. ``api_key`` never shows in a repr or a dump."""

    model_name: str
    base_url: str
    api_key: SecretStr


class RequestMetadata(WireModel):
    job_id: str
    sample_id: str
    rollout_id: str
    attempt_id: str


# Lists and dicts whose items are checked stop at their first invalid item (fail_fast): a
# body of a million invalid items was a million errors of a few KB each, gigabytes.
class AgentOutput(WireModel):
    messages: list[dict[str, Any]] | None = Field(None, fail_fast=True)
    rollout_extra: dict[str, Any] | None = None
    # null too, as the SDK
    rollout_metrics: dict[str, float] | None = Field(default_factory=dict, fail_fast=True)
    reward_score: float | None = None


class BaseDataModel(WireModel):
    """Base of the three function inputs; ``func_type`` names the function they are for."""

    func_type: FunctionType


class RolloutInput(BaseDataModel):
    func_type: FunctionType = FunctionType.ROLLOUT
    messages: list[dict[str, Any]] = Field(fail_fast=True)
    tools: list[dict[str, Any]] | None = Field(None, fail_fast=True)
    ground_truth: Any | None = None
    rollout_extra: dict[str, Any] | None = None
    sampling_params: dict[str, Any] | None = None
    model_resource: ModelResource
    request_metadata: RequestMetadata | None = None


class RolloutOutput(WireModel):
    agent_output: AgentOutput | None = None
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None
    error_code: ErrorCode = None


class RewardInput(BaseDataModel):
    func_type: FunctionType = FunctionType.REWARD
    ground_truth: Any | None = None
    request_metadata: RequestMetadata | None = None
    agent_output: AgentOutput


class Reward(WireModel):
    reward_score: float
    reward_metrics: dict[str, float] | None = None


class RewardOutput(WireModel):
    reward: Reward
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None
    error_code: ErrorCode = None


class GroupRewardInput(BaseDataModel):
    func_type: FunctionType = FunctionType.GROUP_REWARD
    agent_outputs: list[AgentOutput] = Field(fail_fast=True)
    request_metadata: RequestMetadata | None = None
    ground_truth: Any | None = None


class GroupReward(WireModel):
    rewards: list[Reward]  # required, as in the SDK


class GroupRewardOutput(WireModel):
    reward: GroupReward
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None
    error_code: ErrorCode = None


# --- Not on the wire of a served function; kept for code written against the SDK. ---


class Task(BaseModel):
    rollout_id: str = Field(default_factory=lambda: "ro-" + uuid.uuid4().hex[:12])
    prompt: str | list[dict[str, Any]] | dict[str, Any]
    ground_truth: Any | None = None
    training_state: dict[str, Any] | None = Field(default_factory=dict)


class Resource(BaseModel):
    model_name: str
    base_url: str
    api_key: SecretStr
    protocol: ModelProtocol = ModelProtocol.OPENAI
    max_tokens: int = Field(2048, ge=1)
    max_turns: int = Field(25, ge=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    timeout: float = 60.0
    system_prompt: str | None = None
