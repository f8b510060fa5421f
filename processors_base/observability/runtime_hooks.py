"""What the runtime (``runtime.tracing``, the SDK alias in ``runtime.compat``) needs of this
package's tracing internals, under public names: the one door through which it reaches them.

For the runtime only, not for user code: nothing here is part of ``processors_base``'s
public API, and any of it may change with the runtime that uses it. User code traces with
what ``processors_base.observability`` exports.
"""

from __future__ import annotations

from processors_base.observability._core import (
    BAGGAGE_KEYS,
    active_provider,
    capture,
    capture_enabled,
    handler,
)
from processors_base.observability._spans import apply_response, field, record_error
from processors_base.observability.processor import (
    SPAN_KEY,
    processor_context,
    processor_span,
    record_output,
    runtime_opens_processor_spans,
)

__all__ = [
    "BAGGAGE_KEYS",
    "SPAN_KEY",
    "active_provider",
    "apply_response",
    "capture",
    "capture_enabled",
    "field",
    "handler",
    "processor_context",
    "processor_span",
    "record_error",
    "record_output",
    "runtime_opens_processor_spans",
]
