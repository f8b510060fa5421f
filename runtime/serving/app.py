"""The ASGI app that serves one function.

``POST /api/v1`` is the hot path and is handled here directly on raw ASGI:
admission -> body -> parse/validate -> slot -> process -> serialise -> response.
Everything else (``/health``, ``/metrics``, 404 and 405 answers) goes through a small
Starlette app,
where a few microseconds of routing do not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from processors_base.models import TaskStatus
from processors_base.observability.processor import record_output
from processors_base.redaction import in_flight
from runtime import errors
from runtime.compat.alias.parsers import parser_for
from runtime.config import Settings
from runtime.execution.function import Function, ProcessorFailure, RequestError
from runtime.logs import RequestLog, bind_request, bind_secrets, unbind_request
from runtime.serving.admission import PARSE_COSTS, PARSED_FLOOR, Admission, parsed_extra, scan_above
from runtime.serving.metrics import CONTENT_TYPE_LATEST, OTHER, UNKNOWN_PATH, Metrics
from runtime.serving.protocol import REJECTED
from runtime.serving.sending import WHOLE_RESPONSE, split_whole_responses
from runtime.tracing.spans import Tracing

__all__ = ["FunctionApp"]

log = logging.getLogger("runtime")

STARTING, READY, DRAINING = "starting", "healthy", "draining"
UNHEALTHY = "unhealthy"
SHUTDOWN_HOOK_LIMIT = 10.0  # seconds for the user's shutdown() at stop

_JSON = (b"content-type", b"application/json")
_JSON_ONLY = (_JSON,)
_NONE: dict[str, Any] = {}
_CLOSE = (b"connection", b"close")
_RETRY_AFTER = (b"retry-after", b"1")
_API_PATHS = ("/api/v1", "/api/v1/")
_STARTED = "rl_function.started"  # scope key: when a request not on /api/v1 came in


class _ClientGone(Exception):
    pass


class FunctionApp:
    def __init__(
        self, function: Function, settings: Settings, tracing: Tracing | None = None
    ) -> None:
        self.function = function
        self.settings = settings
        self.tracing = tracing
        self.admission = Admission(settings.concurrency, settings.queue, settings.max_buffered)
        self.state = STARTING
        self.on_fatal: Callable[[], None] | None = None  # set by the server: stop, exit non-zero
        # set by the server: stop, exit EXIT_UNHEALTHY so that the supervisor replaces us
        self.on_unhealthy: Callable[[], None] | None = None
        # set by the server of a supervised worker: tell the supervisor at once
        self.on_ready: Callable[[], None] | None = None
        self.stuck_tasks = 0  # async requests that ignored their cancellation and run on
        self._live: set[_Interrupt] = set()  # requests being served
        self.request_log = RequestLog(function.func_type.value, settings)
        self._timeout = settings.timeout
        self._max_body = settings.max_body
        # what a parsed /api/v1 body costs; one of up to _scan_above bytes is not scanned
        group = function.func_type.value == "group_reward"
        self._parse_costs = PARSE_COSTS["group" if group else "api"]
        self._scan_above = scan_above(self._parse_costs, PARSED_FLOOR)
        self._body_timeout = settings.body_timeout
        self._body_deadlines = _BodyDeadlines(settings.body_timeout)
        self._first_looks = _FirstLooks()
        # The serving loop, known from the lifespan on: on Python 3.11 each argument-less
        # get_running_loop() or current_task() is a getpid() system call, several a request.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._setup_task: asyncio.Task[None] | None = None
        self._gauge_task: asyncio.Task[None] | None = None
        self._setup_ok = False
        self._health_fields = {
            "func_type": function.func_type.value,
            "processor": function.target.name,
            "parser": parser_for(function.func_type).__name__,  # the SDK's names
        }
        self.metrics = Metrics(
            function.func_type.value,
            lambda: (self.admission.in_flight, self.admission.queued, self.stuck),
        )
        function.sub_reward_errors.on_failure = self.metrics.sub_reward_failed
        self._routes = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/api/v1", self._method_not_allowed, methods=["POST"]),
                *_trainer_routes(self),
            ],
            exception_handlers={HTTPException: self._http_error, Exception: _internal_error},
        )
        # A redirect would be built from the request's Host header (an open redirect).
        self._routes.router.redirect_slashes = False
        # the path label of an answer no route served: a route's path, else UNKNOWN_PATH
        self._route_paths = {r.path: r.path for r in self._routes.routes if isinstance(r, Route)}
        self._route_paths["/api/v1/"] = "/api/v1"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if (path == "/api/v1" or path == "/api/v1/") and scope["method"] == "POST":
                if WHOLE_RESPONSE not in scope.get("extensions", _NONE):  # not our protocol
                    send = split_whole_responses(send)
                await self._invoke(scope, receive, send)
            else:
                scope[_STARTED] = perf_counter()  # for the line of a 404 or 405
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
                # anyio's default threads are left to runtime internals (/metrics, tracing):
                # user code has its own (execution.offload.UserThreads) and never holds them.
                # Setup runs in the background so that /health answers "starting" meanwhile.
                self.loop = loop = asyncio.get_running_loop()
                self._setup_task = loop.create_task(self._setup())
                self._gauge_task = loop.create_task(self._refresh_gauges())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.state = DRAINING
                # uvicorn cancelled what ran past --grace, once; a task that ignored it is
                # answered 503 now and cancelled until it ends, as at a deadline
                for interrupt in list(self._live):
                    interrupt.fire("shutdown")
                if self._gauge_task is not None:
                    self._gauge_task.cancel()
                if self._setup_task is not None and not self._setup_task.done():
                    self._setup_task.cancel()
                try:  # shutdown() only after a setup() that succeeded; pools always close
                    with anyio.move_on_after(SHUTDOWN_HOOK_LIMIT) as bound:
                        await self.function.shutdown(run_hook=self._setup_ok)
                    if bound.cancelled_caught:
                        log.error(
                            "%s.shutdown() did not finish within %gs; stopping without it",
                            self.function.target.name,
                            SHUTDOWN_HOOK_LIMIT,
                        )
                except Exception as exc:
                    log.error(
                        "%s.shutdown() failed: %s: %s",
                        self.function.target.name,
                        type(exc).__name__,
                        exc,
                    )
                self.function.sub_reward_errors.flush()  # failures not logged one by one
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
            if self.state == READY:
                self.function.offload.check()  # a pool that broke while idle is rebuilt now
            reason = self._stuck_reason() or self.function.offload.failing
            if self.settings.workers > 1 and self.state == READY and reason:
                # A supervised worker that cannot take work is replaced, not left to say 503.
                log.error(
                    "unhealthy: %s; stopping this worker so that a fresh one replaces it",
                    reason,
                )
                self.begin_drain()
                if self.on_unhealthy is not None:
                    self.on_unhealthy()

    @property
    def stuck(self) -> int:
        """User calls still running after their request ended (sync threads, async tasks)."""
        return self.function.threads.stuck + self.stuck_tasks

    def _stuck_reason(self) -> str:
        stuck, threads = self.stuck, self.settings.threads
        if stuck < threads:
            return ""
        return (
            f"{stuck} user calls are stuck (running on after their requests ended) and "
            f"--threads is {threads}"
        )

    def unhealthy_reason(self) -> str:
        """Why this worker cannot serve although setup() finished ("" when it can)."""
        return self.function.offload.check() or self._stuck_reason()

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
            if self.on_ready is not None:
                self.on_ready()
            log.info(
                "ready: %s serving %s", self.function.target.name, self.function.func_type.value
            )

    # --- POST /api/v1 ----------------------------------------------------------------

    def refusal(self) -> tuple[str, str] | None:
        """Why no request can be taken now, as the (code, message) of a 503; else None."""
        if self.state != READY:
            if self.state == STARTING:
                return errors.NOT_READY, "the function is starting: setup() has not finished"
            return errors.DRAINING, "the function is shutting down"
        if (
            self.function.threads.stuck + self.stuck_tasks >= self.settings.threads
            or self.function.offload.failing
        ):
            # every thread is held by a stuck call, or the isolation processes fail their
            # setup(): answered now (as /health says), not at --timeout or as a 500
            return errors.UNHEALTHY, f"unhealthy: {self.unhealthy_reason()}"
        return None

    async def _invoke(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = perf_counter()
        refused = self.refusal()
        if refused is not None:
            code, message = refused
            await _send(send, 503, errors.error_body(code, message), _RETRY_AFTER)
            self._finish(scope, started, 503, code, message, None)
            return
        admission = self.admission
        # Full: answered before reading a body. Else admitted only once the body is in, so
        # a client slow to send never holds the place of one that is ready.
        body = None
        if not admission.full:
            try:
                body = await self.read_body(scope, receive)
                held = len(body)
                if held > self._scan_above:  # charged for its parse too, until the end
                    try:
                        held += self.hold_parsed(body, self._parse_costs, PARSED_FLOOR)
                    except RequestError:
                        admission.release_body(held)
                        raise
            except RequestError as exc:
                extra = _RETRY_AFTER if exc.status == 503 else _CLOSE  # 408, 413: maybe unread
                await _send(send, exc.status, exc.body, extra)
                self._finish(scope, started, exc.status, exc.code, str(exc), None)
                return
            except _ClientGone:
                message = "client disconnected while sending"
                self._finish(scope, started, 499, errors.CLIENT_DISCONNECTED, message, None)
                return
            if not admission.try_admit():
                admission.release_body(held)
                body = None
        if body is None:
            message = "all processing slots and the queue are taken; retry later"
            await _send(send, 503, errors.error_body(errors.OVERLOADED, message), _RETRY_AFTER)
            self._finish(scope, started, 503, errors.OVERLOADED, message, None)
            return

        function = self.function
        input_data = None
        interrupt = _Interrupt(self, send, scope, started)
        bound = bind_request(interrupt)  # its scope and input_data: the ids of its lines
        # Error answers go through interrupt.send, which drops them once _overdue has sent the
        # 504; a 200 never can come after it (its deadline was cancelled first), so it
        # keeps the direct path.
        asgi_send, send = send, interrupt.send
        status, code, message = 200, "", ""
        error: BaseException | None = None  # user code's exception: its traceback is logged
        secrets: tuple[str, ...] = ()
        try:
            try:
                input_data = function.parse(body)
                # blanked from this request's logs, bodies and spans; and, while it runs,
                # from lines logged where its context is not visible (threads of user code)
                if secrets := bind_secrets(input_data):
                    in_flight.add(secrets)
                interrupt.input_data = input_data
                interrupt.watch(receive)  # only now may another task wait on receive()
                await admission.acquire_slot()
                interrupt.in_slot = True
                try:
                    tracing = self.tracing
                    if tracing is None:
                        result = await function.call(input_data)
                        output = function.serialise(result)
                    else:  # inline, not a coroutine of its own: this is every request's path
                        span, entered = tracing.begin(scope, input_data)
                        try:
                            result = await function.call(input_data)
                            record_output(span, result)
                            output = function.serialise(result)
                        except BaseException as exc:
                            tracing.end(span, entered, exc)
                            raise
                        tracing.end(span, entered)
                finally:
                    interrupt.release_slot()  # admission.release_slot(), once
                interrupt.close()
                if (failed := _failed_result(result)) is not None:
                    code, message = failed  # answered 200 all the same: counted and logged
            except asyncio.CancelledError:
                if not interrupt.reason:
                    if self.state != DRAINING:
                        raise
                    interrupt.reason = "shutdown"  # uvicorn cancels what runs past --grace
                interrupt.absorb()
            if not interrupt.reason:
                await asgi_send(
                    {"type": WHOLE_RESPONSE, "status": 200, "headers": _JSON_ONLY, "body": output}
                )
            elif interrupt.reason == "disconnect":
                status, code = 499, errors.CLIENT_DISCONNECTED
                message = "client disconnected; processing was cancelled"
            elif interrupt.reason == "shutdown":
                status, code, message = 503, errors.DRAINING, self._past_grace
                await _send(send, 503, errors.error_body(code, message), _RETRY_AFTER)
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
        except BaseException as exc:  # a bug of ours: still a JSON answer, never a traceback
            if isinstance(exc, asyncio.CancelledError):
                raise
            status, code, message = 500, errors.INTERNAL_ERROR, "internal error of the runtime"
            log.exception("internal error while serving a request")
            await _send(send, 500, function.failure(code, f"{message}: {type(exc).__name__}"))
        finally:
            interrupt.close()
            if secrets:
                in_flight.discard(secrets)
            admission.release_body(held)  # when the task ends: until then it holds it
            if interrupt.abandoned:  # _overdue has ended the request; its task ends only now
                self._stuck_task_ended(interrupt)
            else:
                admission.leave()
                ended = None
                if interrupt.late:  # the client got that answer, whatever came after it
                    status, code, message = interrupt.late
                    ended = interrupt.answered_at
                self._finish(scope, started, status, code, message, input_data, error, ended)
            unbind_request(bound)
        if self.tracing is not None and self.tracing.flush_each_request:
            # after the response: a short-lived instance loses no span, the client waits for none
            await anyio.to_thread.run_sync(self.tracing.flush)

    async def _overdue(self, interrupt: _Interrupt) -> None:
        """A request was cancelled (deadline, stop or disconnect): answer it now, whatever
        its task does, and count a task that still runs after STUCK_AFTER as stuck (its
        request ends here: the slot and the queue place are given back)."""
        bound = bind_request(interrupt)  # this task's context came from whichever request
        try:  # set the timer
            await self._answer_overdue(interrupt)
        except Exception:
            log.exception("internal error while ending a cancelled request")
        finally:
            unbind_request(bound)

    async def _answer_overdue(self, interrupt: _Interrupt) -> None:
        task = interrupt.task
        assert task is not None
        reason = interrupt.reason
        if reason != "disconnect" and not interrupt.responded and not task.done():
            if reason == "deadline":
                message = f"the request did not finish within its {self._timeout:g}s deadline"
                interrupt.late = (504, errors.DEADLINE_EXCEEDED, message)
                body, extra = self.function.failure(errors.DEADLINE_EXCEEDED, message), None
            else:  # the server stops and the request ran past --grace
                interrupt.late = (503, errors.DRAINING, self._past_grace)
                body, extra = errors.error_body(errors.DRAINING, self._past_grace), _RETRY_AFTER
            interrupt.answered_at = perf_counter()  # its latency: when the client got it
            with contextlib.suppress(Exception):  # the client may be gone
                await _send(interrupt._asgi_send, interrupt.late[0], body, extra)
        await asyncio.wait((task,), timeout=interrupt.STUCK_AFTER)
        if task.done():
            return
        interrupt.abandoned = True
        interrupt.give_back_slot()
        self.admission.leave()
        self.stuck_tasks += 1
        if interrupt.late:
            status, code, message = interrupt.late
        else:
            status, code = 499, errors.CLIENT_DISCONNECTED
            message = "client disconnected; processing was cancelled"
        if interrupt.scope["path"] in _API_PATHS:  # a trainer route counts its samples itself
            self._finish(
                interrupt.scope,
                interrupt.started,
                status,
                code,
                message,
                interrupt.input_data,
                ended=interrupt.answered_at,
            )
        log.warning(
            "process() ignores its cancellation and runs on %gs after its request was "
            "cancelled; it stays cancelled and is counted as stuck until it ends (%d stuck now)",
            interrupt.STUCK_AFTER,
            self.stuck,
        )

    @property
    def _past_grace(self) -> str:
        return (
            "the server is stopping and the request was still running after "
            f"--grace ({self.settings.grace:g}s); retry it"
        )

    def _stuck_task_ended(self, interrupt: _Interrupt) -> None:
        self.stuck_tasks -= 1
        log.warning("a stuck async process() ended after %.1fs", perf_counter() - interrupt.started)

    def _finish(
        self,
        scope: dict[str, Any],
        started: float,
        status: int,
        code: str,
        message: str,
        input_data: Any,
        error: BaseException | None = None,
        ended: float | None = None,  # when the answer went out, if not now (a late answer)
    ) -> None:
        elapsed = (ended or perf_counter()) - started
        rejected = scope.get(REJECTED)
        if rejected is not None:  # the protocol answered instead (a bad chunk, garbage after)
            status, code = rejected
            message = "the connection was answered and closed by the HTTP layer"
            error = None
        self.metrics.observe(status, elapsed, code)
        if status != 200 or code:  # RequestLog.answered, inline on the hot path
            self.request_log.failure(scope, status, elapsed, code, message, input_data, error)
        elif self.request_log.wants(elapsed):
            self.request_log.success(scope, elapsed, input_data)

    async def read_body(self, scope: dict[str, Any], receive: Any) -> bytes:
        """Read within --body-timeout, holding (in the admission's body budget) the bytes
        received so far: a client that announces a large body and stalls holds only what it
        sent, so slow senders cannot starve ready ones. A small body is one chunk, one charge."""
        max_body = self._max_body
        admission = self.admission
        held = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                if int(value) > max_body:
                    raise _too_large(max_body)
                break
        deadlines = self._body_deadlines
        task = deadlines.start(self.loop or asyncio.get_running_loop())
        try:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone
            body = message.get("body", b"")
            if len(body) > max_body:
                raise _too_large(max_body)
            held = self._hold_more(held, len(body))
            if not message.get("more_body", False):
                return body
            chunks = [body]
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise _ClientGone
                chunk = message.get("body", b"")
                if held + len(chunk) > max_body:
                    raise _too_large(max_body)
                held = self._hold_more(held, len(chunk))
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
                f"request body not received within {self._body_timeout:g}s (--body-timeout)",
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

    def _hold_more(self, held: int, size: int) -> int:
        if not self.admission.hold_body(size):
            raise _over_budget(self.admission.buffered)
        return held + size

    # --- the trainer protocols (runtime.serving.trainers) -----------------------------------

    def admit(self, count: int = 1) -> tuple[str, str] | None:
        """Admit ``count`` requests, all or none: None, or the (code, message) of the 503."""
        refused = self.refusal()
        if refused is not None:
            return refused
        for admitted in range(count):
            if not self.admission.try_admit():
                for _ in range(admitted):
                    self.admission.leave()
                return errors.OVERLOADED, "all processing slots and the queue are taken"
        return None

    async def run_admitted(
        self, scope: dict[str, Any], input_data: Any, interrupt: _Interrupt
    ) -> Any:
        """Run one admitted input in a slot, traced like /api/v1; what process() returned.

        ``interrupt`` (made in the calling task) bounds it as it bounds /api/v1: cancelled
        at its deadline and again until it ends, answered at once through its ``send``,
        and counted as stuck (slot and place given back) when it will not end.
        """
        await self.admission.acquire_slot()
        interrupt.in_slot = True
        try:
            if self.tracing is None:
                return await self.function.call(input_data)
            with self.tracing.request(scope, input_data) as span:
                result = await self.function.call(input_data)
                record_output(span, result)
                return result
        finally:
            interrupt.release_slot()

    # --- everything else -------------------------------------------------------------

    def health(self) -> tuple[str, str]:
        """/health's decision (also Ray Serve's health check): the status, and why it is
        "unhealthy" when set up but unable to serve (a broken pool, every thread stuck)."""
        state = self.state
        reason = self.unhealthy_reason() if state == READY else ""
        return (UNHEALTHY, reason) if reason else (state, "")

    async def _health(self, request: Request) -> Response:
        state, reason = self.health()
        if reason:  # set up, but cannot serve: a broken pool, or every thread stuck
            body = orjson.dumps({"status": UNHEALTHY, "reason": reason, **self._health_fields})
            return Response(body, 503, media_type="application/json")
        body = orjson.dumps({"status": state, **self._health_fields})
        return Response(body, 200 if state == READY else 503, media_type="application/json")

    async def _metrics(self, request: Request) -> Response:
        # anyio's default threads: user code never runs there, so this never waits behind it
        body = await anyio.to_thread.run_sync(self.metrics.exposition)  # reads files
        return Response(body, 200, media_type=CONTENT_TYPE_LATEST)

    async def _method_not_allowed(self, request: Request) -> Response:
        raise HTTPException(405, headers={"Allow": "POST"})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """A 404 (a typo'd URL), a 405 (a GET to /api/v1): answered, counted in
        rl_function_requests_total by its route (a path no route has: UNKNOWN_PATH) and
        logged as every non-2xx answer is."""
        assert isinstance(exc, HTTPException)
        code, message = _http_error_answer(request, exc)
        scope = request.scope
        self.metrics.unrouted(self._route_paths.get(scope["path"], UNKNOWN_PATH), exc.status_code)
        elapsed = perf_counter() - scope.get(_STARTED, perf_counter())
        self.request_log.failure(scope, exc.status_code, elapsed, code, message, None)
        return Response(
            errors.error_body(code, message),
            exc.status_code,
            headers=exc.headers,
            media_type="application/json",
        )


def _failed_result(result: Any) -> tuple[str, str] | None:
    """(error code, error) of a result of status failed (OTHER when it names no code); None
    for a success. The result is process()'s, already checked by ``Function.serialise``:
    an output model, one of another package (the SDK's), or a dict of its shape."""
    if type(result) is dict:
        status, code, error = (result.get(k) for k in ("status", "error_code", "error"))
    else:
        status = getattr(result, "status", None)
        if status is _SUCCESS:
            return None
        code, error = getattr(result, "error_code", None), getattr(result, "error", None)
    if getattr(status, "value", status) != "failed":
        return None
    return str(code) if code else OTHER, str(error) if error else ""


_SUCCESS = TaskStatus.SUCCESS


class _Interrupt:
    """Cancels a request's task at its deadline, or when its client goes away.

    Cheaper than a cancel scope and a watcher task per request: one timer, which first
    fires once the request has run for a while and only then starts watching for a
    disconnect (most requests are answered long before), then fires at the deadline. Once
    fired,
    it cancels the task again every ``RECANCEL`` seconds until user code has ended (as an
    anyio cancel scope would), and ``FunctionApp._overdue`` answers at once whatever the
    task does (504 at the deadline, 503 at a stop past --grace). The request's error
    answers go through ``send``, which drops them once that answer has gone out.
    """

    __slots__ = (
        "_app",
        "_asgi_send",
        "_deadline",
        "_deadline_at",
        "_first_look",
        "_loop",
        "_recancel",
        "_receive",
        "_stopped",
        "_watcher",
        "abandoned",
        "answered_at",
        "in_slot",
        "input_data",
        "late",
        "reason",
        "responded",
        "scope",
        "started",
        "task",
    )
    WATCH_AFTER = 0.5  # seconds; a disconnect is noticed within this much
    RECANCEL = 0.05  # seconds between cancellations of a task that ignores them
    STUCK_AFTER = 1.0  # seconds a cancelled task may take to end before it counts as stuck

    def __init__(
        self,
        app: FunctionApp,
        send: Any,
        scope: dict[str, Any],
        started: float,
        timeout: float | None = None,  # seconds; None: --timeout
    ) -> None:
        self._loop = loop = app.loop or asyncio.get_running_loop()
        self.task = asyncio.current_task(loop)
        self._app = app
        self._asgi_send = send
        self.scope = scope
        self.started = started
        self.input_data: Any = None
        self.reason = ""
        # (status, code, message) of the answer _overdue sent, if it did
        self.late: tuple[int, str, str] | None = None
        self.answered_at: float | None = None  # perf_counter() when that answer was sent
        app._live.add(self)
        self.responded = self.in_slot = self.abandoned = False
        now = loop.time()
        self._deadline_at = now + (app._timeout if timeout is None else timeout)
        self._deadline: asyncio.TimerHandle | None = None
        self._stopped = False
        if self._deadline_at > now + self.WATCH_AFTER:
            # first looked at WATCH_AFTER from now (to start watching for a disconnect) by
            # the app's shared schedule; a timer of its own after that
            self._first_look = app._first_looks.add(now + self.WATCH_AFTER, self)
        else:  # a deadline this short is kept to the millisecond, by a timer of its own
            self._first_look = _NO_LOOK
            self._deadline = loop.call_at(self._deadline_at, self._tick)
        self._recancel: asyncio.TimerHandle | None = None
        self._receive: Any = None
        self._watcher: asyncio.Task[None] | None = None

    async def send(self, message: dict[str, Any]) -> None:
        if self.late:
            return  # the client has its answer already
        self.responded = True
        await self._asgi_send(message)

    def watch(self, receive: Any) -> None:
        """From the next tick on, a disconnect of the client cancels the request."""
        self._receive = receive

    def _tick(self) -> None:
        if self._stopped:
            return
        loop = self._loop
        if self._watcher is None and self._receive is not None:
            self._watcher = loop.create_task(self._watch(self._receive))
        if loop.time() >= self._deadline_at:
            self.fire("deadline")
        elif self._watcher is None:  # not watching yet: look again soon
            self._deadline = loop.call_at(
                min(self._deadline_at, loop.time() + self.WATCH_AFTER), self._tick
            )
        else:
            self._deadline = loop.call_at(self._deadline_at, self._tick)

    async def _watch(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fire("disconnect")

    def fire(self, reason: str) -> None:
        if self.reason or self.responded or self.task is None:
            return
        self.reason = reason
        self._cancel()
        self._loop.create_task(self._app._overdue(self))

    def _cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            self._recancel = self._loop.call_later(self.RECANCEL, self._cancel)

    def stop(self) -> None:
        """User code has ended: no deadline and no cancelling any more."""
        self._stopped = True
        self._first_look.discard(self)
        if self._deadline is not None:
            self._deadline.cancel()
        if self._recancel is not None:
            self._recancel.cancel()

    def release_slot(self) -> None:
        self.stop()
        self.give_back_slot()

    def give_back_slot(self) -> None:
        if self.in_slot:
            self.in_slot = False
            self._app.admission.release_slot()

    def absorb(self) -> None:
        """The cancellation was ours, or the server's at stop: let the task go on to answer."""
        self.stop()
        task = self.task
        cancelling = getattr(task, "cancelling", None)  # Python 3.11+
        if task is not None and cancelling is not None:
            for _ in range(cancelling()):
                task.uncancel()

    def close(self) -> None:
        self.stop()
        self._app._live.discard(self)
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()


async def _send(
    send: Any, status: int, body: bytes, extra: tuple[bytes, bytes] | None = None
) -> None:
    headers = _JSON_ONLY if extra is None else (_JSON, extra)
    await send({"type": WHOLE_RESPONSE, "status": status, "headers": headers, "body": body})


def _trainer_routes(app: FunctionApp) -> list[Route]:
    from runtime.serving.trainers import TrainerRoutes  # imports this module

    return TrainerRoutes(app).routes


class _FirstLooks:
    """Looks at each request once, when it has run for ``_Interrupt.WATCH_AFTER``, with one
    timer for all requests due in the same ``GRAIN`` of time rather than a timer per
    request (created and cancelled: about a microsecond, and most requests end long before
    their first look). A request that has ended is skipped; one still running gets its own
    timer from then on."""

    GRAIN = 0.01  # seconds: a first look is late by up to this much

    def __init__(self) -> None:
        self._due: dict[int, set[_Interrupt]] = {}

    def add(self, when: float, interrupt: _Interrupt) -> set[_Interrupt]:
        """Look at ``interrupt`` at ``when``; the set to discard it from once it has ended."""
        slot = int(when / self.GRAIN) + 1
        due = self._due.get(slot)
        if due is None:
            due = self._due[slot] = set()
            interrupt._loop.call_at(slot * self.GRAIN, self._look, slot)
        due.add(interrupt)
        return due

    def _look(self, slot: int) -> None:
        for interrupt in tuple(self._due.pop(slot)):  # one may end while others are looked at
            interrupt._tick()


_NO_LOOK: set[_Interrupt] = set()  # what a request without a first look discards itself from


class _BodyDeadlines:
    """Cancels the tasks still reading a body at their --body-timeout.

    One sweep a second for the whole worker while any body is being read, not a timer per
    request: the hot path only adds and removes a dict entry (a timer per request cost
    several microseconds). A body is late by up to one sweep.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._tick = min(1.0, timeout / 4)
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any]:
        task = asyncio.current_task(loop)
        assert task is not None
        self._reading[task] = loop.time() + self.timeout
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._tick, self._sweep, loop)
        return task

    def stop(self, task: asyncio.Task[Any]) -> None:
        self._reading.pop(task, None)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task`` was cancelled here; if so, the cancellation is absorbed."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        return True

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        late = [task for task, deadline in self._reading.items() if deadline <= now]
        for task in late:
            del self._reading[task]
            self._expired.add(task)
            task.cancel()
        self._sweeper = loop.call_later(self._tick, self._sweep, loop) if self._reading else None


def _over_budget(buffered: int) -> RequestError:
    return RequestError(
        503,
        errors.OVERLOADED,
        f"this worker already holds {buffered} bytes of request bodies and what they parse "
        "into (--max-buffered); retry later",
    )


def _too_large(limit: int) -> RequestError:
    return RequestError(413, errors.BODY_TOO_LARGE, f"request body is larger than {limit} bytes")


def _http_error_answer(request: Request, exc: HTTPException) -> tuple[str, str]:
    """(code, message) of a 404, a 405 or another HTTPException of the routes."""
    path = request.scope["path"]  # never request.url: that is built from the Host header
    path = path if len(path) <= 200 else path[:200] + "..."
    if exc.status_code == 404:
        return errors.NOT_FOUND, f"no such endpoint: {path}"
    if exc.status_code == 405:
        return errors.METHOD_NOT_ALLOWED, f"{request.method} is not allowed on {path}"
    return f"HTTP_{exc.status_code}", str(exc.detail)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s", request.scope["path"][:200], exc_info=exc)
    body = errors.error_body(errors.INTERNAL_ERROR, "internal error of the runtime")
    return Response(body, 500, media_type="application/json")
