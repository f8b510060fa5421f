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

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

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


_REQUESTS = ("rl_function_requests", "Requests to /api/v1 by function type and status code.")
_LATENCY = ("rl_function_request_duration_seconds", "Latency of /api/v1 requests.")


class _ApiCounts:
    """/api/v1's requests by status and latency histogram as plain numbers, written only by
    the event loop, and the collector that exposes them (one worker; with ``--workers``
    the requests go to prometheus-client's metrics instead)."""

    def __init__(self, func_type: str) -> None:
        self.func_type = func_type
        self.by_status: dict[int, int] = {}
        self.created: dict[int, float] = {}  # when each status was first counted (_created)
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
        requests = CounterMetricFamily(*_REQUESTS, labels=["func_type", "status"])
        for status, count in sorted(self.by_status.items()):
            requests.add_metric([self.func_type, str(status)], count, self.created[status])
        yield requests
        latency = HistogramMetricFamily(*_LATENCY, labels=["func_type"])
        cumulative, total = [], 0
        for bound, count in zip((*_BUCKETS, float("inf")), self.buckets, strict=True):
            total += count
            cumulative.append((floatToGoString(bound), total))
        latency.add_metric([self.func_type], cumulative, self.sum)
        labels = {"func_type": self.func_type}  # as prometheus-client's own histogram has it
        latency.samples.append(Sample(f"{_LATENCY[0]}_created", labels, self._since))
        yield latency


class Metrics:
    def __init__(self, func_type: str, gauges: Callable[[], tuple[int, int, int]]) -> None:
        self._gauges = gauges  # () -> (in flight, queued, stuck sync calls)
        multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry(auto_describe=True)
        if multiprocess:
            MultiProcessCollector(self.registry)
        # In multiprocess mode samples go to the shared files, not to a registry.
        owned = None if multiprocess else self.registry
        self._func_type = func_type
        self._api: _ApiCounts | None = None
        # --workers: prometheus-client's metrics, by status (children bound once)
        self._shared: dict[int, Any] = {}
        if multiprocess:
            self._requests = Counter(*_REQUESTS, ["func_type", "status"], registry=None)
            self._latency = Histogram(
                *_LATENCY, ["func_type"], buckets=_BUCKETS, registry=None
            ).labels(func_type)
        else:
            self._api = _ApiCounts(func_type)
            self.registry.register(self._api)
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

    def observe(self, status: int, seconds: float) -> None:
        """One /api/v1 request's answer (on the event loop)."""
        if self._api is not None:
            self._api.observe(status, seconds)
        else:
            child = self._shared.get(status)
            if child is None:
                child = self._shared[status] = self._requests.labels(self._func_type, str(status))
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
