"""Stand-ins for the SDK's deployment client (upload, register, tune), which this runtime
does not include: importing them works, using them raises one clear error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

__all__ = [
    "SERVER",
    "NotProvidedError",
    "unavailable_class",
    "unavailable_function",
    "unavailable_object",
]


class NotProvidedError(NotImplementedError):
    """A name of the DashScope SDK that this runtime's compatibility layer cannot honour."""


_CLIENT = (
    "is part of the DashScope SDK's deployment client. Ship functions with "
    "`python -m runtime ship`, or pip install dashscope to use the SDK's client."
)
SERVER = (
    "is part of the DashScope SDK's function server; this runtime serves in its place: "
    "`python -m runtime serve` (it reads FUNC_TYPE and PROCESSOR_CLASS as the SDK's does)."
)


def _message(qualified: str, what: str = _CLIENT) -> str:
    return (
        f"{qualified} is not available: the DashScope SDK is not installed, and this process "
        f"runs agentic-rl-runtime's compatibility layer for it. {qualified} {what}"
    )


def unavailable_function(module: str, name: str, what: str = _CLIENT) -> Callable[..., NoReturn]:
    qualified = f"{module}.{name}"

    def unavailable(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotProvidedError(_message(qualified, what))

    unavailable.__name__ = unavailable.__qualname__ = name
    unavailable.__module__ = module
    unavailable.__doc__ = _message(qualified, what)
    return unavailable


def unavailable_class(module: str, name: str) -> type:
    """A class that can be named, subclassed and isinstance-checked, but not instantiated."""
    qualified = f"{module}.{name}"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotProvidedError(_message(qualified))

    return type(
        name, (), {"__init__": __init__, "__module__": module, "__doc__": _message(qualified)}
    )


class _Unavailable:
    """An object of the SDK's server (its app, executor, func_manager): naming it works;
    calling it or reaching any attribute (``executor.submit``) raises NotProvidedError."""

    def __init__(self, qualified: str, what: str) -> None:
        object.__setattr__(self, "_message", _message(qualified, what))
        object.__setattr__(self, "_qualified", qualified)

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__") and name.endswith("__"):  # copy, pickle, inspect probes
            raise AttributeError(name)
        raise NotProvidedError(self._message)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise NotProvidedError(self._message)

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotProvidedError(self._message)

    def __repr__(self) -> str:
        return f"<{self._qualified}: not available under agentic-rl-runtime>"


def unavailable_object(module: str, name: str, what: str = SERVER) -> Any:
    return _Unavailable(f"{module}.{name}", what)
