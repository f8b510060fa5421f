"""The ASGI app that serves one function.

``POST /api/v1`` is the hot path and is handled here directly on raw ASGI:
admission -> body -> parse/validate -> slot -> process -> serialise -> response.
Everything else (``/health``, ``/metrics``, 404 and 405 answers) goes through a small
Starlette app,
where a few microseconds of routing do not matter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any

import anyio
import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processors_base.observability.processor import record_output
from runtime import errors
from runtime.admission import Admission
from runtime.config import Settings
from runtime.function import Function, ProcessorFailure, RequestError
from runtime.logs import RequestLog, bind_secrets
from runtime.metrics import CONTENT_TYPE_LATEST, Metrics
from runtime.tracing import Tracing

__all__ = ["FunctionApp"]

log = logging.getLogger("runtime")

STARTING, READY, DRAINING = "starting", "healthy", "draining"

_JSON = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")
_RETRY_AFTER = (b"retry-after", b"1")


class _ClientGone(Exception):
    pass


class FunctionApp:
    def __init__(
        self, function: Function, settings: Settings, tracing: Tracing | None = None
    ) -> None:
        self.function = function
        self.settings = settings
        self.tracing = tracing
        self.admission = Admission(settings.concurrency, settings.queue)
        self.state = STARTING
        self.on_fatal: Callable[[], None] | None = None  # set by the server: stop, exit non-zero
        self._request_log = RequestLog(function.func_type.value, settings)
        self._timeout = settings.timeout
        self._max_body = settings.max_body
        self._setup_task: asyncio.Task[None] | None = None
        self._gauge_task: asyncio.Task[None] | None = None
        self._setup_ok = False
        self._health_fields = {
            "func_type": function.func_type.value,
            "processor": function.target.name,
            "parser": function.input_model.__name__,
        }
        self.metrics = Metrics(
            function.func_type.value,
            lambda: (self.admission.in_flight, self.admission.queued, function.offload.stuck),
        )
        self._routes = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/api/v1", self._method_not_allowed, methods=["POST"]),
                *_trainer_routes(self),
            ],
            exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope["path"] == "/api/v1" and scope["method"] == "POST":
                await self._invoke(scope, receive, send)
            else:
                await self._routes(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    # --- lifecycle -------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Stop taking requests: /health says "draining", /api/v1 answers 503."""
        self.state = DRAINING

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                anyio.to_thread.current_default_thread_limiter().total_tokens = (
                    self.settings.threads
                )
                # Setup runs in the background so that /health answers "starting" meanwhile.
                loop = asyncio.get_running_loop()
                self._setup_task = loop.create_task(self._setup())
                self._gauge_task = loop.create_task(self._refresh_gauges())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.state = DRAINING
                if self._gauge_task is not None:
                    self._gauge_task.cancel()
                if self._setup_task is not None and not self._setup_task.done():
                    self._setup_task.cancel()
                try:  # shutdown() only after a setup() that succeeded; pools always close
                    await self.function.shutdown(run_hook=self._setup_ok)
                except Exception as exc:
                    log.error(
                        "%s.shutdown() failed: %s: %s",
                        self.function.target.name,
                        type(exc).__name__,
                        exc,
                    )
                if self.tracing is not None:  # export what is left, within a bound
                    with anyio.move_on_after(10):
                        await anyio.to_thread.run_sync(
                            self.tracing.shutdown, abandon_on_cancel=True
                        )
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _refresh_gauges(self) -> None:
        # Keeps this worker's gauges current for a scrape answered by another worker.
        while True:
            await asyncio.sleep(1.0)
            self.metrics.refresh()

    async def _setup(self) -> None:
        try:
            await self.function.setup()
        except ProcessorFailure as exc:
            log.error("%s", exc)
            if self.on_fatal is not None:
                self.on_fatal()
            return
        self._setup_ok = True
        if self.state == STARTING:
            self.state = READY
            log.info(
                "ready: %s serving %s", self.function.target.name, self.function.func_type.value
            )

    # --- POST /api/v1 ----------------------------------------------------------------

    async def _invoke(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = perf_counter()
        if self.state != READY:
            code, message = (
                (errors.NOT_READY, "the function is starting: setup() has not finished")
                if self.state == STARTING
                else (errors.DRAINING, "the function is shutting down")
            )
            await _send(send, 503, errors.error_body(code, message), _RETRY_AFTER)
            self._finish(scope, started, 503, code, message, None)
            return
        admission = self.admission
        if not admission.try_admit():
            message = "all processing slots and the queue are taken; retry later"
            await _send(send, 503, errors.error_body(errors.OVERLOADED, message), _RETRY_AFTER)
            self._finish(scope, started, 503, errors.OVERLOADED, message, None)
            return

        function = self.function
        input_data = None
        interrupt = _Interrupt(self._timeout)
        status, code, message = 200, "", ""
        error: BaseException | None = None  # user code's exception: its traceback is logged
        try:
            try:
                input_data = function.parse(await self._read_body(scope, receive))
                bind_secrets(input_data)  # blanked from this request's logs, bodies and spans
                interrupt.watch(receive)  # only now may another task wait on receive()
                await admission.acquire_slot()
                try:
                    if self.tracing is None:
                        output = await function.process(input_data)
                    else:
                        output = await self._traced_process(scope, input_data)
                finally:
                    admission.release_slot()
                interrupt.close()
            except asyncio.CancelledError:
                if not interrupt.reason:
                    raise  # the server itself is stopping
                interrupt.absorb()
            if not interrupt.reason:
                await _send(send, 200, output)
            elif interrupt.reason == "disconnect":
                status, code = 499, errors.CLIENT_DISCONNECTED
                message = "client disconnected; processing was cancelled"
            else:
                status, code = 504, errors.DEADLINE_EXCEEDED
                message = f"the request did not finish within its {self._timeout:g}s deadline"
                await _send(send, 504, function.failure(code, message))
        except RequestError as exc:
            status, code, message = exc.status, exc.code, str(exc)
            await _send(send, exc.status, exc.body, _CLOSE if exc.status == 413 else None)
        except ProcessorFailure as exc:
            status, code, message = 500, exc.code, str(exc)
            error = exc.__cause__ if code == errors.PROCESSOR_ERROR else None
            await _send(send, 500, function.failure(code, message))
        except _ClientGone:
            status, code = 499, errors.CLIENT_DISCONNECTED
            message = "client disconnected while sending"
        except Exception as exc:  # a bug of ours: still a JSON answer, never a traceback
            status, code, message = 500, errors.INTERNAL_ERROR, "internal error of the runtime"
            log.exception("internal error while serving a request")
            await _send(send, 500, function.failure(code, f"{message}: {type(exc).__name__}"))
        finally:
            admission.leave()
            interrupt.close()
            self._finish(scope, started, status, code, message, input_data, error)
        if self.tracing is not None and self.tracing.flush_each_request:
            # after the response: a short-lived instance loses no span, the client waits for none
            await anyio.to_thread.run_sync(self.tracing.flush)

    async def _traced_process(self, scope: dict[str, Any], input_data: Any) -> bytes:
        assert self.tracing is not None
        with self.tracing.request(scope, input_data) as span:
            result = await self.function.call(input_data)
            record_output(span, result)
            return self.function.serialise(result)

    def _finish(
        self,
        scope: dict[str, Any],
        started: float,
        status: int,
        code: str,
        message: str,
        input_data: Any,
        error: BaseException | None = None,
    ) -> None:
        elapsed = perf_counter() - started
        self.metrics.observe(status, elapsed)
        if status != 200:
            self._request_log.failure(scope, status, elapsed, code, message, input_data, error)
        elif self._request_log.wants(elapsed):
            self._request_log.success(scope, elapsed, input_data)

    async def _read_body(self, scope: dict[str, Any], receive: Any) -> bytes:
        max_body = self._max_body
        for name, value in scope["headers"]:
            if name == b"content-length":
                if int(value) > max_body:
                    raise _too_large(max_body)
                break
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientGone
        body = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > max_body:
                raise _too_large(max_body)
            return body
        chunks = [body]
        size = len(body)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body:
                raise _too_large(max_body)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # --- the trainer protocols (runtime.trainers) -----------------------------------

    def admit(self, count: int = 1) -> tuple[str, str] | None:
        """Admit ``count`` requests, all or none: None, or the (code, message) of the 503."""
        if self.state != READY:
            if self.state == STARTING:
                return errors.NOT_READY, "the function is starting: setup() has not finished"
            return errors.DRAINING, "the function is shutting down"
        for admitted in range(count):
            if not self.admission.try_admit():
                for _ in range(admitted):
                    self.admission.leave()
                return errors.OVERLOADED, "all processing slots and the queue are taken"
        return None

    async def run_admitted(self, scope: dict[str, Any], input_data: Any) -> Any:
        """Run one admitted input in a slot, traced like /api/v1; what process() returned.

        The caller bounds it with its deadline; cancelling it frees the slot (and, with
        --isolation process, kills the child running it).
        """
        await self.admission.acquire_slot()
        try:
            if self.tracing is None:
                return await self.function.call(input_data)
            with self.tracing.request(scope, input_data) as span:
                result = await self.function.call(input_data)
                record_output(span, result)
                return result
        finally:
            self.admission.release_slot()

    # --- everything else -------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        body = orjson.dumps({"status": self.state, **self._health_fields})
        return Response(body, 200 if self.state == READY else 503, media_type="application/json")

    async def _metrics(self, request: Request) -> Response:
        body = await anyio.to_thread.run_sync(
            self.metrics.exposition
        )  # reads files when multiprocess
        return Response(body, 200, media_type=CONTENT_TYPE_LATEST)

    async def _method_not_allowed(self, request: Request) -> Response:
        raise HTTPException(405, headers={"Allow": "POST"})


class _Interrupt:
    """Cancels a request's task at its deadline, or when its client goes away.

    Cheaper than a cancel scope and a watcher task per request: a timer for the
    deadline, and a second one that starts watching for a disconnect only once the
    request has run for a while (most requests are answered long before).
    """

    __slots__ = ("_deadline", "_loop", "_task", "_watch_timer", "_watcher", "reason")
    WATCH_AFTER = 0.5  # seconds; a disconnect is noticed within this much

    def __init__(self, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.reason = ""
        self._deadline = self._loop.call_later(timeout, self._fire, "deadline")
        self._watch_timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[None] | None = None

    def watch(self, receive: Any) -> None:
        self._watch_timer = self._loop.call_later(self.WATCH_AFTER, self._start_watcher, receive)

    def _start_watcher(self, receive: Any) -> None:
        self._watcher = self._loop.create_task(self._watch(receive))

    async def _watch(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._fire("disconnect")

    def _fire(self, reason: str) -> None:
        if not self.reason and self._task is not None:
            self.reason = reason
            self._task.cancel()

    def absorb(self) -> None:
        """The cancellation was ours: let the task go on to answer."""
        uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()

    def close(self) -> None:
        self._deadline.cancel()
        if self._watch_timer is not None:
            self._watch_timer.cancel()
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()


async def _send(
    send: Any, status: int, body: bytes, extra: tuple[bytes, bytes] | None = None
) -> None:
    headers = [_JSON, (b"content-length", b"%d" % len(body))]
    if extra is not None:
        headers.append(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _trainer_routes(app: FunctionApp) -> list[Route]:
    from runtime.trainers import TrainerRoutes  # imports this module

    return TrainerRoutes(app).routes


def _too_large(limit: int) -> RequestError:
    return RequestError(413, errors.BODY_TOO_LARGE, f"request body is larger than {limit} bytes")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        code, message = errors.NOT_FOUND, f"no such endpoint: {request.url.path}"
    elif exc.status_code == 405:
        code, message = (
            errors.METHOD_NOT_ALLOWED,
            f"{request.method} is not allowed on {request.url.path}",
        )
    else:
        code, message = f"HTTP_{exc.status_code}", str(exc.detail)
    return Response(
        errors.error_body(code, message),
        exc.status_code,
        headers=exc.headers,
        media_type="application/json",
    )


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    body = errors.error_body(errors.INTERNAL_ERROR, "internal error of the runtime")
    return Response(body, 500, media_type="application/json")
