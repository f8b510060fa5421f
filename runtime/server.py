"""Run the app on uvicorn: one worker in this process, or N supervised worker processes.

Our Server differs from uvicorn's in three ways: SIGTERM/SIGINT first turn the app to
"draining" (so /health and new requests say so) before uvicorn's own graceful stop;
a failed setup() stops the server with exit code 3 (uvicorn's startup-failure code,
which also stops its multi-worker supervisor instead of restarting forever); and a
signal-initiated stop exits 0 instead of re-raising the signal after shutdown.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from runtime.app import FunctionApp
from runtime.config import Settings
from runtime.function import Function
from runtime.loading import Target, load_target
from runtime.logs import setup_logging

__all__ = ["Server", "create_app", "serve"]

log = logging.getLogger("runtime")

_SETTINGS_ENV = "_RUNTIME_WORKER_SETTINGS"  # hands the parent's settings to spawned workers


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


def create_app() -> FunctionApp:
    """App factory of a spawned worker process (``--workers`` > 1)."""
    settings = Settings(**json.loads(os.environ[_SETTINGS_ENV]))
    setup_logging(settings.log_level)
    target = load_target(settings.target, settings.workspace, settings.func_type)
    return FunctionApp(Function(target), settings)


def serve(target: Target, settings: Settings) -> None:
    """Serve ``target`` until SIGTERM/SIGINT; exits non-zero if setup() fails."""
    if settings.workers == 1:
        app = FunctionApp(Function(target), settings)
        Server(_uvicorn_config(app, settings)).run()
        return
    os.environ[_SETTINGS_ENV] = json.dumps(settings.to_json())
    config = _uvicorn_config(
        "runtime.server:create_app", settings, factory=True, workers=settings.workers
    )
    supervisor = Multiprocess(config, target=Server(config).run, sockets=[config.bind_socket()])
    supervisor.run()
    if any(p.process.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        sys.exit(STARTUP_FAILURE)
