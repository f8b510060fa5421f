"""Tool spans: ``trace_tool`` for tool objects, ``@observe_tool`` for plain functions.

``trace_tool`` accepts a single tool (a ``name`` plus ``invoke``/``ainvoke``, as
LangChain's BaseTool), a list or tuple of them, a dict of name to tool, a LangGraph
ToolNode (its ``tools_by_name``), and MCP tools as langchain-mcp-adapters returns them
(provider recorded as "mcp"). It patches each tool's ``invoke``/``ainvoke`` in place and
returns what it was given; tracing twice traces once. Anything else is passed through
untouched with one warning per type, as the SDK does: tracing never breaks a rollout.

``provider=`` labels the spans (``gen_ai.provider.name``; MCP tools default to "mcp");
``handler=`` (``@observe_tool``) records through a GenAI telemetry handler of your own
instead of the runtime's. ``tracer_provider=`` picks the OpenTelemetry provider.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, overload

from processors_base.observability import _spans
from processors_base.observability._core import active_provider, capture, capture_enabled, handler

__all__ = ["observe_tool", "trace_tool"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
_MARK = "__rl_traced__"
_log = logging.getLogger(__name__)
_warned_types: set[type] = set()


def trace_tool(tools: T, *, provider: str | None = None, tracer_provider: Any = None) -> T:
    """Trace every call of these tools from now on; returns what it was given."""
    if isinstance(tools, Mapping):
        for tool in tools.values():
            trace_tool(tool, provider=provider, tracer_provider=tracer_provider)
        return tools
    if isinstance(tools, (list, tuple)):
        for tool in tools:
            trace_tool(tool, provider=provider, tracer_provider=tracer_provider)
        return tools
    by_name = getattr(tools, "tools_by_name", None)  # a LangGraph ToolNode
    if isinstance(by_name, Mapping):
        trace_tool(by_name, provider=provider, tracer_provider=tracer_provider)
        return tools
    if not (
        isinstance(getattr(tools, "name", None), str)
        and (callable(getattr(tools, "invoke", None)) or callable(getattr(tools, "ainvoke", None)))
    ):
        if type(tools) not in _warned_types:  # once per type: setup() may run per worker
            _warned_types.add(type(tools))
            _log.warning(
                "trace_tool: %s is not a tool (a name and invoke/ainvoke); passed through "
                "untraced. For a plain function, use @observe_tool.",
                type(tools).__name__,
            )
        return tools
    label = provider or ("mcp" if _is_mcp(tools) else None)
    for method in ("invoke", "ainvoke"):
        original = getattr(tools, method, None)
        if callable(original) and getattr(original, _MARK, None) is None:
            traced = _wrap_method(tools, original, tracer_provider, label)
            setattr(traced, _MARK, original)
            object.__setattr__(tools, method, traced)  # BaseTool is a pydantic model
    return tools


def _is_mcp(tool: Any) -> bool:
    coroutine = getattr(tool, "coroutine", None)
    return (getattr(coroutine, "__module__", "") or "").startswith("langchain_mcp_adapters")


@contextmanager
def _tool_span(
    provider: Any,
    name: str,
    call_id: Any,
    arguments: Any,
    description: Any,
    label: str | None = None,
    telemetry: Any = None,
) -> Iterator[Callable[[Any], Any]]:
    """A tool span around one call; yields ``done(result)``, which records the result,
    ends the span and returns the result. ``label`` is the span's provider name;
    ``telemetry`` a user's own GenAI handler, else the runtime's for ``provider``."""
    from opentelemetry.util.genai.extended_types import ExecuteToolInvocation
    from opentelemetry.util.genai.types import Error

    invocation = ExecuteToolInvocation(
        tool_name=name,
        tool_call_id=str(call_id) if call_id else None,
        tool_description=description if isinstance(description, str) and description else None,
        tool_type="function",
        provider=label,
    )
    if label:
        invocation.attributes["gen_ai.provider.name"] = label
    capturing = capture_enabled()
    if capturing:
        invocation.attributes["gen_ai.tool.call.arguments"] = capture(arguments)
    telemetry = telemetry if telemetry is not None else handler(provider)
    telemetry.start_execute_tool(invocation)

    def done(result: Any) -> Any:
        if capturing:
            invocation.attributes["gen_ai.tool.call.result"] = capture(result)
        telemetry.stop_execute_tool(invocation)
        return result

    try:
        yield done
    except BaseException as exc:
        if invocation.span is not None:
            _spans.record_error(invocation.span, exc)
        message = _spans.scrub_capped(str(exc))
        telemetry.fail_execute_tool(invocation, Error(message=message, type=type(exc)))
        raise


def _call_of(tool_input: Any) -> tuple[Any, Any]:
    """(tool call id, arguments) of an invoke input: a ToolCall dict, or plain arguments."""
    if isinstance(tool_input, Mapping) and tool_input.get("type") == "tool_call":
        return tool_input.get("id"), tool_input.get("args")
    return None, tool_input


def _wrap_method(
    tool: Any, original: Callable[..., Any], tracer_provider: Any, label: str | None
) -> Callable[..., Any]:
    description = getattr(tool, "description", None)

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def traced_async(tool_input: Any, *args: Any, **kwargs: Any) -> Any:
            provider = active_provider(tracer_provider)
            if provider is None:
                return await original(tool_input, *args, **kwargs)
            call_id, arguments = _call_of(tool_input)
            with _tool_span(provider, tool.name, call_id, arguments, description, label) as done:
                return done(await original(tool_input, *args, **kwargs))

        return traced_async

    @functools.wraps(original)
    def traced(tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        provider = active_provider(tracer_provider)
        if provider is None:
            return original(tool_input, *args, **kwargs)
        call_id, arguments = _call_of(tool_input)
        with _tool_span(provider, tool.name, call_id, arguments, description, label) as done:
            return done(original(tool_input, *args, **kwargs))

    return traced


@overload
def observe_tool(
    func: Callable[P, R],
    /,
    *,
    name: str | None = None,
    provider: str | None = None,
    handler: Any = None,
    tracer_provider: Any = None,
) -> Callable[P, R]: ...
@overload
def observe_tool(
    func: None = None,
    /,
    *,
    name: str | None = None,
    provider: str | None = None,
    handler: Any = None,
    tracer_provider: Any = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def observe_tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    provider: str | None = None,
    handler: Any = None,
    tracer_provider: Any = None,
) -> Any:
    """A tool span around a plain function, sync or async, named after it (or ``name``);
    ``provider`` labels the span, ``handler`` records it through your own GenAI handler."""
    if func is None:
        return lambda f: observe_tool(
            f, name=name, provider=provider, handler=handler, tracer_provider=tracer_provider
        )
    tool_name = name or func.__name__
    signature = inspect.signature(func)

    def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return dict(signature.bind(*args, **kwargs).arguments)
        except TypeError:
            return {"args": list(args), **kwargs}

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def observed_async(*args: Any, **kwargs: Any) -> Any:
            active = active_provider(tracer_provider)
            if active is None:
                return await func(*args, **kwargs)
            with _tool_span(
                active, tool_name, None, arguments(args, kwargs), func.__doc__, provider, handler
            ) as done:
                return done(await func(*args, **kwargs))

        return observed_async

    @functools.wraps(func)
    def observed(*args: Any, **kwargs: Any) -> Any:
        active = active_provider(tracer_provider)
        if active is None:
            return func(*args, **kwargs)
        with _tool_span(
            active, tool_name, None, arguments(args, kwargs), func.__doc__, provider, handler
        ) as done:
            return done(func(*args, **kwargs))

    return observed
