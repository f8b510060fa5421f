"""A client that calls a served reward function from a trainer's own process.

``RewardClient`` posts to the function's ``/api/v1`` over a pool of kept-alive connections,
with at most ``concurrency`` calls in flight, retries of 503 and 429 (waiting as long as
``Retry-After`` says) and of refused connections, and one deadline over the wait for a
free slot, all tries and the call. It never raises for a failed call: the result is
reward 0.0 with ``failed`` set and the reason, so one bad call cannot stop a training
run. Bodies are encoded with orjson: NaN and Infinity in dataset fields become null,
numpy values plain numbers, anything else its text.

Trainers call reward hooks from threads, from their own event loops, or from pools of
processes; ``shared_client(url)`` gives one client per URL and process, living on a
background event loop, usable from any of them (``score_sync`` or ``await score_async``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

__all__ = ["RewardClient", "RewardResult", "shared_client"]

log = logging.getLogger("processors_base.client")

URL_ENV = "AGENTIC_RL_REWARD_URL"
_RETRY_STATUS = (429, 503)
_JSON_HEADERS = {"content-type": "application/json"}
_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


@dataclass
class RewardResult:
    score: float
    metrics: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    reason: str | None = None  # why it failed: the error code and message, or the transport error


class RewardClient:
    """Async client of one served reward function (``url``: its base or its /api/v1)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        concurrency: int = 64,
        timeout: float = 100.0,
        max_retry_wait: float = 10.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url = url or os.environ.get(URL_ENV, "")
        if not url:
            raise ValueError(f"no reward function URL: pass url= or set {URL_ENV}")
        url = url.rstrip("/")
        self.url = url if url.endswith("/api/v1") else url + "/api/v1"
        self.timeout = timeout
        self.max_retry_wait = max_retry_wait
        self._concurrency = concurrency
        self._semaphore: asyncio.Semaphore | None = None
        self._http = httpx.AsyncClient(
            headers=dict(headers or {}),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            transport=transport,
        )
        # Metric names seen so far: every result carries them all (0.0 where it has none),
        # so that a trainer stacking per-sample metrics (verl) gets the same keys.
        self._metric_names: dict[str, None] = {}

    async def __aenter__(self) -> RewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def score(
        self,
        messages: list[dict[str, Any]],
        ground_truth: Any = None,
        *,
        extra: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> RewardResult:
        """Score one trajectory given as chat messages (``timeout``: this call's deadline)."""
        body = {
            "func_type": "reward",
            "ground_truth": ground_truth,
            "agent_output": {"messages": messages, "rollout_extra": extra},
        }
        return await self.call(body, timeout=timeout)

    async def call(self, body: dict[str, Any], *, timeout: float | None = None) -> RewardResult:
        """Post one RewardInput (as a dict); never raises for a failed call."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._concurrency)
        timeout = self.timeout if timeout is None else timeout
        late = f"DEADLINE_EXCEEDED: no answer within {timeout:g}s"
        deadline = time.monotonic() + timeout
        try:
            content = orjson.dumps(body, default=_plain, option=_ORJSON_OPTIONS)
        except TypeError as exc:  # a dict nested too deep, an int past 64 bits
            return self._failed(f"the request cannot be encoded: {exc}")
        tries = 0
        while True:
            tries += 1
            try:  # the wait for a free slot counts against the deadline too
                await asyncio.wait_for(self._semaphore.acquire(), deadline - time.monotonic())
            except asyncio.TimeoutError:  # not the builtin TimeoutError before 3.11
                return self._failed(f"{late} (waiting for one of {self._concurrency} slots)")
            try:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._failed(late)
                answer = await self._http.post(
                    self.url, content=content, headers=_JSON_HEADERS, timeout=left
                )
            except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
                wait = min(0.1 * 2**tries, 2.0)  # the server may be restarting: try again
                reason = f"{type(exc).__name__}: {exc}"
            except httpx.TimeoutException:
                return self._failed(late)
            except httpx.HTTPError as exc:
                return self._failed(f"{type(exc).__name__}: {exc}")
            else:
                if answer.status_code not in _RETRY_STATUS:
                    return self._read(answer)
                wait = _retry_after(answer.headers.get("retry-after"), tries)
                reason = f"HTTP {answer.status_code}: {_error(answer)}"
            finally:
                self._semaphore.release()
            wait = min(wait, self.max_retry_wait)
            if time.monotonic() + wait >= deadline:
                return self._failed(f"{reason} (gave up after {tries} tries)")
            await asyncio.sleep(wait)

    def _read(self, answer: httpx.Response) -> RewardResult:
        if answer.status_code != 200:
            return self._failed(f"HTTP {answer.status_code}: {_error(answer)}")
        try:
            data = answer.json()
            reward = data["reward"]
            score = float(reward["reward_score"])
            metrics = {k: float(v) for k, v in (reward.get("reward_metrics") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._failed("the answer is not a reward output")
        if not math.isfinite(score) or not all(map(math.isfinite, metrics.values())):
            return self._failed("the answer holds a non-finite number")
        self._metric_names.update(dict.fromkeys(metrics))
        metrics = {**dict.fromkeys(self._metric_names, 0.0), **metrics}
        if data.get("status") == "failed":  # the function said so itself: failed is 0.0
            reason = f"{data.get('error_code') or 'FAILED'}: {data.get('error')}"
            log.warning("reward call to %s failed, scoring 0.0: %s", self.url, reason)
            return RewardResult(0.0, metrics, True, reason)
        return RewardResult(score, metrics)

    def _failed(self, reason: str) -> RewardResult:
        log.warning("reward call to %s failed, scoring 0.0: %s", self.url, reason)
        return RewardResult(0.0, dict.fromkeys(self._metric_names, 0.0), True, reason)

    # --- from threads and other event loops -----------------------------------------

    def submit(
        self, messages: list[dict[str, Any]], ground_truth: Any = None, **kw: Any
    ) -> concurrent.futures.Future[RewardResult]:
        """Start scoring on the background loop, from any thread; a future of the result."""
        return _background().submit(self.score(messages, ground_truth, **kw))

    def score_sync(
        self, messages: list[dict[str, Any]], ground_truth: Any = None, **kw: Any
    ) -> RewardResult:
        """Score from any thread, blocking it until the result is in."""
        return self.submit(messages, ground_truth, **kw).result()

    async def score_async(
        self, messages: list[dict[str, Any]], ground_truth: Any = None, **kw: Any
    ) -> RewardResult:
        """Score from any event loop: the call runs on the background loop."""
        return await asyncio.wrap_future(self.submit(messages, ground_truth, **kw))


def _plain(value: Any) -> Any:
    """What orjson cannot encode: torch tensors as lists, anything else as its text."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


def _error(answer: httpx.Response) -> str:
    try:
        data = answer.json()
        return f"{data.get('error_code')}: {data.get('error')}"
    except (ValueError, AttributeError):
        return answer.text[:200]


def _retry_after(value: str | None, tries: int) -> float:
    """Seconds to wait: Retry-After as seconds or an HTTP date, else a backoff."""
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
            except (TypeError, ValueError):
                pass  # neither: back off as without one
    return min(0.1 * 2**tries, 2.0)


# --- one client per URL and process, on a background loop --------------------------------


class _Background:
    """An event loop on a daemon thread that runs the shared clients' calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        threading.Thread(target=self.loop.run_forever, name="reward-client", daemon=True).start()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_lock = threading.Lock()
_loop: _Background | None = None
_clients: dict[str, RewardClient] = {}


def _background() -> _Background:
    global _loop
    with _lock:
        if _loop is None or _loop.pid != os.getpid():  # a forked child needs its own thread
            _loop = _Background()
            _clients.clear()
        return _loop


def shared_client(url: str | None = None, **options: Any) -> RewardClient:
    """The process's client for ``url`` (default: $AGENTIC_RL_REWARD_URL), made once."""
    url = url or os.environ.get(URL_ENV, "")
    background = _background()
    with _lock:
        client = _clients.get(url)
        if client is None:
            # made on the background loop, where its connections will live
            client = background.submit(_make(url, options)).result()
            _clients[url] = client
        return client


async def _make(url: str, options: dict[str, Any]) -> RewardClient:
    return RewardClient(url, **options)
