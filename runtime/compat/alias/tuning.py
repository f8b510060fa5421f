"""The SDK's tuning models (function components, their package and runtime settings,
datasets): this project's job file models (``runtime.platform.config``) under the SDK's
names, so that a Tuning script's objects go straight into our client's job config.

The same fields and defaults as the job file's keys; closed (an unknown field is an
error, as in the SDK). ``type`` takes the SDK's enums (``FunctionType.REWARD``,
``DatasetsType.VALIDATION``) or their values and reads back as the value's string.
"""

from __future__ import annotations

from typing import Literal

from runtime.platform.config import Dataset, FcModel, FunctionKind, FunctionSpec, MountStorage
from runtime.platform.config import Runtime as FunctionComponentRuntime

__all__ = [
    "MODELS",
    "AgenticRLFunctionComponent",
    "Dataset",
    "FunctionComponentModel",
    "FunctionComponentRuntime",
    "GroupRewardFunctionComponent",
    "MountStorage",
    "RewardFunctionComponent",
    "RolloutFunctionComponent",
    "TrainingDataset",
    "ValidationDataset",
]

FunctionComponentModel = FcModel


class AgenticRLFunctionComponent(FunctionSpec):
    """A function component: its type, name, timeout, weight, package (``fcmodel``),
    ``runtime``, and, once registered, its ``entity_id``."""

    type: FunctionKind = "rollout"


class RolloutFunctionComponent(AgenticRLFunctionComponent):
    type: FunctionKind = "rollout"


class RewardFunctionComponent(AgenticRLFunctionComponent):
    type: FunctionKind = "reward"


class GroupRewardFunctionComponent(AgenticRLFunctionComponent):
    type: FunctionKind = "group_reward"


class TrainingDataset(Dataset):
    type: Literal["training", "validation", "testing"] = "training"


class ValidationDataset(Dataset):
    type: Literal["training", "validation", "testing"] = "validation"


MODELS = {
    "AgenticRLFunctionComponent": AgenticRLFunctionComponent,
    "Dataset": Dataset,
    "FunctionComponentModel": FunctionComponentModel,
    "FunctionComponentRuntime": FunctionComponentRuntime,
    "GroupRewardFunctionComponent": GroupRewardFunctionComponent,
    "MountStorage": MountStorage,
    "RewardFunctionComponent": RewardFunctionComponent,
    "RolloutFunctionComponent": RolloutFunctionComponent,
    "TrainingDataset": TrainingDataset,
    "ValidationDataset": ValidationDataset,
}
