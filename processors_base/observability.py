"""Tracing instrumentation users put in their functions.

Until tracing lands these are pass-through: they accept every documented call shape,
return what they are given, and never change a function's behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "observe_llm",
    "observe_processor",
    "observe_tool",
    "trace_client",
    "trace_tool",
    "untrace_client",
]


def _decorator(func: Any = None, /, **_options: Any) -> Any:
    if func is None:  # used with arguments: @observe_llm(...)
        return lambda f: f
    return func


def observe_processor(func: Callable[..., T] | None = None, /, **options: Any) -> Any:
    """Mark ``process()`` for a processor span."""
    return _decorator(func, **options)


def observe_llm(func: Callable[..., T] | None = None, /, **options: Any) -> Any:
    """Mark a custom LLM call for an LLM span."""
    return _decorator(func, **options)


def observe_tool(func: Callable[..., T] | None = None, /, **options: Any) -> Any:
    """Mark a plain tool function for a tool span."""
    return _decorator(func, **options)


def trace_client(client: T, **_options: Any) -> T:
    """Trace every chat completion made through ``client``; returns the client."""
    return client


def untrace_client(client: T) -> T:
    """Undo ``trace_client``."""
    return client


def trace_tool(tools: T, **_options: Any) -> T:
    """Trace every call of these tools; returns what it was given."""
    return tools
