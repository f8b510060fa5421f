"""The platform's HTTP transport: endpoints, headers, response envelopes, errors, retries.

One client for every call, with the key given (never a key captured elsewhere); a second,
bare client for the signed upload URL and the function instances, which must never see
the platform key. Responses come in the platform's envelopes: ``output`` or ``data``, a
``status`` object with a numeric ``code`` that overrides the HTTP status, ``success:
false``. Errors become one ``PlatformError`` line: what failed, HTTP status, platform code,
message, request id.

Retries (tenacity) cover only what cannot have been carried out: a connection that was
never made, and 429/503 (honouring ``Retry-After``), with backoff within a deadline. A
creating POST whose request went out and whose answer was lost is not repeated: it is
reported as an unclear outcome with what to check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from runtime.platform.scrub import scrub

__all__ = [
    "DEFAULT_BASE_URL",
    "ENDPOINT_VARIABLES",
    "Platform",
    "PlatformError",
    "RequestNotSent",
    "UnclearOutcome",
    "payload_of",
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


class _Retry(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def payload_of(body: dict[str, Any]) -> Any:
    """The useful part of a response: ``output``, else ``data``, else the whole body."""
    if body.get("output") is not None:
        return body["output"]
    if body.get("data") is not None:
        return body["data"]
    return body


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
        self._notify = notify or (lambda text: None)
        limits = httpx.Timeout(timeout, connect=min(timeout, 15.0))
        self._client = httpx.Client(headers=headers, timeout=limits)
        self._bare = httpx.Client(headers={"User-Agent": user_agent}, timeout=limits)

    def __enter__(self) -> Platform:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()
        self._bare.close()

    def url(self, endpoint: str, *segments: str) -> str:
        path, env = _ENDPOINTS[endpoint]
        base = (os.environ.get(env) if env else None) or self.base_url + path
        url = "/".join([base.rstrip("/"), *segments]) if segments else base
        if endpoint == "jobs":
            self._job_urls.add(url)
        return url

    def call(
        self,
        what: str,
        method: str,
        url: str,
        *,
        creates: bool | str = False,
        bare: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Send one request (retrying only what is safe) and return the checked JSON body."""
        return _checked(what, self.request(what, method, url, creates=creates, bare=bare, **kwargs))

    def request(
        self,
        what: str,
        method: str,
        url: str,
        *,
        creates: bool | str = False,
        bare: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request (retrying only what is safe) and return the response as it is."""
        client = self._bare if bare else self._client
        if not bare and url in self._job_urls and self._job_headers:
            kwargs["headers"] = {**self._job_headers, **(kwargs.get("headers") or {})}
        return self._send(what, client, method, url, creates, kwargs)

    def put_bytes(self, what: str, url: str, data: bytes) -> None:
        """PUT raw bytes to a signed URL: no platform key, no content type (as signed)."""
        response = self._send(what, self._bare, "PUT", url, False, {"content": data})
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
        client: httpx.Client,
        method: str,
        url: str,
        creates: bool | str,
        kwargs: dict[str, Any],
    ) -> httpx.Response:
        idempotent = method in ("GET", "PUT", "DELETE")
        # ``creates`` may say what to look for on the platform after an unclear outcome
        hint = creates if isinstance(creates, str) else "on the platform"

        def attempt() -> httpx.Response:
            try:
                response = client.request(method, url, **kwargs)
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
                if idempotent:
                    raise _Retry(f"{type(exc).__name__} from {_host(url)}") from exc
                if creates:
                    raise UnclearOutcome(
                        what,
                        f"the request was sent but no answer came ({type(exc).__name__}); it "
                        f"may have been carried out: check {hint} before running it again "
                        "(not retried, so that nothing is created twice)",
                    ) from exc
                raise PlatformError(
                    what, f"no answer from {_host(url)} ({type(exc).__name__})"
                ) from exc
            status = response.status_code
            if status in _BUSY or _body_code(response) in _BUSY:
                raise _Retry(
                    f"platform busy (HTTP {status})", _retry_after(response.headers)
                ) from None
            return response

        retrying = Retrying(
            retry=retry_if_exception_type(_Retry),
            stop=stop_after_delay(self._deadline),
            wait=_wait,
            before_sleep=self._announce,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Retry as exc:
            raise PlatformError(
                what, f"{exc.reason}; gave up after {self._deadline:g} s of retries"
            ) from None

    def _announce(self, state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        reason = failure.reason if isinstance(failure, _Retry) else "failed"
        wait = state.next_action.sleep if state.next_action else 0.0
        self._notify(f"{reason}, retry {state.attempt_number} in {wait:.0f} s")


_backoff = wait_exponential(multiplier=0.5, max=8.0) + wait_random(0, 0.5)


def _wait(state: RetryCallState) -> float:
    failure = state.outcome.exception() if state.outcome else None
    if isinstance(failure, _Retry) and failure.retry_after is not None:
        return min(failure.retry_after, 60.0)
    return _backoff(state)


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


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _body_code(response: httpx.Response) -> Any:
    body = _json(response) if "json" in response.headers.get("content-type", "") else None
    status = body.get("status") if isinstance(body, dict) else None
    return status.get("code") if isinstance(status, dict) else None


def _text_of(response: httpx.Response) -> str:
    return " ".join(response.text.split())[:300]


def _checked(what: str, response: httpx.Response) -> dict[str, Any]:
    body = _json(response)
    if not isinstance(body, dict):
        body_text = _text_of(response)
        if response.is_success:
            raise PlatformError(
                what,
                f"the answer is not a JSON object: {body_text[:120]!r}",
                status=response.status_code,
            )
        raise PlatformError(what, body_text or response.reason_phrase, status=response.status_code)
    request_id = body.get("request_id") or body.get("requestId") or body.get("RequestId")
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
