"""What every wrapper needs: whether tracing is on, the GenAI telemetry handler, and
capped, redacted capture of content.

Tracing is on when an SDK tracer provider is installed (the runtime installs one with
``--tracing`` / ``ENABLE_TRAJECTORY=true``). Wrappers ask at call time, so a client
traced in ``setup()`` before tracing was on is traced once it is, and a wrapper costs one
``isinstance`` check while it is off.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, TracerProvider

from processors_base.redaction import REDACTED, redact_head, request_secrets

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# Read here, not in runtime.config's table: this instrumentation also runs where no serve
# settings exist (invoke, a trainer's process, a user's script), as OTEL_* variables are.
LIMIT_ENV = "AGENTIC_RL_CAPTURE_MAX_CHARS"

# Ids of request_metadata: baggage of every span of a request, and attributes of each span.
BAGGAGE_KEYS = (
    "agentic_rl.rollout_id",
    "agentic_rl.sample_id",
    "agentic_rl.attempt_id",
    "agentic_rl.job_id",
)

# request_secrets (the current request's api_key) are blanked wherever they appear inside
# captured strings, in any encoding: see processors_base.redaction.

_handlers: dict[int, Any] = {}

# loongsuite announces at import that its optional audio extras are missing (even when
# imported from an exit hook, where the line lands on a bare terminal); only that notice
# is dropped, its other warnings still show.
_AUDIO_NOTICE = "numpy or soundfile not available, PCM16 to WAV conversion will be skipped"


def _not_the_audio_notice(record: logging.LogRecord) -> bool:
    return record.msg != _AUDIO_NOTICE


logging.getLogger("opentelemetry.util.genai._multimodal_upload.pre_uploader").addFilter(
    _not_the_audio_notice
)


def active_provider(explicit: TracerProvider | None = None) -> TracerProvider | None:
    """The tracer provider to record with, or None while tracing is off."""
    provider = explicit if explicit is not None else trace.get_tracer_provider()
    if isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider)):
        return None
    return provider


def handler(provider: TracerProvider) -> Any:
    """The loongsuite GenAI telemetry handler bound to ``provider`` (one per provider). A
    handler the user gave (``handler=``) stands in for the provider and is used as is."""
    if not isinstance(provider, TracerProvider) and callable(getattr(provider, "stop_llm", None)):
        return provider
    found = _handlers.get(id(provider))
    if found is None or found[0] is not provider:
        from opentelemetry.util.genai.extended_handler import ExtendedTelemetryHandler

        found = (provider, ExtendedTelemetryHandler(tracer_provider=provider))
        _handlers[id(provider)] = found
    return found[1]


@functools.lru_cache(maxsize=1)
def capture_enabled() -> bool:
    """Whether message and tool content may be recorded (off unless asked for). Read once,
    as OpenTelemetry reads its environment; ``capture_enabled.cache_clear()`` re-reads it."""
    value = os.environ.get(CAPTURE_ENV, "").strip().lower()
    return value in ("1", "true", "yes", "on", "span_only", "span_and_event", "event_only")


def capture_limit() -> int:
    try:
        return max(64, int(os.environ.get(LIMIT_ENV, "8192")))
    except ValueError:
        return 8192


# Key names whose values are never recorded: any name containing one of these parts, ending
# in "token", or equal to one of the short names (compared without case, "-" and "_").
_SECRET_PARTS = (
    "apikey",
    "authorization",
    "password",
    "passwd",
    "secret",
    "accesskey",
    "credential",
    "cookie",
    "privatekey",
    "sessionid",
    "sessionkey",
    "passphrase",
    "authheader",
    "connstr",
    "connectionstring",
    "accountkey",
    "signature",
)
_SECRET_NAMES = frozenset({"auth", "key", "pwd", "pass", "dsn", "session", "sig"})


def is_secret_key(key: str) -> bool:
    normal = key.lower().replace("-", "").replace("_", "")
    return (
        normal in _SECRET_NAMES
        or normal.endswith(("token", "auth"))  # basic_auth, http_auth, proxy_auth
        or any(part in normal for part in _SECRET_PARTS)
    )


def _header_pair(item: Any) -> bool:
    """A (name, value) pair whose name is a secret's, as in a list of headers."""
    return (
        isinstance(item, (tuple, list))
        and len(item) == 2
        and isinstance(item[0], (str, bytes))
        and is_secret_key(item[0].decode("latin-1") if isinstance(item[0], bytes) else item[0])
    )


class _Full(Exception):
    pass


def capture(value: Any, limit: int | None = None) -> str:
    """JSON text of ``value``, at most ``limit`` characters, with secrets redacted.

    The limit is enforced while writing, so a huge payload is never serialised whole.
    Redaction fails closed: values under secret-looking keys, SecretStr values and the
    request's own secrets become "***"; objects of unknown types become "<TypeName>".
    """
    budget = limit if limit is not None else capture_limit()
    secrets = request_secrets.get()
    parts: list[str] = []
    left = budget

    def emit(text: str) -> None:
        nonlocal left
        if len(text) >= left:
            parts.append(text[:left])
            raise _Full
        parts.append(text)
        left -= len(text)

    def walk(item: Any, depth: int) -> None:
        if depth > 32:
            emit('"<too deep>"')
        elif item is None or isinstance(item, bool):
            emit("true" if item is True else "false" if item is False else "null")
        elif isinstance(item, (int, float)):
            emit(
                json.dumps(item)
                if not isinstance(item, float) or math.isfinite(item)
                else f'"{item}"'
            )
        elif isinstance(item, str):
            # Cut before it is scrubbed and escaped: a huge string is never processed whole
            # (redact_head scrubs a margin past the cut: no secret is cut in half and kept).
            cut = len(item) > left
            emit(json.dumps(redact_head(item, left, secrets), ensure_ascii=False))
            if cut:  # even where blanking made what is kept short: marked as cut
                raise _Full
        elif type(item).__name__ in ("SecretStr", "SecretBytes"):
            emit(f'"{REDACTED}"')
        elif isinstance(item, Mapping):
            emit("{")
            for index, (key, inner) in enumerate(item.items()):
                name = str(key)  # scrubbed and cut as a string value is (a URL, the key)
                cut = len(name) > left
                shown = json.dumps(redact_head(name, left, secrets), ensure_ascii=False)
                emit(("," if index else "") + shown + ":")
                if cut:
                    raise _Full
                if is_secret_key(name):
                    emit(f'"{REDACTED}"')
                else:
                    walk(inner, depth + 1)
            emit("}")
        elif _header_pair(item):  # ("Authorization", "Bearer ...") in a list of headers
            name = item[0].decode("latin-1") if isinstance(item[0], bytes) else item[0]
            emit("[" + json.dumps(name, ensure_ascii=False) + f',"{REDACTED}"]')
        elif isinstance(item, (list, tuple, set, frozenset)):
            emit("[")
            for index, inner in enumerate(item):
                if index:
                    emit(",")
                walk(inner, depth + 1)
            emit("]")
        elif isinstance(item, bytes):
            emit(f'"<{len(item)} bytes>"')
        elif hasattr(item, "model_dump"):  # pydantic models, openai and SDK objects
            try:
                dumped = item.model_dump()
            except Exception:
                dumped = f"<{type(item).__name__}>"
            walk(dumped, depth + 1)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            walk({f.name: getattr(item, f.name) for f in dataclasses.fields(item)}, depth + 1)
        else:
            emit(json.dumps(f"<{type(item).__name__}>"))

    try:
        walk(value, 0)
    except _Full:
        parts.append("...[truncated]")
    return "".join(parts)
