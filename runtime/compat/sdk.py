"""Functions written for the DashScope SDK's Agentic RL module serve unchanged.

Two environments:

1. ``dashscope`` is not installed (the usual case in a function image). ``install()``
   appends an import finder that answers the SDK's module paths
   (``dashscope.finetune.reinforcement`` and every public module under it, and the
   Tuning API ``dashscope.finetune.agentic_rl``, see ``runtime.compat.alias``)
   with modules holding this project's implementation. It sits at
   the *end* of ``sys.meta_path`` and is only installed when no real ``dashscope`` can be
   found, so it never hides an installed SDK; nothing is written to site-packages, and it
   lives only in a process that runs our code.

   Only that subtree is provided; the rest of ``dashscope`` behaves as absent, so code
   that probes for the optional SDK takes its "not installed" branch:

   - ``importlib.util.find_spec("dashscope")`` stays None and ``import dashscope`` raises
     ModuleNotFoundError, until something imports the SDK's subtree. Python cannot import
     ``dashscope.finetune.reinforcement`` without modules for ``dashscope`` and
     ``dashscope.finetune``, so the finder answers those two only while an import of the
     subtree is under way (it looks at the import system's frames for the name asked).
   - Once the subtree is imported, those two parents are in ``sys.modules``: a probe then
     finds a ``dashscope`` module, but any attribute outside the subtree
     (``dashscope.Generation``) raises AttributeError, and ``import dashscope.audio``
     ModuleNotFoundError, each saying the SDK is not installed and that this is the
     runtime's compatibility layer.

   A real ``dashscope`` without that subtree (an older SDK pinned for its LLM calls)
   is left in place, and the finder provides the subtree beside it: last on
   ``sys.meta_path``, it is asked only for the ``dashscope.finetune*`` names the real
   package lacks.

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
from types import FrameType, ModuleType
from typing import Any, NoReturn

from processors_base import models
from processors_base.models import FunctionType
from runtime.compat.alias import EXTRA_MODULES, MODULES, SDK, exports

__all__ = [
    "SDK",
    "SDK_REWARD_PROCESSING",
    "install",
    "installed",
    "recognise",
    "runs_the_sdks_reward_processing",
    "uninstall",
]

_ORIGIN = "runtime.compat.sdk"
_PARENTS = ("dashscope", "dashscope.finetune")
_FULL_NAMES = {SDK + relative for relative in MODULES} | set(EXTRA_MODULES)
_PACKAGES = {n for n in _FULL_NAMES if any(o.startswith(n + ".") for o in _FULL_NAMES)}


def _absent(what: str) -> str:
    return (
        f"{what}: the DashScope SDK is not installed. This process runs agentic-rl-runtime, "
        f"whose compatibility layer provides only {SDK} (pip install dashscope for the rest)"
    )


def _parent_getattr(module_name: str) -> Any:
    def __getattr__(name: str) -> NoReturn:
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        raise AttributeError(_absent(f"{module_name}.{name} is not available"), name=name)

    return __getattr__


def _importing_the_subtree() -> bool:
    """Whether an import of ``dashscope.finetune`` or below is under way: the import
    system's own frames hold the name being imported."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "importlib._bootstrap":
            name = frame.f_locals.get("name")
            if isinstance(name, str) and (
                name == _PARENTS[1] or name.startswith(_PARENTS[1] + ".")
            ):
                return True
        frame = frame.f_back
    return False


class _SdkAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the SDK's module paths with modules holding our implementation.

    ``beside_real``: a real ``dashscope`` is installed, but without the subtree (an older
    SDK pinned for its LLM calls). Last on ``sys.meta_path``, the finder is then asked only
    for names the real package lacks, and answers only those under ``dashscope.finetune``.
    """

    def __init__(self, beside_real: bool = False) -> None:
        self.beside_real = beside_real

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.beside_real and not (
            fullname == _PARENTS[1] or fullname.startswith(_PARENTS[1] + ".")
        ):
            return None  # the real package's own names, found or not, are its business
        if fullname in _PARENTS:
            if not _importing_the_subtree():
                return None  # as if absent: a probe for the SDK finds nothing
            return importlib.util.spec_from_loader(fullname, self, origin=_ORIGIN, is_package=True)
        if fullname in _FULL_NAMES:
            return importlib.util.spec_from_loader(
                fullname, self, origin=_ORIGIN, is_package=fullname in _PACKAGES
            )
        if fullname.startswith(_PARENTS[0] + "."):  # only reached below our own parents
            if self.beside_real:
                return None
            raise ModuleNotFoundError(_absent(f"No module named {fullname!r}"), name=fullname)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        if module.__name__ in _PARENTS:
            getattr_ = _beside_real_getattr if self.beside_real else _parent_getattr
            # the module's namespace, as an assignment would (ModuleType types __getattr__
            # as a method, which cannot be assigned)
            module.__dict__["__getattr__"] = getattr_(module.__name__)
            return
        names = exports(module.__name__)
        module.__dict__.update(names)
        module.__dict__["__all__"] = sorted(names)


def _beside_real_getattr(module_name: str) -> Any:
    def __getattr__(name: str) -> NoReturn:
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        raise AttributeError(
            f"{module_name}.{name} is not available: the installed dashscope has no "
            f"{module_name}; agentic-rl-runtime provides only {SDK} beside it",
            name=name,
        )

    return __getattr__


def _real_has_the_subtree() -> bool:
    """Whether the installed ``dashscope`` has ``finetune.reinforcement``: looked up on
    disk, without importing the package (importing it is slow and has side effects)."""
    if SDK in sys.modules:
        return True
    real = sys.modules.get("dashscope")
    locations = getattr(real, "__path__", None)
    if locations is None:
        spec = importlib.util.find_spec("dashscope")
        locations = spec.submodule_search_locations if spec is not None else None
    for name in (_PARENTS[1], SDK):
        if locations is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
        if spec is None:
            return False
        locations = spec.submodule_search_locations
    return True


def installed() -> bool:
    return any(isinstance(finder, _SdkAliases) for finder in sys.meta_path)


def install() -> bool:
    """Serve the SDK's import paths from this project, unless a real SDK provides them.

    A real ``dashscope`` with the subtree is left alone (its classes are recognised, see
    ``recognise()``); one without it (an older SDK) gets the subtree beside it. Returns
    whether the aliases are in place. Idempotent.
    """
    if installed():
        return True
    if "dashscope" in sys.modules or importlib.util.find_spec("dashscope") is not None:
        if _real_has_the_subtree():
            return False
        sys.meta_path.append(_SdkAliases(beside_real=True))
        return True
    sys.meta_path.append(_SdkAliases())
    return True


def uninstall() -> None:
    """Remove the aliases and forget the modules they made."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _SdkAliases)]
    for name in list(sys.modules):
        module = sys.modules[name]
        if (name == "dashscope" or name.startswith("dashscope.")) and (
            getattr(module.__spec__, "origin", None) == _ORIGIN
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


SDK_REWARD_PROCESSING = (
    "--sub-reward-errors fail or renormalize (SUB_REWARD_ERRORS) cannot apply: this class "
    "is decorated by the installed SDK's own @reward_func, whose processing runs its "
    "sub-rewards (a failed one scores 0 and is only logged by the SDK); serve it where "
    "dashscope is not installed, or use --sub-reward-errors zero"
)


def runs_the_sdks_reward_processing(cls: type) -> bool:
    """Whether ``cls`` was decorated by the installed SDK's own ``@reward_func``: its
    ``process`` is then the SDK's, which runs the sub-rewards its own way (so none of
    ``--sub-reward-errors``, the failure counter or the ``.failed`` marks apply)."""
    process = getattr(cls, "process", None)
    return getattr(process, "__module__", None) == f"{SDK}.component.func_decorator"
