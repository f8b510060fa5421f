"""HTTP/1.1 on uvicorn's httptools protocol, bounded against hostile or broken clients.

uvicorn (0.54) has settings for an idle keep-alive timeout (``timeout_keep_alive``, used
as is) and for h11's incomplete-event size, but none for the httptools parser it runs by
default: no limit on the number or total size of request headers (one connection sending
millions of tiny headers grew a worker to gigabytes), no deadline for reading them (a
connection that never finishes its headers is held forever), and no cap on open
connections (``limit_concurrency`` only answers 503 once a request's headers are in, and
keeps the connection). Its own error answers are text/plain. This subclass adds what is
missing and answers every error as the runtime's JSON error body:

- more than ``max_headers`` headers, or more than ``max_header_bytes`` of request line and
  headers: 431, the connection closed as soon as the limit is passed (the parser never
  holds more than the limit plus one read);
- headers not complete within ``read_timeout`` seconds of the request's first byte (or of
  the connection, for one that sends nothing): 408 (a connection that sent nothing is
  closed silently, as after the keep-alive timeout);
- more than ``max_connections`` connections open in this worker: the new one is answered
  503 with Retry-After and closed at once, before anything is read; except that
  ``HEALTH_RESERVE`` more may ask ``GET /health`` (anything else on them is answered 503),
  so that liveness stays answerable under a connection flood;
- a request that is not valid HTTP/1.1 (a bad Content-Length, a smuggling attempt): 400.

An idle keep-alive connection is closed after ``timeout_keep_alive`` seconds, by uvicorn.
Answers leave through ``runtime.serving.sending``: each connection's transport is wrapped
so that its writes go out with the event loop's batch, and /api/v1 answers are one message.

Every rejection is counted (``on_reject``: /metrics by status and code) and logged, at most
one WARNING line per ``LOG_EVERY`` seconds; a request the app was serving when its
connection was rejected is marked in its scope (``REJECTED``), so that the app records the
status the client got. The body has its own deadline and budget, enforced by the app
(``runtime.serving.app``). This
relies on uvicorn internals (the parser callbacks, each extended and then handed to
uvicorn's own; ``cycle``, ``connections``, ``pipeline``), which is why ``pyproject.toml``
bounds uvicorn to the versions tested and tests/serving/test_uvicorn_canaries.py fails
when a release changes them.
"""

from __future__ import annotations

import asyncio
import http
import logging
import resource
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from runtime import errors
from runtime.serving.sending import WHOLE_RESPONSE, BatchedTransport, WholeResponseCycle, WriteBatch

__all__ = ["REJECTED", "GuardedHttpToolsProtocol", "protocol_class", "raw_error"]

log = logging.getLogger("runtime")

REJECTED = "runtime.rejected"  # scope key: (status, code) the protocol answered instead
_EXTENSIONS: dict[str, dict[object, object]] = {WHOLE_RESPONSE: {}}
HEALTH_RESERVE = 8  # connections past the cap that may still ask GET /health
LOG_EVERY = 10.0  # seconds between two WARNING lines about rejections


class _RejectionLog:
    """One WARNING line for the first rejection, then at most one per LOG_EVERY seconds
    with the counts since: a flood of bad clients cannot flood the log."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[int, str]] = Counter()
        self._next = 0.0

    def note(self, status: int, code: str) -> None:
        self._counts[(status, code)] += 1
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + LOG_EVERY
        parts = ", ".join(f"{s} {c} x{n}" for (s, c), n in sorted(self._counts.items()))
        self._counts.clear()
        log.warning(
            "refused by the HTTP protocol layer (at most one line per %gs): %s", LOG_EVERY, parts
        )


_rejections = _RejectionLog()

# uvicorn's own per-request warnings for what this layer counts and logs itself (a bad
# request), or serves as a plain request (an upgrade): one line per request would let a
# client flood the log.
_UVICORN_NOISE = (
    "Invalid HTTP request received.",
    "Unsupported upgrade request.",
    "No supported WebSocket library detected.",
)


def _not_noise(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(_UVICORN_NOISE))


logging.getLogger("uvicorn.error").addFilter(_not_noise)


def raw_error(status: int, code: str, message: str, retry_after: bool = False) -> bytes:
    """A complete HTTP/1.1 error response with the JSON error body; the connection closes."""
    body = errors.error_body(code, message)
    head = [
        b"HTTP/1.1 %d %s" % (status, http.HTTPStatus(status).phrase.encode()),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if retry_after:
        head.append(b"retry-after: 1")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class _Rejected(Exception):
    """Raised in a parser callback to stop parsing a request we will not take."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    max_connections = 1024
    read_timeout = 10.0
    max_headers = 100
    max_header_bytes = 64 * 1024
    on_reject: Callable[[int, str], None] | None = None  # counts a rejection (/metrics)
    write_batch: WriteBatch | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._in_headers = False  # between a request's first byte and its end of headers
        self._header_count = 0
        self._header_bytes = 0  # request line and headers, as the parser reports them
        self._raw_bytes = 0  # whole reads that arrived while still in the headers
        self._rejection: bytes | None = None
        self._rejection_kind = (400, errors.BAD_REQUEST)  # (status, code) of _rejection
        self._health_only = False  # a connection past the cap: GET /health only

    # --- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            if len(self.connections) >= self.max_connections + HEALTH_RESERVE:
                self.transport = transport
                transport.write(self._over_cap())
                transport.close()
                self._count(503, errors.OVERLOADED)
                return
            self._health_only = True  # answered only for GET /health (liveness)
        batch = type(self).write_batch
        if batch is None or batch.loop is not self.loop:  # one per server (and loop)
            batch = type(self).write_batch = WriteBatch(self.loop)
        super().connection_made(BatchedTransport(transport, batch))  # type: ignore[arg-type]
        self._arm_read_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        super().connection_lost(exc)

    def eof_received(self) -> None:
        # The client sends no more (it may still read, as after `shutdown(SHUT_WR)`) and the
        # transport closes itself on return: what is held for it leaves first.
        if isinstance(self.transport, BatchedTransport):
            self.transport.send_held()

    def data_received(self, data: bytes) -> None:
        whole_read_in_headers = self._in_headers
        super().data_received(data)
        if self._rejection is not None or self.transport.is_closing():
            return
        if self._in_headers:
            if self._read_timer is None:  # headers begun in this read and not complete
                self._arm_read_timer()
            if whole_read_in_headers:
                # A value still being received is held by the parser: bound it here too.
                self._raw_bytes += len(data)
                if self._raw_bytes > self.max_header_bytes:
                    self._reject_headers()
        elif self._read_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_read_timer()  # bytes between requests: bounded like a request's headers

    def send_400_response(self, msg: str) -> None:
        if self._rejection is not None:
            payload = self._rejection
            status, code = self._rejection_kind
        else:
            message = "not a valid HTTP/1.1 request (request line, headers or body framing)"
            payload = raw_error(400, errors.BAD_REQUEST, message)
            status, code = 400, errors.BAD_REQUEST
        self._cancel_read_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # the app is serving this request (its body, or it is all in and garbage
            # follows): what the client gets is this answer, so that is what it records
            # a key of our own: ASGI lets a server add them, uvicorn's HTTPScope is closed
            cast("dict[str, Any]", cycle.scope)[REJECTED] = (status, code)
        self.transport.write(payload)
        self.transport.close()
        self._count(status, code)

    def _count(self, status: int, code: str) -> None:
        _rejections.note(status, code)
        if self.on_reject is not None:
            self.on_reject(status, code)

    def _over_cap(self) -> bytes:
        message = f"this worker has {self.max_connections} connections open; retry later"
        return raw_error(503, errors.OVERLOADED, message, retry_after=True)

    # --- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = _EXTENSIONS  # what runtime.serving.sending adds to uvicorn's
        self._in_headers = True
        self._header_count = 0
        self._header_bytes = 0
        self._raw_bytes = 0
        # The headers' deadline is armed at the end of this read if they are not complete
        # by then (data_received): most requests arrive whole in one read, and need none.

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > self.max_header_bytes:
            self._reject_headers(raise_=True)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._header_count > self.max_headers or self._header_bytes > self.max_header_bytes:
            self._reject_headers(raise_=True)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_read_timer()
        if self._health_only and self.url.partition(b"?")[0] != b"/health":
            self._rejection = self._over_cap()
            self._rejection_kind = (503, errors.OVERLOADED)
            raise _Rejected
        if self.parser.should_upgrade() and self._has_body():
            # The parser hands what follows an Upgrade request's headers to the protocol
            # asked for (h2c, as `curl --http2` asks), which is not spoken here: the body
            # would be dropped and the request read as empty.
            message = (
                "an Upgrade request (HTTP/2 over cleartext, WebSocket) cannot carry a body "
                "here: this server speaks HTTP/1.1; send it without Upgrade (curl: --http1.1)"
            )
            self._rejection = raw_error(400, errors.BAD_REQUEST, message)
            self._rejection_kind = (400, errors.BAD_REQUEST)
            raise _Rejected
        super().on_headers_complete()
        cycle = self.cycle
        if type(cycle) is RequestResponseCycle:  # the one uvicorn just made (not an upgrade)
            # ours adds the whole-response message; its task has not run yet
            cycle.__class__ = WholeResponseCycle

    def _has_body(self) -> bool:
        for name, value in self.headers:
            if name == b"transfer-encoding":
                return True
            if name == b"content-length" and value.strip() != b"0":
                return True
        return False

    # --- limits ----------------------------------------------------------------------------

    def _reject_headers(self, raise_: bool = False) -> None:
        message = (
            f"request headers exceed {self.max_headers} headers or {self.max_header_bytes} bytes"
        )
        self._rejection = raw_error(431, errors.HEADERS_TOO_LARGE, message)
        self._rejection_kind = (431, errors.HEADERS_TOO_LARGE)
        if raise_:
            raise _Rejected  # the parser turns it into an error: send_400_response sends ours
        self.send_400_response(message)

    def _arm_read_timer(self) -> None:
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's headers behind one still being served: an answer now
            # would come before that one's; look again later.
            self._arm_read_timer()
        elif self._in_headers:
            message = f"request headers not received within {self.read_timeout:g}s"
            self._rejection = raw_error(408, errors.REQUEST_TIMEOUT, message)
            self._rejection_kind = (408, errors.REQUEST_TIMEOUT)
            self.send_400_response(message)
        else:
            self.transport.close()  # nothing asked: close quietly, as keep-alive does


KEEP_ALIVE_SECONDS = 5  # uvicorn's timeout_keep_alive: an idle connection is closed after it
_FD_RESERVE = 64  # descriptors kept for logs, isolation pipes, outgoing calls of user code


def connection_cap(requested: int) -> int:
    """``requested``, kept below the open-files limit so that a connection flood can never
    take the last descriptors (and /health with them)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    reserve = min(_FD_RESERVE, soft // 4)
    if soft == resource.RLIM_INFINITY or requested <= soft - reserve:
        return requested
    cap = max(1, soft - reserve)
    log.warning(
        "--max-connections %d lowered to %d: the open-files limit (ulimit -n) is %d",
        requested,
        cap,
        soft,
    )
    return cap


def protocol_class(
    *,
    max_connections: int,
    read_timeout: float,
    on_reject: Callable[[int, str], None] | None = None,
) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for one server's settings (uvicorn instantiates it per connection)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "max_connections": max_connections,
            "read_timeout": read_timeout,
            "on_reject": staticmethod(on_reject) if on_reject is not None else None,
        },
    )
