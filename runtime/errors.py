"""Stable machine codes of every error the runtime answers with, and the JSON body.

Every error body carries ``status: "failed"``, a human ``error`` message, an
``error_code`` from this list (the README's error table mirrors it) and ``detail``:
one entry per offending field for INVALID_INPUT, else the message again.
"""

from __future__ import annotations

from typing import Any

import orjson

# 400
INVALID_JSON = "INVALID_JSON"
NOT_AN_OBJECT = "NOT_AN_OBJECT"
# 404 / 405
NOT_FOUND = "NOT_FOUND"
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
# 413
BODY_TOO_LARGE = "BODY_TOO_LARGE"
# 422
INVALID_INPUT = "INVALID_INPUT"
FUNC_TYPE_MISMATCH = "FUNC_TYPE_MISMATCH"
# 500 (the body then has the function's output shape)
PROCESSOR_ERROR = "PROCESSOR_ERROR"
INVALID_OUTPUT = "INVALID_OUTPUT"
INTERNAL_ERROR = "INTERNAL_ERROR"
# 503 (with Retry-After)
OVERLOADED = "OVERLOADED"
NOT_READY = "NOT_READY"
DRAINING = "DRAINING"
# setup() or the processor's constructor failed: the server stops (exit code 3)
SETUP_FAILED = "SETUP_FAILED"
# 504
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
# 499: the client went away; logged, never sent
CLIENT_DISCONNECTED = "CLIENT_DISCONNECTED"


def error_body(code: str, message: str, detail: Any = None) -> bytes:
    # ``detail`` is also where FastAPI-style clients (the SDK server's) look for the reason.
    body = {"status": "failed", "error": message, "error_code": code}
    return orjson.dumps({**body, "detail": message if detail is None else detail})
