"""Logging: set up once per process, written off the event loop, scrubbed of secrets.

Records go through a QueueHandler to a listener thread, so a burst of failure lines
never blocks request handling on terminal or pipe I/O. A successful fast request
writes nothing unless ``--access-log`` asks for it.

Every record, from any logger (ours, uvicorn's, httpx's, the user's), is formatted and
scrubbed in the thread that logs it, before it is queued: the current request's secrets
(bound by the app with :func:`bind_secrets`) in all their encodings, and credentials
recognisable by their shape (``Authorization``, ``Bearer``, URL userinfo). Control
characters are escaped, so no text from a request can forge a line or colour a terminal.
``--log-format json`` writes one JSON object per line, the request's ids as fields.

Every line logged while a request is handled (in its task, the tasks it starts and user
code's threads, which run in its context) carries the request's ids: the app binds the
request once (:func:`bind_request`), and the ids are read from it only when a line is
written. Third-party HTTP clients' per-call INFO lines are left out unless the level is
DEBUG (:func:`quiet_libraries`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import itertools
import logging
import logging.handlers
import os
import queue
import re
import secrets
import sys
import threading
import traceback
from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import orjson

import processors_base
import runtime
from processors_base.models import BaseDataModel
from processors_base.redaction import Secrets, redact, redact_head, redact_tail, request_secrets
from runtime.errors import safe_text

__all__ = [
    "RequestLog",
    "bind_input",
    "bind_request",
    "bind_secrets",
    "drain",
    "logging_settings",
    "quiet_libraries",
    "setup_logging",
    "unbind_request",
    "user_traceback",
]

_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
_listener: logging.handlers.QueueListener | None = None
_drained = False  # the listener has stopped (drain): it cannot be stopped twice
_settings: tuple[str, str] | None = None  # (level, format) this process logs with
_MAX_TEXT = 16_000  # characters of a record's message, and of its traceback; the middle is cut
ID_LIMIT = 128  # characters of one id in a request line
MASK = "**********"  # what a secret becomes in a log line, as in an error body
# Libraries that log every HTTP call at INFO (a judge's 2,000 calls: 2,000 lines).
CHATTY_LIBRARIES = ("httpx", "httpcore", "urllib3", "openai")
# The request being handled in this context: anything with the ASGI ``scope`` and, once
# parsed, ``input_data`` (the app binds its per-request state: nothing made per request).
_request: ContextVar[Any] = ContextVar("logged_request", default=None)


def bind_secrets(input_data: Any) -> Secrets:
    """Make ``input_data``'s api_key the current request's secret, blanked from every log
    line, error body and span of the request. Called by the app once the request is parsed;
    each request runs in its own task, whose context (and so this binding) ends with it.
    Returns the secrets (the app also lists them as in flight: see redaction.in_flight)."""
    secrets = Secrets.of(input_data)
    if secrets:
        request_secrets.set(secrets)
    return secrets


def bind_request(request: Any) -> Token[Any]:
    """Put the ids of ``request`` (its ``scope``'s headers, its ``input_data``'s
    request_metadata, read when a line is written) on every line logged from now on in
    this context: the request's task, and the tasks and user-code threads it starts.
    Give the token to :func:`unbind_request` when the request ends: the request may hold
    its task, whose context would hold the request (a cycle only the GC frees)."""
    return _request.set(request)


def unbind_request(token: Token[Any]) -> None:
    _request.reset(token)


def bind_input(input_data: Any) -> None:
    """:func:`bind_request` for a call known by its input alone (in an isolation process,
    where the request's headers never come): its request_metadata ids."""
    _request.set(_Input(input_data))


class _Input:
    __slots__ = ("input_data",)
    scope: dict[str, Any] = {}  # no headers

    def __init__(self, input_data: Any) -> None:
        self.input_data = input_data


def quiet_libraries(level: int) -> None:
    """HTTP clients' per-call INFO lines (``HTTP Request: POST ...``) only at DEBUG."""
    quiet = logging.NOTSET if level <= logging.DEBUG else logging.WARNING
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)


def drain() -> None:
    """Write every line queued so far and stop the writer thread: for a process about to
    end by ``os._exit``, which runs no exit hooks. Lines logged after it are lost."""
    global _drained
    if _listener is not None and not _drained:
        _drained = True
        _listener.stop()


def setup_logging(level: str, log_format: str = "text") -> None:
    """Route every logger (ours, the user's, uvicorn's) through one queued stderr handler."""
    global _listener, _settings
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (use debug, info, warning, error)")
    if _listener is None:
        logging.captureWarnings(True)  # warnings.warn text goes through the scrubbing too
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter(_FORMAT))
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        _listener = logging.handlers.QueueListener(records, stream, respect_handler_level=False)
        _listener.start()
        atexit.register(drain)
        handler = _Queued(records)
        handler.addFilter(_Redact())
        root = logging.getLogger()
        root.handlers[:] = [handler]
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).handlers[:] = []
            logging.getLogger(name).propagate = True
    logging.getLogger().setLevel(numeric)
    quiet_libraries(numeric)
    _settings = (level, log_format)


def logging_settings() -> tuple[str, str] | None:
    """(level, format) given to setup_logging, for child processes to log the same way."""
    return _settings


# --- scrubbing and formatting ---------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape_one(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def escape(text: str) -> str:
    """``text`` on one line: control characters (newline, ESC, ...) as escapes."""
    return _CONTROL_OR_NEWLINE.sub(_escape_one, text)


class _Redact(logging.Filter):
    """Formats a record where it is logged (the request's context is visible there), then
    blanks secrets from its message, traceback and stack, and from its fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string still gets logged, never raises here
            message = f"{record.msg!r} {record.args!r}"
        record.msg, record.args = _cap(message), None
        if record.exc_info:
            if isinstance(record.exc_info, _UserError):
                record.exc_text = user_traceback(record.exc_info[1]).rstrip("\n")
            elif not record.exc_text:
                record.exc_text = _PLAIN.formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = _cap(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, marker=MASK)
        fields = getattr(record, "fields", None)
        if fields:
            record.fields = {
                key: redact(value, marker=MASK) if isinstance(value, str) else value
                for key, value in fields.items()
            }
        elif (request := _request.get()) is not None:  # request lines carry theirs already
            ids = _ids(request.scope, getattr(request, "input_data", None))
            record.request_ids = {key: redact(value, marker=MASK) for key, value in ids.items()}
        return True


_PLAIN = logging.Formatter()


def _cap(text: str) -> str:
    """``text`` scrubbed, its middle cut past _MAX_TEXT: cut before it is scrubbed, so a
    record costs the logging thread (the event loop, for async code) a bounded time."""
    if len(text) <= _MAX_TEXT:
        return redact(text, marker=MASK)
    half = _MAX_TEXT // 2
    head, tail = redact_head(text, half, marker=MASK), redact_tail(text, half, marker=MASK)
    return f"{head}\n... [{len(text) - 2 * half} characters cut] ...\n{tail}"


class _Queued(logging.handlers.QueueHandler):
    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record  # already formatted and scrubbed by _Redact; its traceback kept apart


class _TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        ids = getattr(record, "request_ids", None)
        if not ids:
            return text
        first, newline, rest = text.partition("\n")  # on the record's first line
        return f"{first}{_text(ids)}{newline}{rest}"

    def format(self, record: logging.LogRecord) -> str:
        text = _CONTROL.sub(_escape_one, super().format(record))
        # continuation lines (a traceback) are indented: only a record starts a line
        return text.replace("\n", "\n    ") if "\n" in text else text


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None) or getattr(record, "request_ids", None)
        if fields:
            entry.update(fields)
        if record.exc_text:
            entry["traceback"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        try:
            return orjson.dumps(entry, default=str).decode()
        except TypeError:  # a lone surrogate (text decoded with surrogateescape): escaped
            return orjson.dumps(_valid_utf8(entry), default=lambda v: safe_text(str(v))).decode()


def _valid_utf8(value: Any) -> Any:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(str(k)): _valid_utf8(v) for k, v in value.items()}
    return value


# --- tracebacks of user code ----------------------------------------------------------


def _machinery() -> tuple[str, ...]:
    modules = (runtime, processors_base, anyio, asyncio, concurrent.futures)
    # a module's __file__ is None only for a namespace package, which these are not
    paths = [Path(m.__file__).parent for m in modules if m.__file__ is not None]
    return (*(f"{p}/" for p in paths), threading.__file__)


_MACHINERY = _machinery()


def user_traceback(exc: BaseException) -> str:
    """The traceback of an exception raised by user code, without the runtime's frames
    that lead to it (the runtime, anyio, asyncio, thread pools); all of it if that leaves
    nothing."""
    remote = getattr(exc, "remote_traceback", "")
    if isinstance(remote, str) and remote:  # raised in an isolation process: its text
        return _trim_text(remote)
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_MACHINERY):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def _trim_text(text: str) -> str:
    """The leading machinery frames out of a formatted traceback."""
    lines = text.splitlines(keepends=True)
    start = 1
    while start < len(lines) and lines[start].startswith('  File "'):
        if not lines[start][8:].startswith(_MACHINERY):
            break
        start += 1
        while start < len(lines) and lines[start].startswith("    "):  # its source lines
            start += 1
    if not lines or not lines[0].startswith("Traceback") or start >= len(lines) - 1:
        return text
    return lines[0] + "".join(lines[start:])


# --- the request log ------------------------------------------------------------------


class RequestLog:
    """One line per failed, slow or (with --access-log) every request on /api/v1 and the
    trainer routes; a 200 whose result is ``failed`` is a failure."""

    def __init__(self, func_type: str, settings: Any) -> None:
        self._log = logging.getLogger("runtime.requests")
        self._func_type = func_type
        self._slow = settings.slow_request
        self._access = settings.access_log

    def wants(self, elapsed: float) -> bool:
        return self._access or elapsed >= self._slow

    def answered(
        self,
        scope: MutableMapping[str, Any],
        status: int,
        elapsed: float,
        code: str = "",
        message: str = "",
        input_data: BaseDataModel | None = None,
    ) -> None:
        """The line of one answer, if it gets one: a failure (non-2xx, or a 200 with the
        ``code`` of its failed result), or else a slow request, or every one with
        --access-log."""
        if status != 200 or code:
            self.failure(scope, status, elapsed, code, message, input_data)
        elif self.wants(elapsed):
            self.success(scope, elapsed, input_data)

    def failure(
        self,
        scope: MutableMapping[str, Any],
        status: int,
        elapsed: float,
        code: str,
        message: str,
        input_data: BaseDataModel | None,
        error: BaseException | None = None,
    ) -> None:
        """A non-2xx answer, or a 200 whose result is failed with ``code`` (the function's
        own: cut and escaped). ``error``: user code's exception, its traceback on the line."""
        if status == 200:
            level, failed, code = logging.WARNING, "failed ", escape(code[:ID_LIMIT])
        else:
            level = logging.ERROR if status >= 500 and status != 503 else logging.WARNING
            failed = ""
        if len(message) > 500:  # cut before it is scrubbed, a margin past the cut scrubbed too
            message = redact_head(message, 500, marker=MASK) + "..."
        ids = _ids(scope, input_data)
        path = scope["path"]  # any path, with a 404: cut and escaped
        path = escape(path if len(path) <= 200 else path[:200] + "...")
        self._log.log(
            level,
            "%s %s %s %d %.1fms %s%s%s: %s",
            scope["method"],
            path,
            self._func_type,
            status,
            elapsed * 1000,
            failed,
            code,
            _text(ids),
            escape(message),
            extra={
                "fields": {
                    "path": path,
                    "func_type": self._func_type,
                    "status": status,
                    "result": "failed",
                    "elapsed_ms": round(elapsed * 1000, 1),
                    "error_code": code,
                    **ids,
                }
            },
            exc_info=None if error is None else _UserError(error),
        )

    def success(
        self, scope: MutableMapping[str, Any], elapsed: float, input_data: BaseDataModel | None
    ) -> None:
        slow = elapsed >= self._slow
        ids = _ids(scope, input_data)
        self._log.log(
            logging.WARNING if slow else logging.INFO,
            "POST %s %s 200 %.1fms%s%s",
            scope["path"],
            self._func_type,
            elapsed * 1000,
            " SLOW" if slow else "",
            _text(ids),
            extra={
                "fields": {
                    "path": scope["path"],
                    "func_type": self._func_type,
                    "status": 200,
                    "result": "success",
                    "elapsed_ms": round(elapsed * 1000, 1),
                    **ids,
                }
            },
        )


class _UserError(tuple[type[BaseException], BaseException, TracebackType | None]):
    """An exc_info whose traceback is shown as user code's (see user_traceback)."""

    def __new__(cls, error: BaseException) -> _UserError:
        return super().__new__(cls, (type(error), error, error.__traceback__))


_HEADER_IDS = {b"x-request-id": "request_id", b"x-fc-request-id": "fc_request_id"}
_METADATA_IDS = ("job_id", "sample_id", "rollout_id", "attempt_id")
# The scope key of the request_id made for a request that brought none (OpenRLHF, slime and
# NeMo Gym send none): made when its first line is written, so a request that logs nothing
# costs nothing. This process's prefix and a count: unique across workers and restarts.
_MADE_ID = "rl_function.request_id"
_made_ids = itertools.count(1)
_id_prefix = secrets.token_hex(4)


def _fresh_prefix() -> None:  # a forked child counts on its own
    global _id_prefix
    _id_prefix = secrets.token_hex(4)


os.register_at_fork(after_in_child=_fresh_prefix)


def _ids(scope: MutableMapping[str, Any], input_data: BaseDataModel | None) -> dict[str, str]:
    """The request's ids, each cut to ID_LIMIT characters (before it is scrubbed, a margin
    past the cut with it: no secret the cut splits keeps a part) and escaped onto one line.
    A request without an id header gets a request_id made for it, the same on all its lines
    (kept in its scope, which they all share; not in an isolation process, whose lines
    have no scope: the worker's id would not be theirs)."""
    ids: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name in _HEADER_IDS:
            ids[_HEADER_IDS[name]] = _id(value.decode("latin-1"))
    if not ids and "type" in scope:
        made = scope.get(_MADE_ID)
        if made is None:  # setdefault: two threads logging at once keep the same one
            made = scope.setdefault(_MADE_ID, f"{_id_prefix}-{next(_made_ids)}")
        ids["request_id"] = made
    metadata = getattr(input_data, "request_metadata", None)
    if metadata is not None:
        for key in _METADATA_IDS:
            ids[key] = _id(str(getattr(metadata, key)))
    return ids


def _id(value: str) -> str:
    # one that is not cut is scrubbed with its line (and its field), as is all of the line
    return escape(value if len(value) <= ID_LIMIT else redact_head(value, ID_LIMIT, marker=MASK))


def _text(ids: dict[str, str]) -> str:
    return "".join(f" {key}={value}" for key, value in ids.items())
