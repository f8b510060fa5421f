"""The processor span: one per call of ``process()``, parent of its LLM and tool spans.

Under the runtime with tracing on, every request gets this span whether or not
``process`` is decorated (the runtime opens it, as a child of the caller's span);
``@observe_processor`` then adds nothing, so there is never a second one. Outside the
runtime (a test harness with its own tracer provider) the decorator opens it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    Span,
    SpanKind,
    Status,
    StatusCode,
    set_span_in_context,
)

from processors_base.observability import _spans
from processors_base.observability._core import active_provider, capture, capture_enabled
from processors_base.redaction import redact_head

__all__ = [
    "observe_processor",
    "processor_context",
    "processor_span",
    "record_output",
    "runtime_opens_processor_spans",
]

P = ParamSpec("P")
R = TypeVar("R")

# The key OpenTelemetry keeps the current span under (read through its public API).
SPAN_KEY = next(iter(set_span_in_context(INVALID_SPAN, Context())))

_in_processor_span: ContextVar[bool] = ContextVar("in_processor_span", default=False)
_opened_by_runtime = False


def runtime_opens_processor_spans(opens: bool = True) -> None:
    """The runtime, whose tracing opens every request's processor span itself, says so
    when tracing starts (and ``False`` when it stops): ``@observe_processor`` then opens
    none in this process, even where user code replaced the current context."""
    global _opened_by_runtime
    _opened_by_runtime = opens


_tracers: dict[int, tuple[Any, Any]] = {}


def _tracer(provider: Any) -> Any:
    found = _tracers.get(id(provider))
    if found is None or found[0] is not provider:
        found = _tracers[id(provider)] = (provider, provider.get_tracer("agentic-rl-runtime"))
    return found[1]


@contextmanager
def processor_span(
    provider: Any,
    func_type: str,
    processor: str,
    input_data: Any,
    *,
    context: Any = None,
    attributes: dict[str, Any] | None = None,
) -> Iterator[Span]:
    # The function type and the processor are in the span's name (and, under the runtime,
    # in the resource): every attribute costs on the hot path and again when exported.
    # (The runtime opens its own, leaner, with processor_context(): runtime.tracing.spans.)
    attrs = dict(attributes) if attributes else {}
    if capture_enabled():
        attrs["agentic_rl.input"] = capture(input_data)
    parent = context if context is not None else otel_context.get_current()
    span = _tracer(provider).start_span(
        f"{func_type} {processor}", context=parent, kind=SpanKind.SERVER, attributes=attrs
    )
    token = otel_context.attach(processor_context(span, parent))
    marked = _in_processor_span.set(True)  # (whatever OpenTelemetry context user code sets)
    try:
        yield span
    except BaseException as exc:
        _spans.record_error(span, exc)
        raise
    finally:
        _in_processor_span.reset(marked)
        otel_context.detach(token)
        span.end()


def processor_context(span: Span, parent: Context) -> Context:
    """``parent`` (the caller's span, the request's baggage) with ``span`` as the current
    span: every span made under it, in this task or its threads, inherits both."""
    return Context({**parent, SPAN_KEY: span})


def record_output(span: Span, output: Any) -> None:
    """A failed output makes the span an error; a preview when content is captured."""
    status = getattr(output, "status", None)  # an output model's, most often
    if status is None:
        status = _spans.field(output, "status")  # a mapping's
    if not isinstance(status, str):  # a str enum (ours) compares as its value already
        status = getattr(status, "value", status)
    if status == "failed":
        span.set_attribute("agentic_rl.status", "failed")
        error = _spans.field(output, "error")
        # cut before it is scrubbed: an error text may be huge
        span.set_status(Status(StatusCode.ERROR, redact_head(str(error or "failed"), 500)))
    if capture_enabled():
        span.set_attribute("agentic_rl.output", capture(output))


@overload
def observe_processor(
    func: Callable[P, R], /, *, tracer_provider: Any = None, **_options: Any
) -> Callable[P, R]: ...
@overload
def observe_processor(
    func: None = None, /, *, tracer_provider: Any = None, **_options: Any
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def observe_processor(
    func: Callable[..., Any] | None = None, /, *, tracer_provider: Any = None, **_options: Any
) -> Any:
    """A processor span per call of the decorated ``process(self, input_data)``."""
    if func is None:
        return lambda f: observe_processor(f, tracer_provider=tracer_provider)

    def open_span(self: Any, input_data: Any) -> Any:
        provider = active_provider(tracer_provider)
        if provider is None or _opened_by_runtime or _in_processor_span.get():
            return None
        func_type = getattr(getattr(self, "func_type", None), "value", None) or _kind_of(self)
        return processor_span(provider, func_type, type(self).__name__, input_data)

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def observed_async(self: Any, input_data: Any, *args: Any, **kwargs: Any) -> Any:
            span_cm = open_span(self, input_data)
            if span_cm is None:
                return await func(self, input_data, *args, **kwargs)
            with span_cm as span:
                output = await func(self, input_data, *args, **kwargs)
                record_output(span, output)
                return output

        return observed_async

    @functools.wraps(func)
    def observed(self: Any, input_data: Any, *args: Any, **kwargs: Any) -> Any:
        span_cm = open_span(self, input_data)
        if span_cm is None:
            return func(self, input_data, *args, **kwargs)
        with span_cm as span:
            output = func(self, input_data, *args, **kwargs)
            record_output(span, output)
            return output

    return observed


def _kind_of(processor: Any) -> str:
    # The kind comes from the processor's base, also for the DashScope SDK's bases.
    for klass in type(processor).__mro__:
        kind = {
            "AbstractRolloutProcessor": "rollout",
            "AbstractRewardProcessor": "reward",
            "AbstractGroupRewardProcessor": "group_reward",
        }.get(klass.__name__)
        if kind:
            return kind
    return "processor"
