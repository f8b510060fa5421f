"""``GET /metrics``: Prometheus text format, from prometheus-client.

With ``--workers`` > 1 the supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` before spawning
workers, so each worker writes its samples to shared files and any worker's /metrics
answers for all of them. Each app has its own registry: nothing global is shared.

In one worker the request path pays two additions to plain numbers (``_ApiCounts``:
requests by status, the latency histogram), read by a collector when scraped;
prometheus-client's own counter and histogram take a lock for each of their several
increments, about 1.7 us a request (a tenth of the app's time on the echo reward). With
``--workers`` each request goes to prometheus-client's metrics, so that the shared files
are exact whichever worker is scraped. The gauges (in flight, queued, stuck) are read from the
admission state when scraped and once a second, never updated per request.

Results are counted by route, function status and error code (``rl_function_results``):
one per /api/v1 answer, one per trainer-protocol sample. Its label values are bounded:
an error code that is not the runtime's own (one a function chose for its failed result)
is counted as ``OTHER``. Each label set's child is made once and kept.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from processors_base.rewards import SUB_REWARD_ERROR
from runtime import errors

__all__ = ["CONTENT_TYPE_LATEST", "OTHER", "UNKNOWN_PATH", "Metrics", "code_label"]

_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
)


_REQUESTS = (
    "rl_function_requests",
    "Requests to /api/v1 by function type and status code, and the answers to requests no "
    'route serves (404, 405) by path: the route\'s, or "unknown".',
)
_REQUEST_LABELS = ("func_type", "path", "status")
UNKNOWN_PATH = "unknown"  # the path label of a path no route has: never the path itself
_LATENCY = ("rl_function_request_duration_seconds", "Latency of /api/v1 requests.")
_RESULTS = (
    "rl_function_results",
    "Results by route (/api/v1, or the trainer protocol: one per sample), function status "
    "(success, failed) and error code (OTHER: a code of the function's own).",
)
# alphabetical: the order the multiprocess files give them back in, so both read the same
_RESULT_LABELS = ("error_code", "route", "status")
_API_ROUTE = "/api/v1"
OTHER = "OTHER"
_OWN_CODES = frozenset(
    {v for k, v in vars(errors).items() if k.isupper() and isinstance(v, str)} | {SUB_REWARD_ERROR}
)


def code_label(code: str) -> str:
    """An error code as a label value: the runtime's own codes as they are, any other (the
    function's own, unbounded text) as ``OTHER``."""
    return code if code in _OWN_CODES else OTHER


class _Count:
    """A counter child as a plain number: written only by the event loop, read when scraped."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()

    def inc(self) -> None:
        self.value += 1


class _ResultCounts:
    """The collector of the results' plain counts (one worker)."""

    def __init__(self) -> None:
        self.children: dict[tuple[str, str], _Count] = {}  # (route, error code label)

    def collect(self) -> Iterator[Metric]:
        results = CounterMetricFamily(*_RESULTS, labels=_RESULT_LABELS)
        for (route, code), child in sorted(self.children.items()):
            status = "failed" if code else "success"
            results.add_metric([code, route, status], child.value, child.created)
        yield results


class _ApiCounts:
    """/api/v1's requests by status and latency histogram as plain numbers, written only by
    the event loop, and the collector that exposes them (one worker; with ``--workers``
    the requests go to prometheus-client's metrics instead)."""

    def __init__(self, func_type: str) -> None:
        self.func_type = func_type
        self.by_status: dict[int, int] = {}
        self.created: dict[int, float] = {}  # when each status was first counted (_created)
        # answers no route served (404, 405): (path label, status) -> [count, created]
        self.unrouted: dict[tuple[str, int], list[float]] = {}
        self.buckets = [0] * (len(_BUCKETS) + 1)  # per bucket, not cumulative; last: +Inf
        self.sum = 0.0
        self._since = time.time()

    def observe(self, status: int, seconds: float) -> None:
        count = self.by_status.get(status)
        if count is None:
            count = 0
            self.created[status] = time.time()
        self.by_status[status] = count + 1
        self.buckets[bisect_left(_BUCKETS, seconds)] += 1  # a bucket: values <= its bound
        self.sum += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(*_REQUESTS, labels=_REQUEST_LABELS)
        for status, count in sorted(self.by_status.items()):
            labels = [self.func_type, _API_ROUTE, str(status)]
            requests.add_metric(labels, count, self.created[status])
        for (path, status), (hits, created) in sorted(self.unrouted.items()):
            requests.add_metric([self.func_type, path, str(status)], hits, created)
        yield requests
        latency = HistogramMetricFamily(*_LATENCY, labels=["func_type"])
        cumulative, total = [], 0
        for bound, count in zip((*_BUCKETS, float("inf")), self.buckets, strict=True):
            total += count
            cumulative.append((floatToGoString(bound), total))
        latency.add_metric([self.func_type], cumulative, self.sum)
        own = {"func_type": self.func_type}  # as prometheus-client's own histogram has it
        latency.samples.append(Sample(f"{_LATENCY[0]}_created", own, self._since))
        yield latency


class _SharedFiles(MultiProcessCollector):
    """The --workers' shared metric files, read at each scrape and never at registration:
    the registry (auto_describe) would read them then, and a file another worker has just
    created, still empty, is an error there (the starting worker died of it)."""

    def describe(self) -> list[Metric]:
        return []


class Metrics:
    def __init__(self, func_type: str, gauges: Callable[[], tuple[int, int, int]]) -> None:
        self._gauges = gauges  # () -> (in flight, queued, stuck sync calls)
        multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry(auto_describe=True)
        if multiprocess:
            _SharedFiles(self.registry)
        # In multiprocess mode samples go to the shared files, not to a registry.
        owned = None if multiprocess else self.registry
        self._func_type = func_type
        self._api: _ApiCounts | None = None
        # --workers: prometheus-client's metrics, by status (children bound once)
        self._shared: dict[int, Any] = {}
        self._results: dict[tuple[str, str], Any]  # (route, error code label) -> its child
        if multiprocess:
            self._requests = Counter(*_REQUESTS, _REQUEST_LABELS, registry=None)
            self._latency = Histogram(
                *_LATENCY, ["func_type"], buckets=_BUCKETS, registry=None
            ).labels(func_type)
            self._results_counter = Counter(*_RESULTS, _RESULT_LABELS, registry=None)
            self._results = {}
        else:
            self._api = _ApiCounts(func_type)
            self.registry.register(self._api)
            counts = _ResultCounts()
            self.registry.register(counts)
            self._results = counts.children
        self._multiprocess = multiprocess
        self._api_success = self._result_child(_API_ROUTE, "")
        self.rejected = Counter(
            "rl_function_rejected",
            "Requests answered 503 because slots and queue were full.",
            registry=owned,
        )
        self.timeouts = Counter(
            "rl_function_timeouts", "Requests answered 504 (deadline exceeded).", registry=owned
        )
        self.processor_errors = Counter(
            "rl_function_processor_errors",
            "Requests whose processor raised or returned a wrong output (500).",
            registry=owned,
        )
        self._in_flight = Gauge(
            "rl_function_requests_in_flight",
            "Requests being processed.",
            multiprocess_mode="livesum",
            registry=owned,
        )
        self._queued = Gauge(
            "rl_function_requests_queued",
            "Admitted requests waiting for a slot.",
            multiprocess_mode="livesum",
            registry=owned,
        )
        self._stuck = Gauge(
            "rl_function_stuck_sync_calls",
            "Sync calls still running in threads after their "
            "request ended (threads cannot be killed; see --isolation process).",
            multiprocess_mode="livesum",
            registry=owned,
        )
        self._sub_reward_failures = Counter(
            "rl_function_sub_reward_failures",
            "Sub-rewards that raised or returned a failed or non-finite result.",
            ["sub_reward"],
            registry=owned,
        )
        self._protocol_rejections = Counter(
            "rl_function_protocol_rejections",
            "Connections and requests refused by the HTTP layer before the app (too many "
            "connections, headers too large or too slow, not valid HTTP) by status and code.",
            ["status", "code"],
            registry=owned,
        )

    def observe(self, status: int, seconds: float, code: str = "") -> None:
        """One /api/v1 request's answer (on the event loop); ``code``: its error code, also
        of a 200 whose result is failed ("" for a success)."""
        if status == 200 and not code:
            self._api_success.inc()
        else:
            self.result(_API_ROUTE, code or OTHER)
        if self._api is not None:
            self._api.observe(status, seconds)
        else:
            child = self._shared.get(status)
            if child is None:
                child = self._shared[status] = self._requests.labels(
                    self._func_type, _API_ROUTE, str(status)
                )
            child.inc()
            self._latency.observe(seconds)
        if status == 200:
            return
        if status == 503:
            self.rejected.inc()
        elif status == 504:
            self.timeouts.inc()
        elif status == 500:
            self.processor_errors.inc()

    def unrouted(self, path: str, status: int) -> None:
        """An answer to a request no route served (404, 405); ``path``: the route's path, or
        UNKNOWN_PATH (label values stay bounded)."""
        if self._api is None:
            self._requests.labels(self._func_type, path, str(status)).inc()
            return
        counted = self._api.unrouted.get((path, status))
        if counted is None:
            self._api.unrouted[(path, status)] = [1, time.time()]
        else:
            counted[0] += 1

    def result(self, route: str, code: str) -> None:
        """One result on ``route`` (on the event loop): a success if ``code`` is "", else a
        failure with that error code."""
        self._result_child(route, code_label(code) if code else "").inc()

    def _result_child(self, route: str, label: str) -> Any:
        child = self._results.get((route, label))
        if child is None:
            if self._multiprocess:
                status = "failed" if label else "success"
                child = self._results_counter.labels(label, route, status)
            else:
                child = _Count()
            self._results[(route, label)] = child
        return child

    def protocol_rejected(self, status: int, code: str) -> None:
        self._protocol_rejections.labels(str(status), code).inc()

    def sub_reward_failed(self, name: str) -> None:
        self._sub_reward_failures.labels(name).inc()

    def refresh(self) -> None:
        in_flight, queued, stuck = self._gauges()
        self._in_flight.set(in_flight)
        self._queued.set(queued)
        self._stuck.set(stuck)

    def exposition(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)
