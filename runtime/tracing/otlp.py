"""OTLP protobuf encoding of span records, written straight to bytes.

The exporter process (``runtime.tracing.export``) receives spans as plain tuples. Rebuilding
SDK spans from them and encoding those with the OpenTelemetry encoder costs about 30 us a
span, on the same cores as the worker; writing the protobuf wire format directly from
the tuples costs a few. The bytes are those of an ``ExportTraceServiceRequest`` as the
SDK's encoder makes it (``tests/tracing/test_span_export.py`` parses both and compares them).

Wire format: every message here is a list of (tag, value) fields; a tag is
``field_number << 3 | wire_type`` (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from struct import Struct
from typing import Any

__all__ = ["RecordEncoder"]

log = logging.getLogger("runtime")

_FIXED64 = Struct("<Q").pack
_DOUBLE = Struct("<d").pack
_FIXED32 = Struct("<I").pack
# Span.flags as the SDK's encoder sets them: "whether the parent is remote" is known
# (0x100) and, when it is, 0x200 (SpanFlags in trace.proto).
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64: two's complement, ten bytes
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (tag < 128)."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _text(tag: int, text: str) -> bytes:
    # a lone surrogate becomes "?": invalid UTF-8 in a string field fails the whole batch
    return _field(tag, text.encode("utf-8", "replace"))


def _any_value(value: Any) -> bytes:
    """An AnyValue message; TypeError for a type OTLP has no value for."""
    if isinstance(value, str):
        return _text(0x0A, value)
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise TypeError(f"{value} is outside OTLP's int64")
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if value is None:
        return b""
    if isinstance(value, bytes):
        return _field(0x3A, value)
    if isinstance(value, Sequence):
        return _field(0x2A, b"".join(_field(0x0A, _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(0x32, _key_values(0x0A, value))
    raise TypeError(f"no OTLP value for {type(value).__name__}")


def _key_values(tag: int, attributes: Mapping[str, Any]) -> bytes:
    """Repeated KeyValue fields; an attribute of a type OTLP cannot carry is left out (the
    SDK's encoder would fail the whole batch for it)."""
    out = []
    for key, value in attributes.items():
        encoded_key = _KEYS.get(key) or _cached(_KEYS, 0x0A, key)
        if type(value) is str:  # the common case: a short text, with one-byte lengths
            text = value.encode("utf-8", "replace")
            size = len(text)
            total = len(encoded_key) + size + 4
            if total < 0x80:
                out.append(
                    bytes((tag, total)) + encoded_key + bytes((0x12, size + 2, 0x0A, size)) + text
                )
                continue
        try:
            encoded = _any_value(value)
        except (TypeError, ValueError, RecursionError) as exc:  # a list that holds itself...
            log.warning("span attribute %r left out of the export: %s", key, exc)
            continue
        out.append(_field(tag, encoded_key + _field(0x12, encoded)))
    return b"".join(out)


_KEYS: dict[str, bytes] = {}  # attribute key -> its field
_NAMES: dict[str, bytes] = {}  # span name -> its field
_CACHED, _CACHED_SIZE = 4096, 256


def _cached(cache: dict[str, bytes], tag: int, text: str) -> bytes:
    """``text``'s field, kept in ``cache`` when short: the same few keys and names recur
    on most spans; long or endless ones (a prompt or a URL made a span name) are encoded
    each time instead."""
    encoded = _text(tag, str(text))
    if len(cache) < _CACHED and len(encoded) <= _CACHED_SIZE:
        cache[text] = encoded
    return encoded


def _span(record: tuple[Any, ...]) -> bytes:
    (
        name,
        trace_id,
        span_id,
        _trace_flags,  # not in Span.flags, as in the SDK's encoder
        trace_state,
        parent_id,
        parent_remote,
        kind,
        start,
        end,
        attributes,
        events,
        links,
        status_code,
        status_description,
        _scope,
    ) = record
    parts = [
        b"\x0a\x10" + trace_id.to_bytes(16, "big"),
        b"\x12\x08" + span_id.to_bytes(8, "big"),
    ]
    if trace_state:
        parts.append(_text(0x1A, ",".join(f"{k}={v}" for k, v in trace_state)))
    if parent_id:
        parts.append(b"\x22\x08" + parent_id.to_bytes(8, "big"))
    if name:
        parts.append(_NAMES.get(name) or _cached(_NAMES, 0x2A, name))
    parts.append(_KINDS[kind] if kind < 5 else b"\x30" + _varint(kind + 1))
    if start:
        parts.append(b"\x39" + _FIXED64(start))
    if end:
        parts.append(b"\x41" + _FIXED64(end))
    if attributes:
        parts.append(_key_values(0x4A, attributes))
    for event_name, event_attributes, timestamp in events:
        event = b"\x09" + _FIXED64(timestamp) if timestamp else b""
        if event_name:
            event += _text(0x12, event_name)
        if event_attributes:
            event += _key_values(0x1A, event_attributes)
        parts.append(_field(0x5A, event))
    for link_trace, link_span, link_attributes in links:
        link = b"\x0a\x10" + link_trace.to_bytes(16, "big")
        link += b"\x12\x08" + link_span.to_bytes(8, "big")
        if link_attributes:
            link += _key_values(0x22, link_attributes)
        link += b"\x35" + _FIXED32(_HAS_IS_REMOTE)
        parts.append(_field(0x6A, link))
    if status_code or status_description:
        status = _text(0x12, status_description) if status_description else b""
        if status_code:
            status += b"\x18" + _varint(status_code)
        parts.append(_field(0x7A, status))
    else:
        parts.append(_UNSET_STATUS)
    parts.append(_REMOTE_PARENT if parent_id and parent_remote else _LOCAL_PARENT)
    return b"".join(parts)


# Span.kind: SpanKind INTERNAL (0) is SPAN_KIND_INTERNAL (1), and so on
_KINDS = [b"\x30" + _varint(kind + 1) for kind in range(5)]
_UNSET_STATUS = _field(0x7A, b"")
# Span.flags, field 16 (fixed32)
_LOCAL_PARENT = b"\x85\x01" + _FIXED32(_HAS_IS_REMOTE)
_REMOTE_PARENT = b"\x85\x01" + _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE)


class RecordEncoder:
    """Encodes batches of span records for one resource (encoded once, here)."""

    def __init__(self, resource: Any) -> None:
        resource_message = _key_values(0x0A, dict(resource.attributes))
        self._resource = _field(0x0A, resource_message)
        schema_url = getattr(resource, "schema_url", "") or ""
        self._schema = _text(0x1A, schema_url) if schema_url else b""
        self._scopes: dict[tuple[str, str | None], bytes] = {}

    def encode(self, records: Iterable[tuple[Any, ...]]) -> bytes:
        """An ExportTraceServiceRequest with every record, grouped by scope in order."""
        by_scope: dict[bytes, list[bytes]] = {}  # encoded scope -> its spans
        for record in records:
            try:
                scope = self._scope(record[-1])
                span = _field(0x12, _span(record))
            except Exception as exc:  # (a negative time, a scope version that is no str)
                log.warning("span %r left out: %s: %s", record[0], type(exc).__name__, exc)
                continue
            by_scope.setdefault(scope, []).append(span)
        scope_spans = b"".join(
            _field(0x12, scope + b"".join(spans)) for scope, spans in by_scope.items()
        )
        resource_spans = self._resource + scope_spans + self._schema
        return _field(0x0A, resource_spans)

    def _scope(self, scope: tuple[str, str | None]) -> bytes:
        encoded = self._scopes.get(scope)
        if encoded is None:
            name, version = scope
            message = (_text(0x0A, name) if name else b"") + (
                _text(0x12, version) if version else b""
            )
            encoded = self._scopes[scope] = _field(0x0A, message)
        return encoded
