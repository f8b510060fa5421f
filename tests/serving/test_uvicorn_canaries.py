"""Canaries for the uvicorn internals runtime.serving.protocol and .sending lean on.

The protocol subclasses uvicorn's httptools protocol: it extends the parser callbacks and
then hands each to uvicorn's own, and gives the cycle uvicorn makes the whole-response
message by its class. pyproject.toml bounds uvicorn to the tested minor; CI also runs
these against uvicorn's newest release, so that a release that moves what we lean on
fails here, in-process and at once, rather than as a slow request or a lost limit.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from runtime.serving.protocol import protocol_class
from runtime.serving.sending import WHOLE_RESPONSE, WholeResponseCycle

BODY = b'{"ok": true}'


class _Transport(asyncio.Transport):
    """A connection that keeps what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    message = await receive()
    assert WHOLE_RESPONSE in scope["extensions"]
    headers = [(b"content-type", b"application/json"), (b"x-seen-body", message["body"])]
    await send({"type": WHOLE_RESPONSE, "status": 200, "headers": headers, "body": BODY})


def _request(path: str = "/api/v1", extra: bytes = b"") -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: 2\r\n\r\n" % (path.encode(), extra)
    return head + b"hi"


async def _serve(*reads: bytes) -> tuple[Any, _Transport]:
    """Our protocol fed ``reads`` on one connection; it and its transport once answered."""
    config = Config(_app, http="httptools", ws="none", lifespan="off", access_log=False)
    config.load()
    state = ServerState()
    cls = protocol_class(max_connections=8, read_timeout=10)
    protocol = cls(
        config=config, server_state=state, app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = _Transport()
    protocol.connection_made(transport)
    for data in reads:
        protocol.data_received(data)
    for _ in range(100):  # the app's tasks, then the write batch's turn
        if not state.tasks and not protocol.pipeline:
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    return protocol, transport


def test_the_callbacks_and_attributes_the_protocol_extends_are_uvicorns() -> None:
    for name in ("on_message_begin", "on_url", "on_header", "on_headers_complete"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
    for name in ("data_received", "send_400_response", "connection_made", "connection_lost"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
    # what WholeResponseCycle.send reads and sets on uvicorn's cycle
    cycle = RequestResponseCycle.__init__.__code__.co_names
    for name in ("transport", "flow", "default_headers", "keep_alive", "message_event"):
        assert name in cycle, name
    for name in ("response_started", "response_complete", "disconnected", "on_response"):
        assert name in cycle, name


async def test_the_cycle_uvicorn_makes_answers_the_whole_response_message() -> None:
    protocol, transport = await _serve(_request())
    assert type(protocol.cycle) is WholeResponseCycle  # the class is ours: the fast path
    answer = bytes(transport.written)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-seen-body: hi\r\n" in answer  # the body reached the app through uvicorn
    assert b"content-length: %d\r\n\r\n" % len(BODY) + BODY in answer
    assert not transport.closed


async def test_pipelined_requests_each_get_the_whole_response() -> None:
    _, transport = await _serve(_request() + _request())
    assert bytes(transport.written).count(b"HTTP/1.1 200 OK\r\n") == 2


async def test_header_limits_run_before_uvicorns_callbacks_and_keep_them() -> None:
    protocol, transport = await _serve(_request(extra=b"Expect: 100-continue\r\n"))
    assert protocol.expect_100_continue  # uvicorn's on_header still ran
    assert (b"expect", b"100-continue") in protocol.headers
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(101))
    protocol, transport = await _serve(_request(extra=many))
    assert bytes(transport.written).startswith(b"HTTP/1.1 431 ")
    assert transport.closed


@pytest.mark.parametrize("path", ["/api/v1", "/x%20y?a=1"])
async def test_uvicorns_scope_is_built_before_ours_is_read(path: str) -> None:
    protocol, _ = await _serve(_request(path))
    assert protocol.scope["method"] == "POST"
    assert protocol.scope["path"] == path.partition("?")[0].replace("%20", " ")
