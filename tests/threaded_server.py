"""Base of the tests' stand-in servers: a Starlette app on uvicorn in a daemon thread,
on a loopback port, for the duration of a ``with`` block."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route


class ThreadedServer:
    def __init__(self, port: int, routes: list[Route]) -> None:
        self.port = port
        config = uvicorn.Config(
            Starlette(routes=routes),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> Any:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def serve_forever(self) -> None:
        """In the foreground instead, until SIGINT or SIGTERM (uvicorn handles both)."""
        self._server.run()

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
