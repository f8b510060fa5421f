"""Stable machine codes of every error the runtime answers with, and the JSON body.

Every error body carries ``status: "failed"``, a human ``error`` message, an
``error_code`` from this list (docs/serving.md's error table is generated from it),
``detail`` (one entry per offending field for INVALID_INPUT, else the message again: where
FastAPI-style clients look) and ``message`` (the message again: where the SDK's clients look). A 500
or 504 body also has the function's output shape (see ``Function.failure``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

# 400
INVALID_JSON = "INVALID_JSON"
NOT_AN_OBJECT = "NOT_AN_OBJECT"
BAD_REQUEST = (
    "BAD_REQUEST"  # not valid HTTP/1.1 (answered by the protocol, runtime.serving.protocol)
)
# 404 / 405
NOT_FOUND = "NOT_FOUND"
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
# 408: the client did not send its headers or body within --body-timeout
REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
# 413
BODY_TOO_LARGE = "BODY_TOO_LARGE"
# 422
INVALID_INPUT = "INVALID_INPUT"
FUNC_TYPE_MISMATCH = "FUNC_TYPE_MISMATCH"
# 431
HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
# 500 (the body then has the function's output shape)
PROCESSOR_ERROR = "PROCESSOR_ERROR"
INVALID_OUTPUT = "INVALID_OUTPUT"
INTERNAL_ERROR = "INTERNAL_ERROR"
# 503 (with Retry-After)
OVERLOADED = "OVERLOADED"
NOT_READY = "NOT_READY"
DRAINING = "DRAINING"
UNHEALTHY = "UNHEALTHY"  # set up, but every --threads thread is stuck: /health says why
# setup() or the processor's constructor failed: the server stops (exit code 3)
SETUP_FAILED = "SETUP_FAILED"
# 504
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
# 499: the client went away; logged, never sent
CLIENT_DISCONNECTED = "CLIENT_DISCONNECTED"


def safe_text(text: str) -> str:
    """``text`` as valid UTF-8: a lone surrogate (from bytes decoded with surrogateescape,
    say) becomes a visible ``\\udcff`` escape instead of breaking the JSON encoder."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


MAX_MESSAGE = 8 * 1024  # characters of a message in a body (it is there three times)


def cap(
    message: str, limit: int = MAX_MESSAGE, head: Callable[[str, int], str] | None = None
) -> str:
    """``message`` in at most ``limit`` characters, a longer one cut and marked as cut (a
    huge exception message would otherwise make a body three times its size). ``head(text,
    n)``: what is kept of a longer one, at most ``n`` characters from its start; one that
    scrubs (``redaction.redact_head``) scrubs no more than it keeps."""
    if len(message) <= limit:
        return message
    kept = limit - len(f"... [{len(message)} characters cut]")  # the mark fits in the limit
    start = message[:kept] if head is None else head(message, kept)
    return f"{start}... [{len(message) - kept} characters cut]"


def describe(exc: BaseException) -> str:
    """``Type: message`` of a user exception, even when its ``__str__`` raises or returns a
    non-string (that is still the user's failure, never the runtime's)."""
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}"


def fields(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    """The error fields every error body carries."""
    message = safe_text(cap(message))
    return {
        "status": "failed",
        "error": message,
        "error_code": code,
        "detail": message if detail is None else detail,
        "message": message,
    }


def error_body(code: str, message: str, detail: Any = None) -> bytes:
    return orjson.dumps(fields(code, message, detail))
