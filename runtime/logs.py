"""Logging: set up once per process, written off the event loop.

Records go through a QueueHandler to a listener thread, so a burst of failure lines
never blocks request handling on terminal or pipe I/O. A successful fast request
writes nothing unless ``--access-log`` asks for it.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys
from typing import Any

from processors_base.models import BaseDataModel

__all__ = ["RequestLog", "setup_logging"]

_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
_listener: logging.handlers.QueueListener | None = None


def setup_logging(level: str) -> None:
    """Route every logger (ours, the user's, uvicorn's) through one queued stderr handler."""
    global _listener
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (use debug, info, warning, error)")
    if _listener is None:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter(_FORMAT))
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        _listener = logging.handlers.QueueListener(records, stream, respect_handler_level=False)
        _listener.start()
        atexit.register(_listener.stop)
        root = logging.getLogger()
        root.handlers[:] = [logging.handlers.QueueHandler(records)]
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).handlers[:] = []
            logging.getLogger(name).propagate = True
    logging.getLogger().setLevel(numeric)


class RequestLog:
    """One line per failed, slow or (with --access-log) every request on /api/v1."""

    def __init__(self, func_type: str, settings: Any) -> None:
        self._log = logging.getLogger("runtime.requests")
        self._func_type = func_type
        self._slow = settings.slow_request
        self._access = settings.access_log

    def wants(self, elapsed: float) -> bool:
        return self._access or elapsed >= self._slow

    def failure(
        self,
        scope: dict[str, Any],
        status: int,
        elapsed: float,
        code: str,
        message: str,
        input_data: BaseDataModel | None,
    ) -> None:
        level = logging.ERROR if status >= 500 and status != 503 else logging.WARNING
        if len(message) > 500:
            message = message[:500] + "..."
        self._log.log(
            level,
            "POST /api/v1 %s %d %.1fms %s%s: %s",
            self._func_type,
            status,
            elapsed * 1000,
            code,
            _ids(scope, input_data),
            message,
        )

    def success(
        self, scope: dict[str, Any], elapsed: float, input_data: BaseDataModel | None
    ) -> None:
        slow = elapsed >= self._slow
        self._log.log(
            logging.WARNING if slow else logging.INFO,
            "POST /api/v1 %s 200 %.1fms%s%s",
            self._func_type,
            elapsed * 1000,
            " SLOW" if slow else "",
            _ids(scope, input_data),
        )


def _ids(scope: dict[str, Any], input_data: BaseDataModel | None) -> str:
    parts = []
    for name, value in scope.get("headers", ()):
        if name in (b"x-request-id", b"x-fc-request-id"):
            parts.append(f"{name.decode()}={value.decode('latin-1')[:128]}")
    metadata = getattr(input_data, "request_metadata", None)
    if metadata is not None:
        parts.extend(
            f"{key}={getattr(metadata, key)}"
            for key in ("job_id", "sample_id", "rollout_id", "attempt_id")
        )
    return (" " + " ".join(parts)) if parts else ""
