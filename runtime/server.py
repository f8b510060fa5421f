"""Run the app on uvicorn: in this process, or in N supervised worker processes.

Our Server differs from uvicorn's in three ways: SIGTERM/SIGINT first turn the app to
"draining" (so /health and new requests say so) before uvicorn's own graceful stop;
a failed setup() stops the server with exit code 3 (which also stops the supervisor
of ``--workers`` instead of restarting the worker forever); and a
signal-initiated stop exits 0 instead of re-raising the signal after shutdown.
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from runtime.app import FunctionApp
from runtime.config import Settings
from runtime.function import Function, ProcessorFailure
from runtime.loading import TargetError, load_target
from runtime.logs import setup_logging
from runtime.supervisor import supervise
from runtime.tracing import Tracing

__all__ = ["Server", "run_worker", "serve"]

log = logging.getLogger("runtime")


class Server(uvicorn.Server):
    exit_code = 0

    def _function_app(self) -> FunctionApp | None:
        app: Any = getattr(self.config, "loaded_app", None)
        while app is not None and not isinstance(app, FunctionApp):
            app = getattr(app, "app", None)
        return app

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        app = self._function_app()
        if app is not None:
            app.on_fatal = self._fatal
        await super().startup(sockets=sockets)

    async def _serve(self, sockets: list[socket.socket] | None = None) -> None:
        await super()._serve(sockets)
        # A signal we handled ends in a clean exit 0, not a re-raised SIGTERM.
        self._captured_signals.clear()

    def handle_exit(self, sig: int, frame: Any) -> None:
        app = self._function_app()
        if app is not None:
            app.begin_drain()
        super().handle_exit(sig, frame)

    def _fatal(self) -> None:
        self.exit_code = STARTUP_FAILURE
        self.should_exit = True

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        super().run(sockets)
        if self.exit_code:
            sys.exit(self.exit_code)


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
        **extra,
    )


def run_worker(settings: Settings, sock: socket.socket | None = None) -> None:
    """Serve in this process: on ``sock`` (a supervised worker) or by binding the port."""
    setup_logging(settings.log_level)
    try:
        target = load_target(settings.target, settings.workspace, settings.func_type)
        function = Function(target, isolation=settings.isolation, processes=settings.processes)
        tracing = Tracing(target.func_type.value, target.name) if settings.tracing else None
        app = FunctionApp(function, settings, tracing)
    except (TargetError, ProcessorFailure) as exc:
        log.error("%s", exc)
        sys.exit(STARTUP_FAILURE)
    Server(_uvicorn_config(app, settings)).run(sockets=[sock] if sock is not None else None)


def serve(settings: Settings) -> None:
    """Serve until SIGTERM/SIGINT; exits non-zero if setup() fails."""
    if settings.workers == 1:
        run_worker(settings)
        return
    config = _uvicorn_config(None, settings)
    code = supervise(settings, config.bind_socket())
    if code:
        sys.exit(code)
