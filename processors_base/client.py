"""A client that calls a served reward function from a trainer's own process.

``RewardClient`` posts to the function's ``/api/v1`` over a pool of kept-alive connections,
with at most ``concurrency`` calls in flight, retries of 503 and 429 (waiting as long as
``Retry-After`` says) and of refused connections, and one deadline over the wait for a
free slot, all tries and the call. A circuit breaker stops the retries of a server that is
down: after ``failure_threshold`` connection failures in a row every call fails at once
for ``cool_down`` seconds, then one call probes, and an answer closes the circuit. It never
raises for a failed call: the result is reward 0.0 with ``failed`` set and the reason, so
one bad call cannot stop a training run. Every result carries every metric name the
function declares (learnt from its ``/health`` once, when the server first answers) and
every one seen so far, 0.0 where it has none, for trainers that stack metrics by key
(verl). Bodies are encoded with orjson: NaN and Infinity in dataset fields become null,
numpy values plain numbers, anything else its text.

Trainers call reward hooks from threads, from their own event loops, or from pools of
processes; ``shared_client(url, **options)`` gives one client per URL, options and
process, living on a background event loop, usable from any of them (``score_sync`` or
``await score_async``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
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

from processors_base.redaction import CUT_MARGIN, Secrets, redact, redact_head

__all__ = ["RewardClient", "RewardResult", "shared_client"]

log = logging.getLogger("processors_base.client")


class _UrlsWithoutSecrets(logging.Filter):
    """httpx logs each request's URL at INFO (any client's in this process): here without
    its password or query, which may hold a token."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_secret_in(arg) for arg in args):
            record.args = tuple(_url_shown(a) if _secret_in(a) else a for a in args)
        return True


def _secret_in(value: Any) -> bool:
    return isinstance(value, httpx.URL) and bool(value.userinfo or value.query)


def _url_shown(url: Any) -> str:
    """An httpx.URL without user, password or query, which may hold a secret."""
    try:
        return str(url.copy_with(username=None, password=None, query=None, fragment=None))
    except Exception:  # a URL httpx took but cannot rebuild (too long): never fail a log line
        return "(the URL, left out)"


logging.getLogger("httpx").addFilter(_UrlsWithoutSecrets())

URL_ENV = "AGENTIC_RL_REWARD_URL"
_RETRY_STATUS = (429, 503)
_JSON_HEADERS = {"content-type": "application/json"}
# An answer is read as sent, up to MAX_ANSWER: a compressed one would be inflated before
# it could be measured (32 KB of zstd took 2 GB), on the event loop, past any deadline.
_IDENTITY = {"accept-encoding": "identity"}
_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


@dataclass
class RewardResult:
    score: float
    metrics: dict[str, float] = field(default_factory=dict)
    failed: bool = False
    reason: str | None = None  # why it failed: the error code and message, or the transport error


_LATER = 0.1  # seconds past a call's deadline that its answer may take, at most
_MIN_SECRET = 8  # characters: a shorter header or query value (a flag, "1") is not blanked
MAX_ANSWER = 16 * 1024 * 1024  # bytes of an answer read at most: a reward output is small
MAX_REASON = 2000  # characters of a failure's reason at most
NAMES_WAIT = 2.0  # seconds a call waits at most for /health's metric names
NAMES_TIMEOUT = 10.0  # seconds the GET of /health may take
MAX_NAMES = 1000  # declared metric names taken from /health at most


class RewardClient:
    """Async client of one served reward function (``url``: its base or its /api/v1).

    ``failure_threshold`` connection failures in a row open its circuit breaker: calls
    fail at once for ``cool_down`` seconds, then one call probes the server.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        concurrency: int = 64,
        timeout: float = 100.0,
        max_retry_wait: float = 10.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        failure_threshold: int = 5,
        cool_down: float = 10.0,
    ) -> None:
        url = url or os.environ.get(URL_ENV, "")
        if not url:
            raise ValueError(f"no reward function URL: pass url= or set {URL_ENV}")
        if not (isinstance(concurrency, int) and concurrency >= 1):
            raise ValueError(f"concurrency must be a whole number >= 1, not {concurrency!r}")
        if not _seconds(timeout):
            raise ValueError(f"timeout must be a number of seconds > 0, not {timeout!r}")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:  # its text may quote a password: not shown
            raise ValueError("the reward function URL is not a valid http(s) URL") from exc
        path = parsed.path.rstrip("/")  # the path only: a query (a token) stays after it
        self.url = str(
            parsed.copy_with(path=path if path.endswith("/api/v1") else path + "/api/v1")
        )
        # blanked from every failure's reason: the headers' values (an API key), the URL's
        # password and query values; credential shapes (Bearer ...) are blanked besides
        values = [_text(v) for v in (headers or {}).values()] + [parsed.password or ""]
        values += [value for _, value in parsed.params.multi_items()]
        parts = {part.strip() for v in values for part in (v, *v.split()[-1:])}  # Bearer's too
        self._secrets = Secrets(part for part in parts if len(part) >= _MIN_SECRET)
        self.timeout = timeout
        self.max_retry_wait = max_retry_wait
        self._concurrency = concurrency
        self._semaphore: asyncio.Semaphore | None = None
        self._http = httpx.AsyncClient(
            headers=dict(headers or {}),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            transport=transport,
        )
        # Metric names: every result carries them all (0.0 where it has none), so that a
        # trainer stacking per-sample metrics (verl) gets the same keys: those the function
        # declares, learnt from /health once the server first answers, and those seen.
        self._metric_names: dict[str, None] = {}
        self._health_url = _health_url(self.url)
        self._learnt = False
        self._learn_tries = 0  # GETs of /health that got no answer: given up after 3
        self._learning: asyncio.Task[None] | None = None  # the one GET /health under way
        self._circuit = _Circuit(
            _url_shown(httpx.URL(self.url)), max(1, failure_threshold), cool_down
        )

    @property
    def concurrency(self) -> int:
        """Calls in flight at once, at most."""
        return self._concurrency

    @property
    def circuit(self) -> str:
        """The circuit breaker's state: "closed", "open" or "half-open"."""
        return self._circuit.state

    async def __aenter__(self) -> RewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._learning is not None and not self._learning.done():
            self._learning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._learning
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
        timeout = self.timeout if timeout is None else timeout
        if not _seconds(timeout):
            return self._failed(f"timeout must be a number of seconds > 0, not {timeout!r}")
        deadline = time.monotonic() + float(timeout)
        try:
            answered, result = await self._call(body, timeout, deadline)
        except Exception as exc:  # a bug of ours, a closed loop: still a score, not a crash
            answered, result = False, self._failed(f"{type(exc).__name__}: {exc}")
        # the server is up (it answered this call, and no failure since): ask it its metric
        # names, once
        if answered and not self._learnt and self._circuit.state == "closed":
            await self._learn_names(deadline)
        if self._metric_names.keys() - result.metrics.keys():
            result.metrics = {**dict.fromkeys(self._metric_names, 0.0), **result.metrics}
        return result

    async def _learn_names(self, deadline: float) -> None:
        """The metric names /health declares, into ``_metric_names``: one GET shared by
        the calls waiting on it, each for at most ``NAMES_WAIT`` seconds of what is left of
        its deadline (one that gets no names goes on without; a later call pads with them).
        A server whose /health names none (an older one) is asked no more; one whose
        /health cannot be read is asked again at a later call, three times at most."""
        if self._learning is None or self._learning.done():
            self._learning = asyncio.ensure_future(self._get_names())
        left = min(deadline - time.monotonic(), NAMES_WAIT)
        if left > 0:
            with contextlib.suppress(asyncio.TimeoutError):  # not TimeoutError before 3.11
                await asyncio.wait_for(asyncio.shield(self._learning), left)

    async def _get_names(self) -> None:
        try:
            answer = await asyncio.wait_for(
                self._fetch("GET", self._health_url, NAMES_TIMEOUT), NAMES_TIMEOUT
            )
            data = orjson.loads(answer.body)
        except Exception as exc:  # unreachable, not JSON, nested too deep: no names this time
            self._learn_tries += 1
            self._learnt = self._learn_tries >= 3
            log.info(
                "reward server %s: /health not read (%s)", self._circuit.where, type(exc).__name__
            )
            return
        names = data.get("metrics") if isinstance(data, dict) else None
        if isinstance(names, list):
            declared = dict.fromkeys(n for n in names[:MAX_NAMES] if isinstance(n, str))
            self._metric_names = {**declared, **self._metric_names}
            self._learnt = True
        elif answer.status == 200:  # a server that declares none (an older one)
            self._learnt = True
        else:  # a proxy's 502 or 503 before the server: ask again later
            self._learn_tries += 1
            self._learnt = self._learn_tries >= 3

    async def _call(
        self, body: dict[str, Any], timeout: float, deadline: float
    ) -> tuple[bool, RewardResult]:
        """Whether the server answered (with any status), and the result."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._concurrency)
        late = f"DEADLINE_EXCEEDED: no answer within {timeout:g}s"
        answered = False
        try:
            content = orjson.dumps(body, default=_plain, option=_ORJSON_OPTIONS)
        except TypeError as exc:  # a dict nested too deep, an int past 64 bits
            return answered, self._failed(f"the request cannot be encoded: {exc}")
        circuit = self._circuit
        tries = 0
        probing = False  # this call is the half-open circuit's one probe
        try:
            while True:
                tries += 1
                admitted = circuit.admit()  # a probe tries once: it opens or closes the circuit
                if admitted is None:
                    return answered, self._failed(circuit.reason(), quiet=True)
                probing = admitted
                try:  # the wait for a free slot counts against the deadline too
                    await asyncio.wait_for(self._semaphore.acquire(), deadline - time.monotonic())
                except asyncio.TimeoutError:  # not the builtin TimeoutError before 3.11
                    return answered, self._failed(
                        f"{late} (waiting for one of {self._concurrency} slots)"
                    )
                try:
                    if not probing and circuit.state != "closed":  # it opened while we waited
                        return answered, self._failed(circuit.reason(), quiet=True)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return answered, self._failed(late)
                    # The deadline bounds the whole answer: httpx's timeout bounds each read
                    # only (an answer sent a byte at a time outlasts it). A hair later than
                    # httpx's, so that a connect timeout is seen as one (the circuit counts it).
                    answer = await asyncio.wait_for(
                        self._fetch("POST", self.url, left, content), left + _LATER
                    )
                except _Cut as exc:  # answered, then cut: the server is up, and may have scored it
                    circuit.answered()
                    return True, self._failed(f"the answer was cut: {exc}")
                except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
                    reason = redact(f"{type(exc).__name__}: {exc}", self._secrets)
                    closed = circuit.connection_failed(reason, probe=probing)
                    probing = False
                    if not closed:  # open: no retry would reach it
                        return answered, self._failed(circuit.reason(), quiet=True)
                    wait = min(0.1 * 2**tries, 2.0)  # the server may be restarting: try again
                except httpx.ConnectTimeout as exc:  # no handshake at all: a host that drops
                    reason = redact(f"ConnectTimeout: {exc}", self._secrets)
                    circuit.connection_failed(reason, probe=probing)
                    probing = False
                    return answered, self._failed(late)
                except (httpx.TimeoutException, asyncio.TimeoutError):
                    return answered, self._failed(late)
                except httpx.HTTPError as exc:
                    return answered, self._failed(f"{type(exc).__name__}: {exc}")
                else:
                    probing = False
                    answered = True
                    circuit.answered()  # even a 503: the server is up
                    if answer.status not in _RETRY_STATUS:
                        return answered, self._read(answer)
                    wait = _retry_after(answer.retry_after, tries)
                    reason = f"HTTP {answer.status}: {_error(answer.body)}"
                finally:
                    self._semaphore.release()
                wait = min(wait, self.max_retry_wait)
                if time.monotonic() + wait >= deadline:
                    return answered, self._failed(f"{reason} (gave up after {tries} tries)")
                if await circuit.opens_within(wait):  # stop retrying a server that is down
                    return answered, self._failed(circuit.reason(), quiet=True)
        finally:
            if probing:  # ended before its try (cancelled, its deadline): the next call probes
                circuit.probe_abandoned()

    async def _fetch(
        self, method: str, url: str, timeout: float, content: bytes | None = None
    ) -> _Answer:
        """One exchange, its answer read whole up to MAX_ANSWER bytes (_Cut, once its
        headers are in: the connection broke, or the answer is larger or compressed)."""
        headers = {**_IDENTITY, **_JSON_HEADERS} if content is not None else _IDENTITY
        request = self._http.build_request(
            method, url, content=content, headers=headers, timeout=timeout
        )
        answer = await self._http.send(request, stream=True)
        try:
            encoding = answer.headers.get("content-encoding", "identity").strip().lower()
            if encoding != "identity":
                raise _Cut(f"it is compressed ({encoding[:40]}), which this client never asks")
            body = bytearray()
            async for chunk in answer.aiter_raw():
                body += chunk
                if len(body) > MAX_ANSWER:
                    raise _Cut(f"it is larger than {MAX_ANSWER} bytes, read no further")
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as exc:
            raise _Cut(f"{type(exc).__name__}: {exc}") from exc
        finally:
            await answer.aclose()
        return _Answer(answer.status_code, answer.headers.get("retry-after"), bytes(body))

    def _read(self, answer: _Answer) -> RewardResult:
        if answer.status != 200:
            return self._failed(f"HTTP {answer.status}: {_error(answer.body)}")
        try:
            data = orjson.loads(answer.body)
            reward = data["reward"]
            score = float(reward["reward_score"])
            metrics = {k: float(v) for k, v in (reward.get("reward_metrics") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            return self._failed("the answer is not a reward output")
        if not math.isfinite(score) or not all(map(math.isfinite, metrics.values())):
            return self._failed("the answer holds a non-finite number")
        self._metric_names.update(dict.fromkeys(metrics))  # call() adds the others, as 0.0
        if data.get("status") == "failed":  # the function said so itself: failed is 0.0
            reason = redact_head(
                f"{data.get('error_code') or 'FAILED'}: {data.get('error')}",
                MAX_REASON,
                self._secrets,
            )
            log.warning("reward call to %s failed, scoring 0.0: %s", self._circuit.where, reason)
            return RewardResult(0.0, metrics, True, reason)
        return RewardResult(score, metrics)

    def _failed(self, reason: str, *, quiet: bool = False) -> RewardResult:
        # a header's value quoted by an httpx error, a key in a proxy's error page: blanked;
        # a whole error body (megabytes) cut
        reason = redact_head(reason, MAX_REASON, self._secrets)
        if not quiet:  # the circuit breaker's failures: logged once per state change instead
            log.warning("reward call to %s failed, scoring 0.0: %s", self._circuit.where, reason)
        return RewardResult(0.0, {}, True, reason)  # call() adds every metric name, as 0.0

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


class _Circuit:
    """A circuit breaker over one client's connection failures (all on the client's loop).

    closed: calls try (and retry). ``threshold`` connection failures in a row (refused,
    reset or cut before any answer) open it: calls fail at once, and calls waiting to retry
    stop, for ``cool_down`` seconds; then the next call probes (half-open) while the others
    keep failing fast. Any answer closes it; the probe's connection failure reopens it.
    """

    def __init__(self, where: str, threshold: int, cool_down: float) -> None:
        self.where = where  # the URL without credentials or query: what the logs name
        self.threshold = threshold
        self.cool_down = cool_down
        self.state = "closed"
        self.failures = 0  # connection failures in a row
        self.last = ""  # the last one's reason
        self.probe_at = 0.0  # open: when (time.monotonic) the next call may probe
        self.opened: asyncio.Event | None = None  # set while open: wakes the retrying calls

    def admit(self) -> bool | None:
        """Whether a call may try: None to fail fast, True as the probe, False normally."""
        if self.state == "closed":
            return False
        if self.state == "open" and time.monotonic() >= self.probe_at:
            self.state = "half-open"
            log.info("reward server %s: circuit half-open, one call probes", self.where)
            return True
        return None

    def reason(self) -> str:
        """Why a call fails fast (while the circuit is not closed)."""
        if self.state == "half-open":
            when = "a probe is under way"
        else:
            when = f"the next probe in {max(0.0, self.probe_at - time.monotonic()):.1f}s"
        return (
            f"UNREACHABLE: the reward server is unreachable ({self.failures} connection"
            f" failures in a row, the last: {self.last}); {when}"
        )

    def connection_failed(self, reason: str, *, probe: bool) -> bool:
        """Count a connection failure; whether the circuit is still closed (retry it)."""
        self.failures += 1
        self.last = reason
        if self.state == "closed" and self.failures == 1:
            log.warning("reward server %s: cannot connect (%s)", self.where, reason)
        if (probe and self.state == "half-open") or (
            self.state == "closed" and self.failures >= self.threshold
        ):
            self._open(again=probe)
        return self.state == "closed"

    def answered(self) -> None:
        self.failures = 0
        if self.state != "closed":
            self.state = "closed"
            self.opened = None
            log.info("reward server %s answers again: circuit closed", self.where)

    def probe_abandoned(self) -> None:
        if self.state == "half-open":  # open again, the cool-down over: the next call probes
            self.state = "open"
            log.info(
                "reward server %s: the probe ended unanswered, the next call probes", self.where
            )

    async def opens_within(self, seconds: float) -> bool:
        """Waits ``seconds``, or less if the circuit opens meanwhile; whether it is open."""
        if self.state != "closed":
            return True
        if self.opened is None:
            self.opened = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):  # not TimeoutError before 3.11
            await asyncio.wait_for(self.opened.wait(), seconds)
        return self.state != "closed"

    def _open(self, *, again: bool) -> None:
        self.state = "open"
        self.probe_at = time.monotonic() + self.cool_down
        if self.opened is not None:
            self.opened.set()
        log.warning(
            "reward server %s: %s: circuit open, calls fail at once for %gs, then one probes",
            self.where,
            f"the probe failed ({self.last})"
            if again
            else f"{self.failures} connection failures in a row (the last: {self.last})",
            self.cool_down,
        )


def _health_url(url: str) -> str:
    """The server's /health, beside its /api/v1 (``url``)."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(path=parsed.path.removesuffix("/api/v1") + "/health"))


def _plain(value: Any) -> Any:
    """What orjson cannot encode: torch tensors as lists, anything else as its text."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


@dataclass
class _Answer:
    status: int
    retry_after: str | None
    body: bytes


class _Cut(Exception):
    """Once an answer's headers were in: the connection broke, or it is too large or
    compressed."""


def _seconds(value: Any) -> bool:
    """Whether ``value`` is a deadline: a finite number of seconds above 0 (numpy's too)."""
    try:
        return 0 < float(value) < math.inf
    except (TypeError, ValueError):
        return False


def _text(value: str | bytes) -> str:
    """A header value as text (httpx takes bytes too)."""
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def _error(body: bytes) -> str:
    """An error answer's code and message; else its text (cut, once blanked, by _failed)."""
    try:
        data = orjson.loads(body)
        return f"{data.get('error_code')}: {data.get('error')}"
    except (ValueError, AttributeError):
        return body[: 2 * MAX_REASON + 4 * CUT_MARGIN].decode(errors="replace")


def _retry_after(value: str | None, tries: int) -> float:
    """Seconds to wait: Retry-After as seconds or an HTTP date in the future, else (none,
    0, a past date, garbage: a retry at once, which a storm of calls would repeat) a
    backoff."""
    seconds = math.nan
    if value:
        try:
            seconds = float(value)
        except ValueError:
            with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    return seconds if 0 < seconds < math.inf else min(0.1 * 2**tries, 2.0)


# --- one client per URL and process, on a background loop --------------------------------


class _Background:
    """An event loop on a daemon thread that runs the shared clients' calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="reward-client", daemon=True).start()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_lock = threading.Lock()
_loop: _Background | None = None
_clients: dict[str, RewardClient] = {}
MANY_CLIENTS = 64  # shared clients in one process past which a warning says why


def _forget_in_child() -> None:
    """A forked child (AReaL's pool of reward processes) has no background thread, and a
    lock that another thread held at the fork stays held there forever: start afresh."""
    global _lock, _loop
    _lock = threading.Lock()
    _loop = None
    _clients.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forget_in_child)


def _background() -> _Background:
    global _loop
    with _lock:
        if _loop is None:
            _loop = _Background()
        return _loop


def shared_client(url: str | None = None, **options: Any) -> RewardClient:
    """The process's client for ``url`` (default: $AGENTIC_RL_REWARD_URL) and ``options``,
    made once."""
    url = url or os.environ.get(URL_ENV, "")
    key = _key(url, options)  # other options (a deadline, headers): another client
    background = _background()
    with _lock:
        client = _clients.get(key)
        if client is None:
            # made on the background loop, where its connections will live
            client = background.submit(_make(url, options)).result()
            _clients[key] = client
            if len(_clients) == MANY_CLIENTS:  # each keeps its connections: say it, once
                log.warning(
                    "%d reward clients in this process, one for each URL and options: make "
                    "a hook once, not per step (an option that changes at each step, such "
                    "as a refreshed token, makes a new client each time)",
                    MANY_CLIENTS,
                )
        return client


def _key(url: str, options: dict[str, Any]) -> str:
    """The shared client's key: the URL and every option, headers by their real values
    (httpx.Headers' repr hides an Authorization's)."""
    shown = dict(options)
    if shown.get("headers") is not None:
        shown["headers"] = sorted(
            (_text(k).lower(), _text(v)) for k, v in httpx.Headers(shown["headers"]).raw
        )
    return f"{url}\0{sorted(shown.items())!r}"


async def _make(url: str, options: dict[str, Any]) -> RewardClient:
    return RewardClient(url, **options)
