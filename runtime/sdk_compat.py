"""Functions written for the DashScope SDK's Agentic RL module serve unchanged.

Two environments:

1. ``dashscope`` is not installed (the usual case in a function image). ``install()``
   appends an import finder that answers the SDK's module paths
   (``dashscope.finetune.reinforcement...``) with modules holding this project's classes.
   It sits at the *end* of ``sys.meta_path`` and is only installed when no real
   ``dashscope`` can be found, so it never hides an installed SDK; nothing is written
   to site-packages, and it lives only in a process that runs our code.

2. ``dashscope`` is installed (a user's laptop). Their classes then derive from the
   SDK's own bases and may return the SDK's own output models. We *recognise* those
   classes rather than routing the SDK's paths to ours: routing would hide the package
   the user installed, break their ``isinstance`` checks against SDK classes and the
   SDK's own CLI in the same interpreter. ``recognise()`` maps an SDK base to its
   function type and the SDK's own input model, so their code receives exactly the
   types it would under the SDK's server; outputs are serialised through
   ``model_dump()`` into our output model, which has the same wire shape.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

from processors_base import log, models, observability, processors, rewards
from processors_base.models import FunctionType

__all__ = ["SDK", "install", "installed", "recognise", "uninstall"]

SDK = "dashscope.finetune.reinforcement"


def _names(module: ModuleType, *names: str) -> dict[str, Any]:
    return {name: getattr(module, name) for name in names}


def _exports() -> dict[str, dict[str, Any]]:
    bases = _names(
        processors,
        "AbstractRolloutProcessor",
        "AbstractRewardProcessor",
        "AbstractGroupRewardProcessor",
    )
    base_data = _names(
        models,
        "BaseDataModel",
        "TaskStatus",
        "ModelProtocol",
        "ModelResource",
        "RequestMetadata",
        "AgentOutput",
        "Task",
        "Resource",
    )
    data = {
        **base_data,
        **_names(
            models,
            "RolloutInput",
            "RolloutOutput",
            "RewardInput",
            "RewardOutput",
            "Reward",
            "GroupRewardInput",
            "GroupRewardOutput",
            "GroupReward",
        ),
    }
    decorators = _names(rewards, "reward_func", "sub_reward_func", "aggregate_func")
    tracing = _names(
        observability,
        "observe_processor",
        "trace_client",
        "untrace_client",
        "trace_tool",
        "observe_llm",
        "observe_tool",
    )
    logger = {"logger": log.logger}
    return {
        "dashscope": {},
        "dashscope.finetune": {},
        SDK: {
            **bases,
            **data,
            **decorators,
            **logger,
            "FunctionType": FunctionType,
        },
        f"{SDK}.common": logger,
        f"{SDK}.common.log": logger,
        f"{SDK}.common.model_types": {"FunctionType": FunctionType},
        f"{SDK}.component": {},
        f"{SDK}.component.processor": {**bases, "AbstractProcessor": processors.AbstractProcessor},
        f"{SDK}.component.processor.abstract_processor": {
            "AbstractProcessor": processors.AbstractProcessor,
        },
        f"{SDK}.component.processor.abstract_rollout_processor": _names(
            processors, "AbstractRolloutProcessor"
        ),
        f"{SDK}.component.processor.abstract_reward_processor": _names(
            processors, "AbstractRewardProcessor"
        ),
        f"{SDK}.component.processor.abstract_group_reward_processor": _names(
            processors, "AbstractGroupRewardProcessor"
        ),
        f"{SDK}.component.data": data,
        f"{SDK}.component.data.base_data_model": {**base_data, "FuncType": FunctionType},
        f"{SDK}.component.data.rollout_input": _names(
            models, "RolloutInput", "ModelResource", "RequestMetadata"
        ),
        f"{SDK}.component.data.rollout_output": _names(
            models, "RolloutOutput", "AgentOutput", "TaskStatus"
        ),
        f"{SDK}.component.data.reward_input": _names(
            models, "RewardInput", "AgentOutput", "RequestMetadata"
        ),
        f"{SDK}.component.data.reward_output": _names(
            models, "Reward", "RewardOutput", "TaskStatus"
        ),
        f"{SDK}.component.data.group_reward_input": _names(
            models, "GroupRewardInput", "AgentOutput", "RequestMetadata"
        ),
        f"{SDK}.component.data.group_reward_output": _names(
            models, "GroupReward", "GroupRewardOutput", "Reward", "TaskStatus"
        ),
        f"{SDK}.component.func_decorator": decorators,
        f"{SDK}.component.observability": tracing,
    }


class _SdkAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the SDK's module paths with modules holding our classes."""

    def __init__(self) -> None:
        self.modules = _exports()
        self.packages = {
            name for name in self.modules if any(o.startswith(name + ".") for o in self.modules)
        }

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, origin="runtime.sdk_compat", is_package=fullname in self.packages
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        exports = self.modules[module.__name__]
        module.__dict__.update(exports)
        module.__all__ = sorted(exports)


def installed() -> bool:
    return any(isinstance(finder, _SdkAliases) for finder in sys.meta_path)


def install() -> bool:
    """Serve the SDK's import paths from this project, unless a real SDK is installed.

    Returns whether the aliases are in place. Idempotent.
    """
    if installed():
        return True
    if "dashscope" in sys.modules or importlib.util.find_spec("dashscope") is not None:
        return False  # a real SDK: its classes are recognised instead (see recognise())
    sys.meta_path.append(_SdkAliases())
    return True


def uninstall() -> None:
    """Remove the aliases and forget the modules they made."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _SdkAliases)]
    for name in list(sys.modules):
        module = sys.modules[name]
        if (name == "dashscope" or name.startswith("dashscope.")) and (
            getattr(module.__spec__, "origin", None) == "runtime.sdk_compat"
        ):
            del sys.modules[name]


_SDK_BASES = {
    "AbstractRolloutProcessor": (FunctionType.ROLLOUT, "rollout_input", "RolloutInput"),
    "AbstractRewardProcessor": (FunctionType.REWARD, "reward_input", "RewardInput"),
    "AbstractGroupRewardProcessor": (
        FunctionType.GROUP_REWARD,
        "group_reward_input",
        "GroupRewardInput",
    ),
}
_OUTPUTS = {
    FunctionType.ROLLOUT: models.RolloutOutput,
    FunctionType.REWARD: models.RewardOutput,
    FunctionType.GROUP_REWARD: models.GroupRewardOutput,
}


def recognise(cls: type) -> tuple[FunctionType, type, type] | None:
    """For a class derived from the installed SDK's bases: its function type, the SDK's
    input model, and our output model (same wire shape). None for any other class."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith(SDK + ".") or klass.__name__ not in _SDK_BASES:
            continue
        func_type, module_name, model_name = _SDK_BASES[klass.__name__]
        data = importlib.import_module(f"{SDK}.component.data.{module_name}")
        return func_type, getattr(data, model_name), _OUTPUTS[func_type]
    return None
