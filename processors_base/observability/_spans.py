"""Filling GenAI invocations from requests and responses of any client shape, and
recording errors without leaking secrets."""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.trace import Span

from processors_base.observability._core import capture, capture_enabled, handler
from processors_base.redaction import in_flight, redact, redact_head, redact_tail, request_secrets

# request keyword -> LLMInvocation field
_REQUEST_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
    "stop": "stop_sequences",
}


def field(obj: Any, *path: str) -> Any:
    """obj.a.b or obj["a"]["b"], None where missing (responses come as objects or dicts)."""
    for name in path:
        if obj is None:
            return None
        obj = obj.get(name) if _is_mapping(obj.__class__) else getattr(obj, name, None)
    return obj


_mapping_types: dict[type, bool] = {dict: True}


def _is_mapping(kind: type) -> bool:
    # remembered per type: the ABC check behind isinstance(obj, Mapping) is slow on a hot
    # path (every request's output, with tracing on)
    found = _mapping_types.get(kind)
    if found is None:
        found = issubclass(kind, Mapping)
        if len(_mapping_types) < 1024:  # types made at run time would otherwise pile up
            _mapping_types[kind] = found
    return found


def scrub(text: str, extra: Iterable[str] = ()) -> str:
    """The request's secrets (in any encoding), ``extra`` and credentials blanked."""
    text = redact(text)
    extra = tuple(extra)
    return redact(text, extra, credentials=False) if extra else text


MAX_TEXT = 16_000  # characters of an exception's message, and of its stack, on a span


def scrub_capped(text: str, extra: Iterable[str] = ()) -> str:
    """``scrub``, the middle of a text past MAX_TEXT cut (as a log line's) before it is
    scrubbed: a huge exception message is never scrubbed whole (on the event loop)."""
    extra = tuple(extra)
    if len(text) <= MAX_TEXT:
        return scrub(text, extra)
    half = MAX_TEXT // 2
    secrets = (*(request_secrets.get() or in_flight.snapshot), *extra)
    head, tail = redact_head(text, half, secrets), redact_tail(text, half, secrets)
    return f"{head}\n... [{len(text) - 2 * half} characters cut] ...\n{tail}"


def record_error(span: Span, exc: BaseException, extra_secrets: Iterable[str] = ()) -> None:
    """Status ERROR and one exception event, with the request's secrets blanked out."""
    secrets = tuple(extra_secrets)
    message = scrub_capped(str(exc), secrets)
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    stack = scrub_capped(stack, secrets)
    span.record_exception(
        exc, attributes={"exception.message": message, "exception.stacktrace": stack}
    )
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"[:500]))


def start_llm(
    provider: Any, provider_name: str, model: Any, messages: Any, params: Mapping[str, Any]
) -> Any:
    from opentelemetry.util.genai.types import LLMInvocation

    invocation = LLMInvocation(request_model=str(model or ""), provider=provider_name)
    for key, attr in _REQUEST_PARAMS.items():
        value = params.get(key)
        if value is not None:
            setattr(
                invocation,
                attr,
                [value] if attr == "stop_sequences" and isinstance(value, str) else value,
            )
    if capture_enabled() and messages is not None:
        invocation.attributes["gen_ai.input.messages"] = capture(messages)
    handler(provider).start_llm(invocation)
    return invocation


def apply_response(invocation: Any, response: Any) -> None:
    """Response model, id, finish reasons, usage and (when captured) output, from an
    OpenAI-style, DashScope-style or dict response."""
    invocation.response_model_name = field(response, "model") or invocation.response_model_name
    invocation.response_id = (
        field(response, "id") or field(response, "request_id") or invocation.response_id
    )
    choices = field(response, "choices") or field(response, "output", "choices") or []
    reasons = [r for r in (field(c, "finish_reason") for c in choices) if r]
    reasons = reasons or [
        r for r in [field(response, "output", "finish_reason")] if r and r != "null"
    ]
    if reasons:
        invocation.finish_reasons = [str(r) for r in reasons]
    usage = field(response, "usage")
    if usage is not None:
        invocation.input_tokens = field(usage, "prompt_tokens") or field(usage, "input_tokens")
        invocation.output_tokens = field(usage, "completion_tokens") or field(
            usage, "output_tokens"
        )
    if capture_enabled():
        outputs = [field(c, "message") for c in choices] or [field(response, "output", "text")]
        if any(o is not None for o in outputs):
            invocation.attributes["gen_ai.output.messages"] = capture(outputs)


def finish_llm(provider: Any, invocation: Any) -> None:
    handler(provider).stop_llm(invocation)


def fail_llm(
    provider: Any, invocation: Any, exc: BaseException, secrets: Iterable[str] = ()
) -> None:
    from opentelemetry.util.genai.types import Error

    if invocation.span is not None:
        record_error(invocation.span, exc, secrets)
    message = scrub_capped(str(exc), secrets)
    handler(provider).fail_llm(invocation, Error(message=message, type=type(exc)))


class StreamState:
    """Accumulates a streamed response; ends the LLM span once, however the stream ends."""

    def __init__(self, provider: Any, invocation: Any, secrets: Iterable[str] = ()) -> None:
        self.provider = provider
        self.invocation = invocation
        self.secrets = tuple(secrets)
        self.done = False
        self.text: list[str] = []
        self.reasons: list[str] = []

    def record(self, chunk: Any) -> None:
        invocation = self.invocation
        invocation.response_model_name = field(chunk, "model") or invocation.response_model_name
        invocation.response_id = (
            field(chunk, "id") or field(chunk, "request_id") or invocation.response_id
        )
        for choice in field(chunk, "choices") or field(chunk, "output", "choices") or []:
            reason = field(choice, "finish_reason")
            if reason and reason != "null":
                self.reasons.append(str(reason))
            content = field(choice, "delta", "content") or field(choice, "message", "content")
            if isinstance(content, str):
                self.text.append(content)
        reason = field(chunk, "output", "finish_reason")  # DashScope's shape
        if reason and reason != "null":
            self.reasons.append(str(reason))
        usage = field(chunk, "usage")
        if usage is not None:
            invocation.input_tokens = field(usage, "prompt_tokens") or field(usage, "input_tokens")
            invocation.output_tokens = field(usage, "completion_tokens") or field(
                usage, "output_tokens"
            )

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        if self.reasons:
            self.invocation.finish_reasons = self.reasons
        if capture_enabled() and self.text:
            self.invocation.attributes["gen_ai.output.messages"] = capture(
                [{"role": "assistant", "content": "".join(self.text)}]
            )
        _reattach(self.invocation)
        finish_llm(self.provider, self.invocation)

    def fail(self, exc: BaseException) -> None:
        if self.done:
            return
        self.done = True
        _reattach(self.invocation)
        fail_llm(self.provider, self.invocation, exc, self.secrets)


def detach(invocation: Any) -> None:
    """A streamed call returns before its span ends: its span must not stay current."""
    from opentelemetry import context

    if invocation.context_token is not None:
        context.detach(invocation.context_token)
        invocation.context_token = None


def _reattach(invocation: Any) -> None:
    # The handler ends a span by detaching the token it attached; give it a fresh one
    # from wherever the stream ends.
    from opentelemetry import context

    if invocation.context_token is None:
        invocation.context_token = context.attach(context.get_current())
