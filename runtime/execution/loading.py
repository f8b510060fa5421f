"""Resolve a target (``pkg.module:Class``, ``pkg.module.Class`` or ``file.py:Class``) to a
processor class and its function type."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from processors_base.models import FunctionType, WireModel
from processors_base.processors import AbstractProcessor
from runtime.compat import sdk as sdk_compat

__all__ = ["Target", "TargetError", "load_target"]


class TargetError(Exception):
    """The target cannot be served; the message says which target and why, in one line."""


@dataclass(frozen=True)
class Target:
    spec: str
    cls: type[Any]  # ours, or derived from the installed DashScope SDK's bases
    func_type: FunctionType
    input_model: type[Any]
    output_model: type[WireModel]
    workspace: Path

    @property
    def name(self) -> str:
        return self.cls.__name__


def load_target(
    spec: str, workspace: str | Path = ".", expected: FunctionType | str | None = None
) -> Target:
    """Import ``spec`` from ``workspace`` (put first on ``sys.path``) and check it is servable."""
    spec = spec.strip()
    if not spec:
        raise TargetError("no target given: pass module:Class (or set PROCESSOR_CLASS)")
    root = Path(workspace).resolve()
    if not root.is_dir():
        raise TargetError(f"workspace {str(workspace)!r} is not a directory")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))

    module_part, _, class_name = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    if not module_part or not class_name:
        raise TargetError(
            f"target {spec!r} is not of the form package.module:Class, package.module.Class "
            "or path/to/file.py:Class"
        )
    sdk_compat.install()  # code written for the DashScope SDK imports its paths
    module = _import(module_part, root)
    cls = getattr(module, class_name, None)
    if cls is None or isinstance(cls, ModuleType):
        raise TargetError(_not_a_class(spec, module, class_name, root))
    func_type, input_model, output_model = _kind_of(cls, spec)
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TargetError(f"{spec}: {class_name} is abstract (does not implement {missing})")
    if expected is not None and str(expected) != func_type.value:
        raise TargetError(
            f"{spec}: the function type was given as {str(expected)!r}, "
            f"but {class_name} is a {func_type.value!r} processor"
        )
    return Target(spec, cls, func_type, input_model, output_model, root)


def _not_a_class(spec: str, module: ModuleType, name: str, root: Path) -> str:
    """Why ``module.name`` is no class to serve, with the processor classes to pick from."""
    full = f"{module.__name__}.{name}"
    try:
        is_module = importlib.util.find_spec(full) is not None
    except (ImportError, ValueError):
        is_module = False
    if not is_module:
        return (
            f"module {module.__name__!r} has no attribute {name!r}; "
            f"{_classes_in(module, f'{module.__name__}:')}"
        )
    inner = _import(full, root)  # a module that fails to import says why
    return (
        f"target {spec!r} names a module, not a class: add :ClassName; "
        f"{_classes_in(inner, f'{full}:')}"
    )


def _classes_in(module: ModuleType, prefix: str) -> str:
    found = sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type) and not inspect.isabstract(value) and _is_processor(value)
    )
    if not found:
        return "it defines no processor class"
    return "processor classes in it: " + ", ".join(prefix + name for name in found)


def _is_processor(cls: type[Any]) -> bool:
    try:
        _kind_of(cls, cls.__name__)
    except TargetError:
        return False
    return True


def _import(module_part: str, root: Path) -> ModuleType:
    try:
        if module_part.endswith(".py"):
            return _import_file(Path(module_part), root)
        return importlib.import_module(module_part)
    except TargetError:
        raise
    except SyntaxError as exc:
        raise TargetError(
            f"importing {module_part!r} failed: "
            f"SyntaxError at {exc.filename}:{exc.lineno}: {exc.msg}"
        ) from exc
    except BaseException as exc:  # SystemExit from a module body is an import failure too
        raise TargetError(f"importing {module_part!r} failed: {type(exc).__name__}: {exc}") from exc


def _import_file(path: Path, root: Path) -> ModuleType:
    path = (root / path).resolve()
    if not path.is_file():
        raise TargetError(f"file {str(path)!r} does not exist")
    try:  # inside the workspace: import by dotted name so relative imports work
        dotted = ".".join(path.relative_to(root).with_suffix("").parts)
        return importlib.import_module(dotted)
    except ValueError:
        pass
    name = f"_target_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _kind_of(cls: object, spec: str) -> tuple[FunctionType, type[Any], type[WireModel]]:
    """Function type, input model and output model of a processor class."""
    if isinstance(cls, type) and issubclass(cls, AbstractProcessor):
        func_type = getattr(cls, "func_type", None)
        if not isinstance(func_type, FunctionType):
            raise TargetError(
                f"{spec} derives from AbstractProcessor but from none of its three bases"
            )
        return func_type, cls.input_model, cls.output_model
    recognised = sdk_compat.recognise(cls) if isinstance(cls, type) else None
    if recognised is None:
        raise TargetError(
            f"{spec} is not a processor class: derive it from AbstractRolloutProcessor, "
            "AbstractRewardProcessor or AbstractGroupRewardProcessor"
        )
    return recognised
