"""The ASGI app that serves one function: its lifespan (setup, the drain, shutdown), its
health, and its routes.

``POST /api/v1`` is the hot path, handed on raw ASGI to ``api.ApiHandler``. Everything else
(``/health``, ``/metrics``, the routes mounted by whoever builds the app, such as the
trainer protocols, and the 404 and 405 answers) goes through a small Starlette app, where
a few microseconds of routing do not matter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, MutableMapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime import errors
from runtime.compat.alias.parsers import parser_for
from runtime.config import Settings
from runtime.execution.function import Function, ProcessorFailure
from runtime.logs import RequestLog
from runtime.serving.admission import Admission
from runtime.serving.api import ApiHandler
from runtime.serving.body import BodyReader
from runtime.serving.deadlines import Reason
from runtime.serving.health import Health
from runtime.serving.metrics import CONTENT_TYPE_LATEST, UNKNOWN_PATH, Metrics
from runtime.serving.running import Runner
from runtime.serving.sending import WHOLE_RESPONSE, split_whole_responses

if TYPE_CHECKING:  # imported only when tracing is on (server.build_app)
    from runtime.tracing.spans import Tracing

__all__ = ["SHUTDOWN_HOOK_LIMIT", "FunctionApp"]

log = logging.getLogger("runtime")

SHUTDOWN_HOOK_LIMIT = 10.0  # seconds for the user's shutdown() at stop

_NONE: dict[str, Any] = {}
_STARTED = "rl_function.started"  # scope key: when a request not on /api/v1 came in


class FunctionApp:
    def __init__(
        self, function: Function, settings: Settings, tracing: Tracing | None = None
    ) -> None:
        self.function = function
        self.settings = settings
        self.tracing = tracing
        self.admission = Admission(settings.concurrency, settings.queue, settings.max_buffered)
        self.state = Health.STARTING
        self.on_fatal: Callable[[], None] | None = None  # set by the server: stop, exit non-zero
        # set by the server: stop, exit EXIT_UNHEALTHY so that the supervisor replaces us
        self.on_unhealthy: Callable[[], None] | None = None
        # set by the server of a supervised worker: tell the supervisor at once
        self.on_ready: Callable[[], None] | None = None
        self.request_log = RequestLog(function.func_type.value, settings)
        # The serving loop, known from the lifespan on: on Python 3.11 each argument-less
        # get_running_loop() or current_task() is a getpid() system call, several a request.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._setup_task: asyncio.Task[None] | None = None
        self._gauge_task: asyncio.Task[None] | None = None
        self._setup_ok = False
        self._health_fields: dict[str, Any] = {
            "func_type": function.func_type.value,
            "processor": function.target.name,
            "parser": parser_for(function.func_type).__name__,  # the SDK's names
        }
        self.metrics = Metrics(
            function.func_type.value,
            lambda: (self.admission.in_flight, self.admission.queued, self.stuck),
        )
        function.sub_reward_errors.on_failure = self.metrics.sub_reward_failed
        self.body = BodyReader(self.admission, settings.max_body, settings.body_timeout)
        # runs admitted inputs under their deadlines; answers the overdue, counts the stuck
        self.runner = Runner(function, self.admission, settings, tracing)
        self._api = ApiHandler(
            function,
            self.admission,
            self.body,
            self.runner,
            self.metrics,
            self.request_log,
            refusal=self.refusal,
            draining=lambda: self.state == Health.DRAINING,
            tracing=tracing,
        )
        self._routes = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/api/v1", self._method_not_allowed, methods=["POST"]),
            ],
            exception_handlers={HTTPException: self._http_error, Exception: _internal_error},
        )
        # A redirect would be built from the request's Host header (an open redirect).
        self._routes.router.redirect_slashes = False
        # the path label of an answer no route served: a route's path, else UNKNOWN_PATH
        self._route_paths = {r.path: r.path for r in self._routes.routes if isinstance(r, Route)}
        self._route_paths["/api/v1/"] = "/api/v1"

    def add_health_fields(self, **fields: Any) -> None:
        """Say ``fields`` on /health too (the trainer protocols: the metric names every
        answer carries), before the first request."""
        self._health_fields.update(fields)

    def mount(self, routes: Sequence[BaseRoute]) -> None:
        """Serve ``routes`` too (the trainer protocols: runtime.serving.trainers), before
        the first request."""
        self._routes.router.routes.extend(routes)
        self._route_paths.update((r.path, r.path) for r in routes if isinstance(r, Route))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if (path == "/api/v1" or path == "/api/v1/") and scope["method"] == "POST":
                if WHOLE_RESPONSE not in scope.get("extensions", _NONE):  # not our protocol
                    send = split_whole_responses(send)
                await self._api(scope, receive, send)
            else:
                scope[_STARTED] = perf_counter()  # for the line of a 404 or 405
                await self._routes(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    # --- lifecycle -------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Stop taking requests: /health says "draining", /api/v1 answers 503."""
        self.state = Health.DRAINING

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # anyio's default threads are left to runtime internals (/metrics, tracing):
                # user code has its own (execution.offload.UserThreads) and never holds them.
                # Setup runs in the background so that /health answers "starting" meanwhile.
                self.loop = self._api.loop = loop = asyncio.get_running_loop()
                self._setup_task = loop.create_task(self._setup())
                self._gauge_task = loop.create_task(self._refresh_gauges())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.state = Health.DRAINING
                # uvicorn cancelled what ran past --grace, once; a task that ignored it is
                # answered 503 now and cancelled until it ends, as at a deadline
                self.runner.deadlines.fire_all(Reason.SHUTDOWN)
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
            if self.state == Health.READY:
                self.function.offload.check()  # a pool that broke while idle is rebuilt now
            reason = self._stuck_reason() or self.function.offload.failing
            if self.settings.workers > 1 and self.state == Health.READY and reason:
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
        return self.function.threads.stuck + self.runner.stuck_tasks

    @property
    def stuck_tasks(self) -> int:
        """Async calls that ignored their cancellation and run on after their request."""
        return self.runner.stuck_tasks

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
        if self.state == Health.STARTING:
            self.state = Health.READY
            if self.on_ready is not None:
                self.on_ready()
            log.info(
                "ready: %s serving %s", self.function.target.name, self.function.func_type.value
            )

    # --- what runs requests (for /api/v1, and for mounted routes such as the trainers) ---

    def refusal(self) -> tuple[str, str] | None:
        """Why no request can be taken now, as the (code, message) of a 503; else None."""
        state = self.state
        if state != Health.READY:
            if state == Health.STARTING:
                return errors.NOT_READY, "the function is starting: setup() has not finished"
            return errors.DRAINING, "the function is shutting down"
        if (
            self.function.threads.stuck + self.runner.stuck_tasks >= self.settings.threads
            or self.function.offload.failing
        ):
            # every thread is held by a stuck call, or the isolation processes fail their
            # setup(): answered now (as /health says), not at --timeout or as a 500
            return errors.UNHEALTHY, f"unhealthy: {self.unhealthy_reason()}"
        return None

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

    async def read_body(self, scope: MutableMapping[str, Any], receive: Any) -> bytes:
        """The body of the calling task's request (``body.BodyReader.read``), held in the
        budget: the caller releases ``len(body)`` once done with it."""
        loop = self.loop or asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        return await self.body.read(scope, receive, loop, task)

    def hold_parsed(self, body: bytes, costs: tuple[int, int, int], floor: int = 0) -> int:
        """Hold what ``body`` will take once parsed (``body.BodyReader.hold_parsed``)."""
        return self.body.hold_parsed(body, costs, floor)

    # --- everything else -------------------------------------------------------------

    def health(self) -> tuple[Health, str]:
        """/health's decision (also Ray Serve's health check): the status, and why it is
        UNHEALTHY when set up but unable to serve (a broken pool, every thread stuck)."""
        state = Health(self.state)
        reason = self.unhealthy_reason() if state is Health.READY else ""
        return (Health.UNHEALTHY, reason) if reason else (state, "")

    async def _health(self, request: Request) -> Response:
        state, reason = self.health()
        fields = {"status": state, "reason": reason} if reason else {"status": state}
        body = orjson.dumps({**fields, **self._health_fields})
        status = 200 if state is Health.READY else 503  # set up but UNHEALTHY: 503, and why
        return Response(body, status, media_type="application/json")

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
