"""The training platform's function registry, over HTTP (the contract is in the README).

    GET  {base}/api/v1/functions/{name}   -> 200 {"function": {...}, "request_id"} | 404
    POST {base}/api/v1/functions          -> 200/201 {"function": {...}, "request_id"}
    errors                                -> {"code", "message", "request_id"}

Every call carries ``Authorization: Bearer <api key>``. Only what is safe to repeat is
retried: connection errors, 429 and 503 (honouring ``Retry-After``), with exponential
backoff, all within one overall deadline. The api key never appears in a message.
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx

__all__ = ["PlatformClient", "PlatformError"]

_RETRY_STATUSES = (429, 503)


class PlatformError(Exception):
    def __init__(
        self,
        message: str,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.request_id = request_id

    def __str__(self) -> str:
        parts = [super().__str__()]
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.code:
            parts.append(f"code={self.code}")
        if self.request_id:
            parts.append(f"request_id={self.request_id}")
        return " ".join(parts)


class PlatformClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        deadline: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not api_key:
            raise PlatformError("no API key: pass --api-key or set DASHSCOPE_API_KEY")
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "agentic-rl-runtime"},
            timeout=httpx.Timeout(30.0, connect=10.0),
            transport=transport,
        )
        self._deadline = deadline

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def get_function(self, name: str) -> dict[str, Any] | None:
        response = self._request("GET", f"/api/v1/functions/{name}", allow_404=True)
        return None if response is None else response.get("function")

    def register(self, payload: dict[str, Any]) -> dict[str, Any]:
        response = self._request("POST", "/api/v1/functions", json=payload)
        assert response is not None
        return response

    def _request(
        self, method: str, path: str, *, allow_404: bool = False, json: Any = None
    ) -> dict[str, Any] | None:
        give_up_at = time.monotonic() + self._deadline
        attempt = 0
        while True:
            attempt += 1
            wait: float | None = None
            try:
                response = self._client.request(method, path, json=json)
            except httpx.TransportError as exc:
                failure = PlatformError(
                    f"cannot reach the platform at {self._client.base_url}: {type(exc).__name__}"
                )
            else:
                if response.status_code == 404 and allow_404:
                    return None
                if response.is_success:
                    return _json(response)
                failure = _error(response)
                if response.status_code not in _RETRY_STATUSES:
                    raise failure
                wait = _retry_after(response)
            backoff = wait if wait is not None else min(8.0, 0.25 * 2 ** (attempt - 1))
            backoff *= 1 + random.random() * 0.1
            if time.monotonic() + backoff > give_up_at:
                raise PlatformError(
                    f"{failure} (gave up after {attempt} attempts)",
                    failure.status,
                    failure.code,
                    failure.request_id,
                )
            time.sleep(backoff)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise PlatformError(
            "the platform answered with something that is not a JSON object", response.status_code
        )
    return body


def _error(response: httpx.Response) -> PlatformError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    request_id = body.get("request_id") or response.headers.get("x-request-id")
    message = body.get("message") or response.reason_phrase or "request failed"
    return PlatformError(
        f"platform error: {message}", response.status_code, body.get("code"), request_id
    )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
