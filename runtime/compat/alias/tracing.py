"""The SDK's tracing helpers beyond the decorators, on this runtime's tracing.

Tracing is on when the runtime installed a tracer provider (``--tracing``); every helper
here is a pass-through while it is off. Request ids travel as baggage under the runtime's
own keys, which its tracer provider copies onto every span: ``rollout_context`` uses the
same keys, so spans made inside it carry the ids as the runtime's own spans do.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from enum import Enum
from types import SimpleNamespace
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import format_span_id, format_trace_id

from processors_base.models import BaseDataModel, FunctionType
from processors_base.observability import observe_processor, runtime_hooks, trace_client
from processors_base.observability.runtime_hooks import processor_span, record_output

__all__ = [
    "AGENTIC_RL_ATTEMPT_ID_BAGGAGE_KEY",
    "AGENTIC_RL_ROLLOUT_ID_BAGGAGE_KEY",
    "AGENTIC_RL_SAMPLE_ID_BAGGAGE_KEY",
    "GENAI_AVAILABLE",
    "ForceFlushMode",
    "apply_processor_span_attributes_after",
    "apply_processor_span_attributes_before",
    "async_trace_processor_process",
    "current_span_ids_hex",
    "current_trace_id_hex",
    "dashscope_response_to_output_messages",
    "ensure_agentic_rl_baggage_span_processor",
    "genai_llm_span",
    "get_tracer",
    "get_upstream_trace_linkage",
    "instrument_dashscope_generation_call",
    "instrument_openai_chat_completions",
    "is_tracing_enabled",
    "log_trace_id",
    "maybe_force_flush",
    "maybe_force_flush_async",
    "openai_chat_messages_to_input_messages",
    "openai_completion_to_output_messages",
    "reset_upstream_trace_linkage",
    "resolve_processor_func_type_for_span",
    "rollout_context",
    "run_with_genai_llm_span",
    "set_upstream_trace_linkage",
    "span_payload_preview",
    "tool_calls_to_parts",
    "trace_processor_process",
    "trace_processor_span",
    "unwrap_openai_completion",
]

_log = logging.getLogger("processors")
_TRACER = "agentic-rl-runtime"
(
    AGENTIC_RL_ROLLOUT_ID_BAGGAGE_KEY,
    AGENTIC_RL_SAMPLE_ID_BAGGAGE_KEY,
    AGENTIC_RL_ATTEMPT_ID_BAGGAGE_KEY,
) = runtime_hooks.BAGGAGE_KEYS[:3]
GENAI_AVAILABLE = True  # loongsuite-util-genai is a dependency of this runtime


def is_tracing_enabled() -> bool:
    """As the SDK answers (``ENABLE_TRAJECTORY`` is true, 1 or yes), or the runtime is
    tracing (``--tracing``)."""
    enabled = os.environ.get("ENABLE_TRAJECTORY", "").strip().lower() in ("true", "1", "yes")
    return enabled or runtime_hooks.active_provider() is not None


def get_tracer() -> Any:
    """The runtime's tracer (a no-op one while tracing is off)."""
    return trace.get_tracer(_TRACER)


def current_trace_id_hex() -> str | None:
    context = trace.get_current_span().get_span_context()
    return format_trace_id(context.trace_id) if context.is_valid else None


def current_span_ids_hex() -> tuple[str | None, str | None]:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    return format_trace_id(context.trace_id), format_span_id(context.span_id)


def log_trace_id(role: str) -> None:
    """A debug line with the current trace id, when AGENTIC_RL_LOG_TRACE_ID is true."""
    if os.environ.get("AGENTIC_RL_LOG_TRACE_ID", "").strip().lower() in ("1", "true", "yes"):
        _log.info("trace_id=%s role=%s", current_trace_id_hex(), role)


def span_payload_preview(obj: Any) -> str:
    """JSON of ``obj`` for a span attribute: capped, with secrets redacted."""
    return runtime_hooks.capture(obj)


@contextmanager
def rollout_context(
    rollout_id: str | None = None, sample_id: str | None = None, attempt_id: str | None = None
) -> Iterator[None]:
    """Spans made inside carry these ids (as the runtime's spans do for each request)."""
    context = otel_context.get_current()
    for key, value in zip(
        runtime_hooks.BAGGAGE_KEYS, (rollout_id, sample_id, attempt_id), strict=False
    ):
        if value:
            context = baggage.set_baggage(key, value, context)
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def ensure_agentic_rl_baggage_span_processor() -> None:
    """Nothing to do: the runtime's tracer provider already copies the ids onto spans."""


_UPSTREAM_PRESENT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "upstream_traceparent_present", default=False
)
_UPSTREAM_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "upstream_trace_id", default=None
)


def set_upstream_trace_linkage(
    *, traceparent_present: bool, upstream_trace_id: str | None
) -> tuple[contextvars.Token[bool], contextvars.Token[str | None]]:
    return _UPSTREAM_PRESENT.set(bool(traceparent_present)), _UPSTREAM_ID.set(upstream_trace_id)


def reset_upstream_trace_linkage(
    tokens: tuple[contextvars.Token[bool], contextvars.Token[str | None]],
) -> None:
    _UPSTREAM_PRESENT.reset(tokens[0])
    _UPSTREAM_ID.reset(tokens[1])


def get_upstream_trace_linkage() -> tuple[bool, str | None]:
    return _UPSTREAM_PRESENT.get(), _UPSTREAM_ID.get()


class ForceFlushMode(str, Enum):
    NONE = "none"
    SHUTDOWN = "shutdown"
    REQUEST = "request"


def _flush_mode() -> ForceFlushMode:
    try:
        return ForceFlushMode(os.environ.get("AGENTIC_RL_FORCE_FLUSH_MODE", "shutdown").lower())
    except ValueError:
        return ForceFlushMode.SHUTDOWN


def maybe_force_flush(*, reason: str) -> None:
    """Export pending spans now, if AGENTIC_RL_FORCE_FLUSH_MODE asks for it at this point
    (``request``: always; ``shutdown``: when ``reason`` is "shutdown")."""
    mode = _flush_mode()
    if mode is ForceFlushMode.NONE or (mode is ForceFlushMode.SHUTDOWN and reason != "shutdown"):
        return
    provider = runtime_hooks.active_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        timeout = int(os.environ.get("AGENTIC_RL_FORCE_FLUSH_TIMEOUT_MS", "3000") or 3000)
        flush(min(max(timeout, 1), 60_000))


async def maybe_force_flush_async(*, reason: str) -> None:
    import anyio.to_thread

    await anyio.to_thread.run_sync(lambda: maybe_force_flush(reason=reason))


def resolve_processor_func_type_for_span(
    input_data: BaseDataModel, logical_kind: str
) -> FunctionType:
    """The input's own ``func_type``, else the one ``logical_kind`` names."""
    found = getattr(input_data, "func_type", None)
    if found is not None:
        return FunctionType(found)
    try:
        return FunctionType(logical_kind.strip().lower())
    except ValueError:
        raise ValueError(
            f"cannot tell the function type: the input has no func_type and "
            f"logical_kind={logical_kind!r} is not rollout, reward or group_reward"
        ) from None


def apply_processor_span_attributes_before(
    span: Any, *, func_type: FunctionType, input_data: Any, capture_full_io: bool = True
) -> None:
    span.set_attribute("agentic_rl.func_type", FunctionType(func_type).value)
    if capture_full_io and runtime_hooks.capture_enabled():
        span.set_attribute("agentic_rl.input", runtime_hooks.capture(input_data))


def apply_processor_span_attributes_after(
    span: Any, result: Any, *, capture_full_io: bool = True
) -> None:
    if capture_full_io:
        record_output(span, result)


def _span_for(func_type: Any, processor: Any, input_data: Any) -> Any:
    provider = runtime_hooks.active_provider()
    if provider is None:
        return None
    return processor_span(
        provider, FunctionType(func_type).value, type(processor).__name__, input_data
    )


def trace_processor_process(func_type: Any, processor: Any, input_data: Any) -> Any:
    """``processor.process(input_data)`` inside a processor span (while tracing is on)."""
    span_cm = _span_for(func_type, processor, input_data)
    if span_cm is None:
        return processor.process(input_data)
    with span_cm as span:
        output = processor.process(input_data)
        record_output(span, output)
        return output


async def async_trace_processor_process(func_type: Any, processor: Any, input_data: Any) -> Any:
    span_cm = _span_for(func_type, processor, input_data)
    if span_cm is None:
        return await processor.process(input_data)
    with span_cm as span:
        output = await processor.process(input_data)
        record_output(span, output)
        return output


def trace_processor_span(
    _fn: Callable[..., Any] | None = None,
    *,
    logical_kind: str = "",
    otel_span_kind: Any = None,
    capture_io_attributes: bool = True,
) -> Any:
    """``@observe_processor`` under its lower-level name; the kind comes from the
    processor's base, which always agrees with ``logical_kind`` here."""
    return observe_processor(_fn) if _fn is not None else observe_processor


# --- LLM spans of your own ------------------------------------------------------------


@contextmanager
def genai_llm_span(handler: Any = None) -> Iterator[Any]:
    """An LLM invocation to fill in (``request_model``, ``provider``, ...) and record as a
    span; a plain namespace while tracing is off."""
    provider = runtime_hooks.active_provider()
    if provider is None:
        yield SimpleNamespace()
        return
    with (handler or runtime_hooks.handler(provider)).llm() as invocation:
        yield invocation


def run_with_genai_llm_span(
    fn: Callable[..., Any],
    /,
    *fn_args: Any,
    provider: str | None = None,
    request_model: Any = None,
    input_messages: Any = None,
    result_mapper: Callable[[Any, Any], None] | None = None,
    handler: Any = None,
    **fn_kwargs: Any,
) -> Any:
    """``fn(*fn_args, **fn_kwargs)`` inside an LLM span."""
    if runtime_hooks.active_provider() is None:
        return fn(*fn_args, **fn_kwargs)
    with genai_llm_span(handler) as invocation:
        invocation.request_model = str(request_model or "")
        invocation.provider = provider
        if input_messages is not None and runtime_hooks.capture_enabled():
            invocation.attributes["gen_ai.input.messages"] = runtime_hooks.capture(input_messages)
        result = fn(*fn_args, **fn_kwargs)
        if result_mapper is not None:
            result_mapper(invocation, result)
        else:
            runtime_hooks.apply_response(invocation, result)
        return result


def instrument_openai_chat_completions(
    client: Any, *, provider: str = "openai", handler: Any = None
) -> Any:
    """Trace an OpenAI-compatible client (or completions resource); returns it."""
    return trace_client(client, provider=provider, handler=handler)


def instrument_dashscope_generation_call(
    generation_cls: Any, *, provider: str = "dashscope", handler: Any = None
) -> Any:
    """Trace the DashScope ``Generation`` class's ``call``; returns the class."""
    return trace_client(generation_cls, provider=provider, handler=handler)


# --- messages in the GenAI semantic conventions' types -----------------------------------


def unwrap_openai_completion(completion: Any) -> Any:
    """The completion object inside a raw or wrapped response (``.parse()``), else itself."""
    parse = getattr(completion, "parse", None)
    if callable(parse) and not hasattr(completion, "choices"):
        return parse()
    return completion


def tool_calls_to_parts(tool_calls: Any) -> list[Any]:
    from opentelemetry.util.genai.types import ToolCall

    parts = []
    for call in tool_calls or []:
        function = runtime_hooks.field(call, "function")
        arguments = runtime_hooks.field(function, "arguments")
        if isinstance(arguments, str):
            with suppress(ValueError):
                arguments = json.loads(arguments)
        parts.append(
            ToolCall(
                arguments=arguments,
                name=runtime_hooks.field(function, "name"),
                id=runtime_hooks.field(call, "id"),
            )
        )
    return parts


def _parts(message: Any) -> list[Any]:
    from opentelemetry.util.genai.types import Text, ToolCallResponse

    content = runtime_hooks.field(message, "content")
    if runtime_hooks.field(message, "role") == "tool":
        return [ToolCallResponse(response=content, id=runtime_hooks.field(message, "tool_call_id"))]
    parts: list[Any] = []
    if isinstance(content, str) and content:
        parts.append(Text(content=content))
    elif isinstance(content, list):  # content parts: keep their text
        parts += [
            Text(content=str(runtime_hooks.field(p, "text")))
            for p in content
            if runtime_hooks.field(p, "text")
        ]
    return parts + tool_calls_to_parts(runtime_hooks.field(message, "tool_calls"))


def openai_chat_messages_to_input_messages(messages: Any) -> list[Any]:
    from opentelemetry.util.genai.types import InputMessage

    return [
        InputMessage(role=str(runtime_hooks.field(m, "role") or "user"), parts=_parts(m))
        for m in messages or []
    ]


def _output_messages(choices: Any) -> list[Any]:
    from opentelemetry.util.genai.types import OutputMessage

    return [
        OutputMessage(
            role=str(runtime_hooks.field(c, "message", "role") or "assistant"),
            parts=_parts(runtime_hooks.field(c, "message")),
            finish_reason=str(runtime_hooks.field(c, "finish_reason") or "stop"),
        )
        for c in choices or []
    ]


def openai_completion_to_output_messages(completion: Any) -> list[Any]:
    return _output_messages(runtime_hooks.field(unwrap_openai_completion(completion), "choices"))


def dashscope_response_to_output_messages(response: Any) -> list[Any]:
    from opentelemetry.util.genai.types import OutputMessage, Text

    choices = runtime_hooks.field(response, "output", "choices")
    if choices:
        return _output_messages(choices)
    text = runtime_hooks.field(response, "output", "text")
    if text is None:
        return []
    reason = runtime_hooks.field(response, "output", "finish_reason") or "stop"
    return [OutputMessage(role="assistant", parts=[Text(content=str(text))], finish_reason=reason)]
