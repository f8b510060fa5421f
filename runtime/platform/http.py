"""The platform's HTTP transport: endpoints, headers, response envelopes, errors, retries.

One client for every call, with the key given (never a key captured elsewhere); a second,
bare client for the signed upload URL and the function instances, which must never see
the platform key. Responses come in the platform's envelopes: ``output`` or ``data``, a
``status`` object with a numeric ``code`` that overrides the HTTP status, ``success:
false``. Errors become one ``PlatformError`` line: what failed, HTTP status, platform code,
message, request id.

Every answer is checked against the contract's model of it (``runtime.platform.answers``):
a malformed one is an error naming the call and the field. Each request, its answer read
whole, ends within the request timeout whatever the server does (httpx's timeouts are per
read, which a server sending a byte a second never trips), and an answer is not read past
16 MiB. A file sent as a body (``FileBody``: a dataset, a package) is read in chunks, never
whole, and each chunk that goes out gives the request its timeout anew: an upload of several
GB takes longer than any fixed limit, and one that stalls still ends.

Retries (tenacity) cover only what cannot have been carried out: a connection that was
never made, and 429/503 (honouring ``Retry-After``), with backoff within a deadline. A
creating POST whose request went out and whose answer was lost is not repeated: it is
reported as an unclear outcome with what to check (and so is one cut by Ctrl-C); one cut
before its file body was all sent cannot have been carried out, and is sent again from the
start of the file. A PUT of a file is sent again whole on a transport error or a 5xx, a few
times.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import quote

import anyio
import httpx
import orjson
from pydantic import ValidationError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from runtime.platform.answers import Answer, problems
from runtime.platform.scrub import scrub

__all__ = [
    "DEFAULT_BASE_URL",
    "ENDPOINT_VARIABLES",
    "MAX_ANSWER",
    "FileBody",
    "FileChanged",
    "Platform",
    "PlatformError",
    "RequestNotSent",
    "UnclearOutcome",
    "decode",
]

DEFAULT_BASE_URL = "https://dashscope.aliyuncs.com/api/v1"

# Endpoint paths, each replaceable by a full URL from its environment variable (as the SDK
# allows), read when the call is made.
_ENDPOINTS: dict[str, tuple[str, str | None]] = {
    "upload_url": ("/fine-tunes/generate/faas/upload/url", "FC_UPLOAD_OSS_API"),
    "layer_create": ("/fine-tunes/create/faas/layer", "FC_LAYER_CREATE_API"),
    "layer_status": ("/fine-tunes/query/faas/layer/status", "FC_LAYER_QUERY_API"),
    "register_rollout": ("/fine-tunes/create/rollout", "FC_REGISTER_ROLLOUT_API"),
    "register_reward": ("/fine-tunes/create/reward", "FC_REGISTER_REWARD_API"),
    "register_group_reward": ("/fine-tunes/create/group-reward", "FC_REGISTER_GROUP_REWARD_API"),
    "load": ("/fine-tunes/online/faas", "FC_LOAD_API"),
    "query": ("/fine-tunes/query/faas", "FC_QUERY_API"),
    "instance_logs": ("/fine-tunes/query/faas/log", "FC_QUERY_LOG_API"),
    "instance_delete": ("/fine-tunes/delete/faas", "FC_DELETE_API"),
    "files": ("/files", "BAILIAN_FILE_API"),
    "jobs": ("/fine-tunes", None),
}
ENDPOINT_VARIABLES = tuple(sorted(env for _, env in _ENDPOINTS.values() if env))
_BUSY = (429, 503)
_PUT_RETRIED = (429, 500, 502, 503, 504)  # a storage service's transient failures
_UPLOAD_TRIES = 5  # attempts at sending a file, each from its start
MAX_ANSWER = 16 * 1024 * 1024  # bytes of one answer, decoded
A = TypeVar("A", bound=Answer)
_WORKSPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class PlatformError(Exception):
    """One failed call, printable as one line; never carries the key."""

    def __init__(
        self,
        what: str,
        message: str,
        *,
        status: int | None = None,
        code: Any = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.what = what
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id

    def __str__(self) -> str:
        parts = [f"{self.what} failed:"]
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        if self.code not in (None, ""):
            parts.append(str(self.code))
        text = " ".join(parts) + (": " if len(parts) > 1 else " ") + self.message
        if self.request_id:
            text += f" (request id {self.request_id})"
        return scrub(text)  # the platform may echo the key back


class RequestNotSent(PlatformError):
    """The request could not be built or sent (a bad URL, a header that cannot be encoded):
    a local mistake, never retried, nothing reached the platform."""


class UnclearOutcome(PlatformError):
    """The request went out and no answer came: it may or may not have been carried out."""


class FileChanged(Exception):
    """A file being sent changed size, or could not be read, part-way: never sent cut."""


# While a request is sent: renews its deadline (see ``FileBody``)
_renew: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "_renew", default=None
)


FileStamp = tuple[int, int, int]  # size, modification time (ns), inode


def stamp(status: os.stat_result) -> FileStamp:
    """What tells a file's content changed (short of reading it again)."""
    return status.st_size, status.st_mtime_ns, status.st_ino


class FileBody:
    """A local file as a request body: a PUT's ``content`` (with its Content-Length), or the
    file of a multipart form (``files``), which httpx reads through ``seek``, ``tell`` and
    ``read``. It is read a chunk at a time from its start on every attempt, so memory does
    not grow with the file and a retry sends it whole. Its size is taken once: a file that
    changes size while it is sent fails the request (``FileChanged``) instead of going out
    cut. Each chunk read renews the request's timeout and is told to ``progress`` as the
    bytes sent so far (0 again on a retry)."""

    CHUNK = 1024 * 1024

    def __init__(
        self,
        path: Path,
        progress: Callable[[int], None] | None = None,
        checked: FileStamp | None = None,
    ) -> None:
        self.path = path
        # the file as it was checked (``stamp``), else as it is now: an in-place change of
        # the same size, or a file put in its place, is a change too
        self._stamp = checked or stamp(path.stat())
        self.size = self._stamp[0]
        self._progress = progress or (lambda sent: None)
        self._file: BinaryIO | None = None
        self._position = 0
        self._sent = 0  # read out in this attempt (each starts with a seek to 0)

    @property
    def complete(self) -> bool:
        """Whether this attempt read the whole file out (the request may have arrived)."""
        return self._sent >= self.size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        self._position = base + offset
        if self._file is not None:
            self._file.seek(self._position)
        if self._position == 0:
            self._sent = 0
            self._progress(0)
        return self._position

    def read(self, size: int = -1) -> bytes:
        left = self.size - self._position
        wanted = left if size < 0 else min(size, left)
        if wanted <= 0:
            return b""
        try:
            if self._file is None:
                self._file = self.path.open("rb")
                self._file.seek(self._position)
            chunk = self._file.read(wanted)
            now = stamp(os.fstat(self._file.fileno()))
        except OSError as exc:
            raise FileChanged(f"{self.path}: cannot read it: {exc.strerror}") from None
        ends = self._position + len(chunk) == self.size
        if len(chunk) < wanted or now[0] != self.size or (ends and now != self._stamp):
            raise FileChanged(
                f"{self.path} changed while it was being sent, or since it was checked "
                f"({self.size} bytes then, {now[0]} now, or written over in place): nothing "
                "was sent cut; send it again once it is written"
            )
        self._position += len(chunk)
        self._sent = max(self._sent, self._position)
        renew = _renew.get()
        if renew is not None:
            renew()
        self._progress(self._position)
        return chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # the reads block the loop briefly (a MiB from a local disk): nothing else runs on it
        self.seek(0)
        while chunk := self.read(self.CHUNK):
            yield chunk

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _Retry(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class Platform:
    """A session with the platform for one command."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        deadline: float = 120.0,
        timeout: float = 600.0,
        notify: Callable[[str], None] | None = None,
        user_agent: str = "agentic-rl-runtime",
        workspace: str | None = None,
    ) -> None:
        headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": user_agent,
        }
        if "{workspace_id}" in base_url and not workspace:
            raise PlatformError(
                "configuration",
                "the base URL has a {workspace_id} placeholder: pass --workspace-id or set "
                "DASHSCOPE_WORKSPACE_ID",
            )
        if workspace:
            if not _WORKSPACE.match(workspace):
                raise PlatformError("configuration", f"{workspace!r} is not a workspace id")
            base_url = base_url.replace("{workspace_id}", workspace)
        # the workspace header goes on the job calls only: the contract never sends it on
        # function and file calls (spec 1.2)
        self._job_headers = {"X-DashScope-WorkSpace": workspace} if workspace else {}
        self._job_urls: set[str] = set()
        self.base_url = base_url.rstrip("/")
        self._deadline = deadline
        self._timeout = timeout
        self._until: float | None = None  # see time_limit
        self._notify = notify or (lambda text: None)
        limits = httpx.Timeout(timeout, connect=min(timeout, 15.0))
        # async clients on a loop of our own, so that an exchange can be cut at its deadline
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(headers=headers, timeout=limits)
        self._bare = httpx.AsyncClient(headers={"User-Agent": user_agent}, timeout=limits)

    def __enter__(self) -> Platform:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._run(self._client.aclose())
            self._run(self._bare.aclose())
            self._loop.close()

    @contextlib.contextmanager
    def time_limit(self, seconds: float | None) -> Iterator[None]:
        """Every request inside ends within ``seconds`` from now, retries included (a
        wait's ``--timeout``): each one's timeout and retries are cut to the time left."""
        if seconds is None:
            yield
            return
        self._until = time.monotonic() + seconds
        try:
            yield
        finally:
            self._until = None

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        task = self._loop.create_task(coroutine)
        try:
            return self._loop.run_until_complete(task)
        except BaseException:
            if not task.done():  # interrupted (Ctrl-C): end the exchange, then go
                task.cancel()
                with contextlib.suppress(BaseException):
                    self._loop.run_until_complete(task)
            raise

    def url(self, endpoint: str, *segments: str) -> str:
        """The URL of ``endpoint``, with ``segments`` (ids) each one segment of its path,
        encoded: an id is never a path (``../files/file-1`` would name another resource,
        ``ft-1?x=1`` add a query); ``.``, ``..`` and an empty id are refused."""
        path, env = _ENDPOINTS[endpoint]
        base = (os.environ.get(env) if env else None) or self.base_url + path
        for segment in segments:
            if segment in ("", ".", ".."):
                raise RequestNotSent(
                    "naming what to ask for", f"{segment!r} is not an id (nothing was sent)"
                )
        encoded = [quote(segment, safe="") for segment in segments]
        url = "/".join([base.rstrip("/"), *encoded]) if segments else base
        if endpoint == "jobs":
            self._job_urls.add(url)
        return url

    def call(
        self,
        what: str,
        method: str,
        url: str,
        *,
        answer: type[A],
        creates: bool | str = False,
        bare: bool = False,
        upload: FileBody | None = None,
        **kwargs: Any,
    ) -> A:
        """Send one request (retrying only what is safe); its answer, checked against the
        contract's model of it (``what`` names the call in errors). ``upload``: the file
        body the request carries (in ``files`` or ``content``), if any."""
        response = self.request(
            what, method, url, creates=creates, bare=bare, upload=upload, **kwargs
        )
        return _parsed(what, f"{method} {httpx.URL(url).path}", response, answer)

    def request(
        self,
        what: str,
        method: str,
        url: str,
        *,
        creates: bool | str = False,
        bare: bool = False,
        upload: FileBody | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request (retrying only what is safe) and return the response as it is."""
        client = self._bare if bare else self._client
        if not bare and url in self._job_urls and self._job_headers:
            kwargs["headers"] = {**self._job_headers, **(kwargs.get("headers") or {})}
        return self._send(what, client, method, url, creates, kwargs, upload=upload)

    def put_bytes(self, what: str, url: str, data: bytes) -> None:
        """PUT raw bytes to a signed URL: no platform key, no content type (as signed)."""
        self._put(what, url, {"content": data}, None)

    def put_file(
        self, what: str, url: str, path: Path, *, progress: Callable[[int], None] | None = None
    ) -> None:
        """PUT a file to a signed URL, streamed from disk with its Content-Length; a
        transport error or a 5xx sends it again from its start, a few times."""
        body = FileBody(path, progress)
        try:
            headers = {"Content-Length": str(body.size)}  # not chunked: the exact size
            self._put(what, url, {"content": body, "headers": headers}, body)
        finally:
            body.close()

    def _put(self, what: str, url: str, kwargs: dict[str, Any], upload: FileBody | None) -> None:
        response = self._send(
            what, self._bare, "PUT", url, False, kwargs, upload=upload, retried=_PUT_RETRIED
        )
        if not response.is_success:
            raise PlatformError(
                what,
                _text_of(response) or response.reason_phrase,
                status=response.status_code,
                request_id=response.headers.get("x-oss-request-id"),
            )

    def _send(
        self,
        what: str,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        creates: bool | str,
        kwargs: dict[str, Any],
        *,
        upload: FileBody | None = None,
        retried: tuple[int, ...] = _BUSY,
    ) -> httpx.Response:
        idempotent = method in ("GET", "PUT", "DELETE")
        # ``creates`` may say what to look for on the platform after an unclear outcome
        hint = creates if isinstance(creates, str) else "on the platform"

        def attempt() -> httpx.Response:
            timeout = self._timeout
            if self._until is not None:
                timeout = min(timeout, self._until - time.monotonic())
                if timeout <= 0:
                    raise PlatformError(what, "not asked: the time given ran out")
            try:
                response = self._run(self._exchange(what, client, method, url, timeout, kwargs))
            except FileChanged as exc:
                raise PlatformError(what, str(exc)) from None
            except KeyboardInterrupt:
                if creates and not idempotent and (upload is None or upload.complete):
                    self._notify(
                        f"interrupted while {what}: the request may have reached the platform "
                        f"and been carried out: check {hint}"
                    )
                raise
            except (
                httpx.UnsupportedProtocol,
                httpx.InvalidURL,
                httpx.LocalProtocolError,
                UnicodeEncodeError,
            ) as exc:
                raise RequestNotSent(
                    what, f"not sent, {_host(url)}: {type(exc).__name__}: {exc}"
                ) from None
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                raise _Retry(f"cannot connect to {_host(url)} ({type(exc).__name__})") from exc
            except httpx.TransportError as exc:
                host, name = _host(url), type(exc).__name__
                failure = f"no answer from {host} ({name})"
                if isinstance(exc, httpx.TimeoutException):
                    failure = f"no complete answer from {host} within {timeout:.3g} s ({name})"
                if idempotent:
                    raise _Retry(failure) from exc
                if upload is not None and not upload.complete:
                    # cut before the whole file went out: the request never arrived
                    raise _Retry(f"{failure}, the file cut short: sent again") from exc
                if creates:
                    raise UnclearOutcome(
                        what,
                        f"the request was sent but {failure}; it may have been carried out: "
                        f"check {hint} before running it again (not retried, so that nothing "
                        "is created twice)",
                    ) from exc
                raise PlatformError(what, failure) from exc
            status = response.status_code
            if status in retried or _body_code(response) in _BUSY:
                busy = status in _BUSY or _body_code(response) in _BUSY
                reason = (
                    f"platform busy (HTTP {status})" if busy else f"HTTP {status} from {_host(url)}"
                )
                raise _Retry(reason, _retry_after(response.headers)) from None
            return response

        def before_sleep(state: RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome else None
            reason = failure.reason if isinstance(failure, _Retry) else "failed"
            wait = state.next_action.sleep if state.next_action else 0.0
            if self._until is not None and time.monotonic() + wait >= self._until:
                raise PlatformError(what, f"{reason}; no time left to try again")
            self._notify(f"{reason}, retry {state.attempt_number} in {wait:.0f} s")

        # an upload may take longer than the deadline: it is tried a number of times instead
        stop = (
            stop_after_delay(self._deadline)
            if upload is None
            else stop_after_attempt(_UPLOAD_TRIES)
        )
        retrying = Retrying(
            retry=retry_if_exception_type(_Retry),
            stop=stop,
            wait=_wait,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Retry as exc:
            given = (
                f"{self._deadline:g} s of retries" if upload is None else f"{_UPLOAD_TRIES} tries"
            )
            raise PlatformError(what, f"{exc.reason}; gave up after {given}") from None

    async def _exchange(
        self,
        what: str,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        timeout: float,
        kwargs: dict[str, Any],
    ) -> httpx.Response:
        """One request and its whole answer within ``timeout``; an answer over the size
        limit is not read further (its declared length is checked first)."""
        body = bytearray()
        # the latest the deadline may be pushed to by a file body (a wait's time limit)
        cap = (
            math.inf
            if self._until is None
            else anyio.current_time() + self._until - time.monotonic()
        )
        try:
            with anyio.fail_after(timeout) as scope:

                def renew() -> None:
                    scope.deadline = max(scope.deadline, min(anyio.current_time() + timeout, cap))

                _renew.set(renew)  # this task's own context: the body is read in it
                async with client.stream(method, url, **kwargs) as response:
                    length = response.headers.get("content-length", "")
                    if length.isdigit() and int(length) > MAX_ANSWER:
                        raise _too_large(what)
                    async for chunk in response.aiter_bytes():  # decoded: a gzip bomb too
                        body += chunk
                        if len(body) > MAX_ANSWER:
                            raise _too_large(what)
        except TimeoutError:
            raise httpx.ReadTimeout(f"no complete answer within {timeout:.3g} s") from None
        # the body is decoded already: its encoding and length headers no longer apply
        framing = ("content-encoding", "content-length", "transfer-encoding")
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in framing]
        return httpx.Response(
            response.status_code, headers=headers, content=bytes(body), request=response.request
        )


_backoff = wait_exponential(multiplier=0.5, max=8.0) + wait_random(0, 0.5)


def _wait(state: RetryCallState) -> float:
    failure = state.outcome.exception() if state.outcome else None
    if isinstance(failure, _Retry) and failure.retry_after is not None:
        return min(failure.retry_after, 60.0)
    return _backoff(state)


def _too_large(what: str) -> PlatformError:
    limit = f"{MAX_ANSWER / 2**20:g} MiB"
    return PlatformError(what, f"the answer is over the limit of {limit} (not read further)")


def _host(url: str) -> str:
    try:
        return httpx.URL(url).netloc.decode() or url
    except Exception:
        return url


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        import datetime as dt

        when = parsedate_to_datetime(value)
        return max(0.0, (when - dt.datetime.now(when.tzinfo)).total_seconds())
    except (TypeError, ValueError):
        return None


_MAX_NESTING = 64  # levels of an answer (the contract's are a few); printing one recurses


def decode(content: bytes) -> tuple[Any, str | None]:
    """The JSON value of an answer, or None and, when it is JSON, why it is refused: nested
    more than ``_MAX_NESTING`` levels (parsing, checking and printing recurse). Half an
    emoji (a lone surrogate, as a log line cut short carries) becomes U+FFFD, which can be
    printed; an integer past 64 bits is read as a float, as most JSON readers do."""
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            return None, f"nested more than {_MAX_NESTING} levels deep"
        if "surrogate" not in str(exc):
            return None, None
        try:  # json keeps a lone surrogate, which orjson refuses
            value = json.loads(content)
        except (ValueError, RecursionError):
            return None, None
        if nested_deeper(value, _MAX_NESTING):
            return None, f"nested more than {_MAX_NESTING} levels deep"
        text = json.dumps(value, ensure_ascii=False)
        try:
            value = orjson.loads(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
        except orjson.JSONDecodeError:  # NaN: JSON has no such number
            return None, None
    if nested_deeper(value, _MAX_NESTING):
        return None, f"nested more than {_MAX_NESTING} levels deep"
    return value, None


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels (a loop, not a
    recursion: that is what it guards)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth > limit:
                return True
            stack += [(child, depth + 1) for child in item]
    return False


def _json(response: httpx.Response) -> Any:
    return decode(response.content)[0]


def _body_code(response: httpx.Response) -> Any:
    body = _json(response) if "json" in response.headers.get("content-type", "") else None
    status = body.get("status") if isinstance(body, dict) else None
    return status.get("code") if isinstance(status, dict) else None


def _text_of(response: httpx.Response) -> str:
    return " ".join(response.text.split())[:300]


def _parsed(what: str, call: str, response: httpx.Response, model: type[A]) -> A:
    """The answer checked: a failure the platform reports is raised as one; an answer that
    does not fit ``model`` is an error naming ``call`` and the field (never its value)."""
    body = _checked(what, call, response)
    if model.envelope is None:
        where, payload = "", body
    elif body.get("output") is not None:
        where, payload = "output", body["output"]
    elif body.get("data") is not None:
        where, payload = "data", body["data"]
    else:  # no envelope: the fields at the top, as the SDK reads them
        where, payload = model.envelope, body
    if not isinstance(payload, dict):
        detail = f"{where}: not a JSON object"
    else:
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            detail = problems(exc, where)
    raise PlatformError(
        what, f"the answer to {call} is malformed: {detail}", request_id=_request_id(body)
    )


def _request_id(body: dict[str, Any]) -> str | None:
    found = body.get("request_id") or body.get("requestId") or body.get("RequestId")
    return str(found) if found else None


def _checked(what: str, call: str, response: httpx.Response) -> dict[str, Any]:
    body, problem = decode(response.content)
    if not isinstance(body, dict):
        body_text = _text_of(response)
        if response.is_success:
            why = problem or "not a JSON object"
            raise PlatformError(
                what, f"the answer to {call} is malformed: {why}: {body_text[:120]!r}"
            )
        raise PlatformError(what, body_text or response.reason_phrase, status=response.status_code)
    request_id = _request_id(body)
    status = body.get("status")
    message = body.get("message") or body.get("msg") or body.get("Message")
    if isinstance(status, dict) and isinstance(status.get("code"), int):
        # the platform's own status object overrides the HTTP status
        if status["code"] not in (0, 200):
            raise PlatformError(
                what,
                str(status.get("message") or message or "failed"),
                status=status["code"],
                code=body.get("code"),
                request_id=request_id,
            )
    elif not response.is_success:
        detail = message or body.get("detail") or response.reason_phrase
        raise PlatformError(
            what,
            str(detail),
            status=response.status_code,
            code=body.get("code"),
            request_id=request_id,
        )
    if body.get("success") is False:
        raise PlatformError(
            what,
            str(message or "the platform answered success: false"),
            status=response.status_code,
            code=body.get("code"),
            request_id=request_id,
        )
    return body
