"""Reading a request's body within --body-timeout and --max-body, holding it (and what it
will parse into) in the worker's --max-buffered budget (``admission.Admission``)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from runtime import errors
from runtime.execution.function import RequestError
from runtime.serving.admission import Admission, parsed_extra
from runtime.serving.deadlines import BodyDeadlines

__all__ = ["BodyReader", "ClientGone"]


class ClientGone(Exception):
    """The client went away before its body was in."""


class BodyReader:
    def __init__(self, admission: Admission, max_body: int, timeout: float) -> None:
        self.admission = admission
        self.max_body = max_body
        self.timeout = timeout
        self.deadlines = BodyDeadlines(timeout)

    async def read(
        self,
        scope: MutableMapping[str, Any],
        receive: Any,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],  # the calling task: cancelled at --body-timeout
    ) -> bytes:
        """Read within --body-timeout, holding (in the admission's body budget) the bytes
        received so far: a client that announces a large body and stalls holds only what it
        sent, so slow senders cannot starve ready ones. A small body is one chunk, one
        charge. The caller releases the body's bytes once done with it; RequestError (408,
        413, 503) or ClientGone hold nothing."""
        max_body = self.max_body
        admission = self.admission
        held = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                if int(value) > max_body:
                    raise _too_large(max_body)
                break
        deadlines = self.deadlines
        deadlines.start(loop, task)
        try:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientGone
            body = message.get("body", b"")
            if len(body) > max_body:
                raise _too_large(max_body)
            if not admission.hold_body(len(body)):
                raise _over_budget(admission.buffered)
            held = len(body)
            if not message.get("more_body", False):
                return body
            chunks = [body]
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise ClientGone
                chunk = message.get("body", b"")
                if held + len(chunk) > max_body:
                    raise _too_large(max_body)
                if not admission.hold_body(len(chunk)):
                    raise _over_budget(admission.buffered)
                held += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        except asyncio.CancelledError:
            admission.release_body(held)
            if not deadlines.expired(task):
                raise
            raise RequestError(
                408,
                errors.REQUEST_TIMEOUT,
                f"request body not received within {self.timeout:g}s (--body-timeout)",
            ) from None
        except BaseException:
            admission.release_body(held)
            raise
        finally:
            deadlines.stop(task)

    def hold_parsed(self, body: bytes, costs: tuple[int, int, int], floor: int = 0) -> int:
        """Hold in the body budget, besides the body's bytes (held already), what it is
        estimated to take once parsed beyond them (``admission.parsed_extra``); the bytes
        held. RequestError: a 413 when body and parse could never fit the budget (a 503 would
        be retried forever), a 503 when they do not fit now."""
        admission = self.admission
        if not admission.max_buffered:
            return 0
        extra = parsed_extra(body, costs, floor)
        if not extra or admission.hold_body(extra):
            return extra
        # refused on the first estimate: again, without the marks in its strings (slower)
        extra = parsed_extra(body, costs, floor, exact=True)
        if not extra or admission.hold_body(extra):
            return extra
        if len(body) + extra > admission.max_buffered:
            raise RequestError(
                413,
                errors.BODY_TOO_LARGE,
                f"request body would take about {len(body) + extra} bytes once parsed "
                f"(it is mostly tiny JSON values), more than --max-buffered "
                f"({admission.max_buffered} bytes) lets a worker hold",
            )
        raise _over_budget(admission.buffered)


def _over_budget(buffered: int) -> RequestError:
    """The 503 of a body that does not fit the --max-buffered budget now."""
    return RequestError(
        503,
        errors.OVERLOADED,
        f"this worker already holds {buffered} bytes of request bodies and what they parse "
        "into (--max-buffered); retry later",
    )


def _too_large(limit: int) -> RequestError:
    return RequestError(413, errors.BODY_TOO_LARGE, f"request body is larger than {limit} bytes")
