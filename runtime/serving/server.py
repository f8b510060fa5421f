"""Run the app on uvicorn: in this process, or in N supervised worker processes.

Our Server differs from uvicorn's in three ways: SIGTERM/SIGINT first turn the app to
"draining" (so /health and new requests say so) before uvicorn's own graceful stop;
a failed setup() stops the server with exit code 3 (which also stops the supervisor
of ``--workers`` instead of restarting the worker forever); and a
signal-initiated stop exits 0 instead of re-raising the signal after shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

import runtime.logs
from runtime.config import Settings
from runtime.execution.function import Function, ProcessorFailure
from runtime.execution.loading import TargetError, load_target
from runtime.logs import setup_logging
from runtime.serving.app import SHUTDOWN_HOOK_LIMIT, FunctionApp
from runtime.serving.health import Health
from runtime.serving.heartbeat import Heartbeat
from runtime.serving.protocol import KEEP_ALIVE_SECONDS, connection_cap, protocol_class
from runtime.serving.trainers import TrainerRoutes

# uvicorn imports its event loop as it starts, once the class is loaded and the workspace
# is first on sys.path: imported now, a workspace's uvloop.py cannot stand in for it
with contextlib.suppress(ImportError):
    import uvloop  # noqa: F401

__all__ = ["Server", "bind", "build_app", "run_worker"]

log = logging.getLogger("runtime")


# A worker that cannot serve (every thread stuck) and stops itself so that the supervisor of
# --workers replaces it; a supervisor treats it like any other exit: start a fresh worker.
EXIT_UNHEALTHY = 4
STOP_SLACK = 5.0  # seconds, on top of the bounds of each stage of a stop
THREADS_END_WITHIN = 1.0  # seconds for threads other than the loop's to end after it
# A full collection is considered after this many collections of the middle generation
# (CPython's: 10); the collector's thresholds before user code could choose its own
FULL_COLLECTION_AFTER = 100
_STARTING_THRESHOLDS = gc.get_threshold()


class Server(uvicorn.Server):
    exit_code = 0
    _watchdog: threading.Timer | None = None
    heartbeat: Heartbeat | None = None  # a supervised worker's, beaten by its event loop
    _beating: asyncio.Task[None] | None = None

    def _function_app(self) -> FunctionApp | None:
        app: Any = getattr(self.config, "loaded_app", None)
        while app is not None and not isinstance(app, FunctionApp):
            app = getattr(app, "app", None)
        return app

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        app = self._function_app()
        heartbeat = self.heartbeat
        if app is not None:
            app.on_fatal = self._fatal
            app.on_unhealthy = self._unhealthy

            def ready() -> None:
                settle_garbage_collector()
                if heartbeat is not None:  # a worker that dies once ready is no crash loop
                    heartbeat.beat(app.state)

            app.on_ready = ready
        if heartbeat is not None:  # beats on until the loop ends, through the drain
            state = (lambda: app.state) if app is not None else (lambda: Health.READY)
            self._beating = asyncio.get_running_loop().create_task(heartbeat.keep_beating(state))
        await super().startup(sockets=sockets)

    async def _serve(self, sockets: list[socket.socket] | None = None) -> None:
        await super()._serve(sockets)
        # A signal we handled ends in a clean exit 0, not a re-raised SIGTERM.
        self._captured_signals.clear()
        if self.heartbeat is not None:  # stopped: what follows (exiting) is no blocked loop
            if self._beating is not None:
                self._beating.cancel()
            self.heartbeat.beat(Health.STOPPED)
        app = self._function_app()
        if app is not None and (app.stuck_tasks or app.admission.admitted):
            await self._exit_past_stuck_tasks(app)

    async def _exit_past_stuck_tasks(self, app: FunctionApp) -> None:
        # asyncio.run would wait forever for a task that ignores its cancellation: give the
        # requests cancelled at --grace a moment to send their answers, then leave.
        loop = asyncio.get_running_loop()
        until = loop.time() + 2
        while app.admission.admitted and loop.time() < until:
            await asyncio.sleep(0.02)
        if app.stuck_tasks or app.admission.admitted:
            log.warning(
                "exiting with %d stuck async tasks still running",
                app.stuck_tasks + app.admission.admitted,
            )
            _exit_now(self.exit_code or (1 if app.admission.admitted else 0))

    def handle_exit(self, sig: int, frame: Any) -> None:
        app = self._function_app()
        if app is not None:
            app.begin_drain()
        self._arm_watchdog()
        super().handle_exit(sig, frame)

    def _fatal(self) -> None:
        self.exit_code = STARTUP_FAILURE
        self.should_exit = True
        self._arm_watchdog()

    def _unhealthy(self) -> None:
        self.exit_code = EXIT_UNHEALTHY
        self.should_exit = True
        self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        # The stop is bounded whatever user code does: requests get --grace, then shutdown()
        # and the tracing export their own bounds; past all that, the process exits anyway.
        if self._watchdog is None:
            limit: float = self.config.timeout_graceful_shutdown or 0
            limit += SHUTDOWN_HOOK_LIMIT + 10 + STOP_SLACK
            self._watchdog = threading.Timer(limit, self._overran, (limit,))
            self._watchdog.daemon = True
            self._watchdog.start()

    def _overran(self, limit: float) -> None:
        app = self._function_app()
        unanswered = app.admission.admitted if app is not None else 0
        log.error(
            "still stopping %gs after the stop began (%d accepted requests unanswered): "
            "exiting now",
            limit,
            unanswered,
        )
        _exit_now(self.exit_code or (1 if unanswered else 0))

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        super().run(sockets)
        current = threading.current_thread()
        others = [t for t in threading.enumerate() if not t.daemon and t is not current]
        # anyio's idle worker threads (the tracing flush, /metrics ran there) end as the
        # loop's main task does: a moment, not a stuck call
        deadline = time.monotonic() + THREADS_END_WITHIN
        for thread in others:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in others if t.is_alive()]
        if stuck:  # a non-daemonic thread (a stuck call of user code) would keep us alive
            log.warning("exiting with %d threads still running: %s", len(stuck), ", ".join(stuck))
            _exit_now(self.exit_code)
        if self.exit_code:
            sys.exit(self.exit_code)


def tune_garbage_collector() -> None:
    """Before setup(), which may choose otherwise (gc.set_threshold; at the import of the
    user's module, only values other than the starting ones): full collections considered
    ten times more rarely than CPython's default. Each walks every object of the requests
    in flight: with 5,000 rollouts held 5 s (benchmarks/run.py, scenario 9) there were 25
    in 30 s of about 300 ms each, a pause of the event loop each and a third of the
    worker's time. What they free is reference cycles, and the request path makes none;
    user code that does keeps its own ten times longer (docs/writing-functions.md)."""
    thresholds = gc.get_threshold()
    young, middle, full = thresholds
    # full == 0: no third threshold (CPython 3.14's incremental collector)
    if thresholds == _STARTING_THRESHOLDS and full:
        gc.set_threshold(young, middle, max(full, FULL_COLLECTION_AFTER))


def settle_garbage_collector() -> None:
    """Once the function is ready (setup() done), what startup left (modules, the user's
    setup() objects) leaves the cyclic collector's sight: a full collection no longer walks
    it. Under load, full collections are frequent (the objects of the requests in flight
    keep being promoted): walking startup's objects cost 22 to 24% of a 64 x 3 KB group
    reward's time and a tenth of the echo reward's (benchmarks/inprocess.py --http).
    Startup's garbage is collected once first."""
    gc.collect()
    gc.freeze()


def _exit_now(code: int) -> None:
    """Exit at once, leaving running threads behind, but not the log lines still queued."""
    with contextlib.suppress(Exception):
        runtime.logs.drain()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _uvicorn_config(app: Any, settings: Settings, **extra: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,  # ours is cheaper and carries the request's ids
        proxy_headers=False,
        server_header=False,
        log_config=None,  # logging is set up by runtime.logs
        timeout_graceful_shutdown=int(settings.grace + 0.999),
        # Hostile or broken clients: header limits and deadlines, a connection cap and JSON
        # error answers (runtime.serving.protocol); an idle keep-alive connection closes after 5 s.
        http=protocol_class(
            max_connections=connection_cap(settings.max_connections),
            read_timeout=settings.body_timeout,
            on_reject=app.metrics.protocol_rejected if isinstance(app, FunctionApp) else None,
        ),
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        # No WebSockets: an upgrade request is a plain HTTP request, answered by our routes
        # (uvicorn would answer it text/plain 500 with an ERROR line).
        ws="none",
        **extra,
    )


def bind(settings: Settings) -> socket.socket:
    """The listening socket, bound before the app is built (setup() runs); exit 2 if the
    address is taken."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        sock = socket.create_server((settings.host, settings.port), family=family, backlog=2048)
    except OSError as exc:
        log.error("cannot listen on %s port %d: %s", settings.host, settings.port, exc.strerror)
        sys.exit(2)
    sock.set_inheritable(True)
    return sock


def build_app(settings: Settings) -> FunctionApp:
    """The app of ``settings``: its target loaded, its processor made, traced if asked,
    the trainer protocols mounted."""
    if settings.tracing:  # OpenTelemetry's SDK only then (a shorter cold start); a spawned
        # worker imports it here, before load_target puts the workspace first on sys.path
        from runtime.tracing.spans import Tracing
    target = load_target(settings.target, settings.workspace, settings.func_type)
    function = Function(
        target,
        isolation=settings.isolation,
        processes=settings.processes,
        threads=settings.threads,
        sub_reward_errors=settings.sub_reward_errors,
    )
    tracing = None
    if settings.tracing:
        flush_each = settings.flush_spans == "request"
        tracing = Tracing(target.func_type.value, target.name, flush_each_request=flush_each)
    app = FunctionApp(function, settings, tracing)
    app.mount(TrainerRoutes(app).routes)
    return app


def run_worker(
    settings: Settings, sock: socket.socket | None = None, heartbeat: Heartbeat | None = None
) -> None:
    """Serve in this process: on ``sock`` (a supervised worker) or by binding the port."""
    setup_logging(settings.log_level, settings.log_format)
    if sock is None:
        sock = bind(settings)
    tune_garbage_collector()
    try:
        app = build_app(settings)
    except (TargetError, ProcessorFailure) as exc:
        log.error("%s", exc)
        sys.exit(STARTUP_FAILURE)
    server = Server(_uvicorn_config(app, settings))
    server.heartbeat = heartbeat
    server.run(sockets=[sock])
