"""A small HTTP/1.1 keep-alive load generator that records each response's status and
latency (wrk reports latency over all responses; the overload scenario needs the
latency of accepted requests alone). Clients back off briefly on a 503, as the
platform's retrying clients do.

    python benchmarks/loadgen.py URL BODY_FILE CONNECTIONS SECONDS [RATE [WARMUP]]
        -> JSON on stdout: [status, latency, answered] of each request (seconds; answered:
           since the load began); status -1 for a connection lost or a malformed answer

With RATE (requests per second over all connections) the load is open-loop: request i
is due at ``start + i / RATE`` and its latency counts from when it was due if every
connection was still busy then (no coordinated omission), else from when it was sent.
With WARMUP, the latencies of the requests due in its first seconds are not recorded
(those that waited for their connection to open: thousands open over seconds); a
failure is recorded whenever it happens.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

Result = tuple[int, float, float]  # status, latency, answered (seconds since the start)


def _request(path: str, host: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    """Send one request and read its whole answer; its status."""
    writer.write(request)
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


# a connection refused or lost, or an answer that is not HTTP: one failure, that connection ends
_FAILED = (OSError, asyncio.IncompleteReadError, ValueError, IndexError)


async def _connection(
    host: str, port: int, request: bytes, start: float, until: float, results: list[Result]
) -> None:
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        while time.monotonic() < until:
            started = time.perf_counter()
            status = await _exchange(reader, writer, request)
            answered = time.perf_counter()
            results.append((status, answered - started, answered - start))
            if status == 503:
                await asyncio.sleep(0.05)
    except _FAILED:
        results.append((-1, 0.0, time.perf_counter() - start))
    finally:
        if writer is not None:
            writer.close()


class _Schedule:
    """Hands out the due times of an open-loop load at ``rate`` requests per second."""

    def __init__(self, rate: float, seconds: float, warmup: float = 0.0) -> None:
        self.start = time.perf_counter()
        self._interval = 1.0 / rate
        self._count = int(rate * seconds)
        self._next = 0
        self.recorded_from = self.start + warmup  # latencies of requests due earlier: unrecorded

    def take(self) -> float | None:
        if self._next >= self._count:
            return None
        due = self.start + self._next * self._interval
        self._next += 1
        return due


async def _paced_connection(
    host: str, port: int, request: bytes, schedule: _Schedule, results: list[Result]
) -> None:
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        while (due := schedule.take()) is not None:
            free = time.perf_counter()
            if due > free:
                await asyncio.sleep(due - free)
                started = time.perf_counter()  # on time: our timer's lateness is not latency
            else:
                started = due  # it waited for a connection: that wait is latency
            status = await _exchange(reader, writer, request)
            answered = time.perf_counter()
            if due >= schedule.recorded_from or status != 200:
                results.append((status, answered - started, answered - schedule.start))
    except _FAILED:
        results.append((-1, 0.0, time.perf_counter() - schedule.start))
    finally:
        if writer is not None:
            writer.close()


async def run(
    url: str,
    body: bytes,
    connections: int,
    seconds: float,
    rate: float | None = None,
    warmup: float = 0.0,
) -> list[Result]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = _request(parts.path, host, body)
    results: list[Result] = []
    if rate:
        schedule = _Schedule(rate, seconds, warmup)
        clients = [
            _paced_connection(host, port, request, schedule, results) for _ in range(connections)
        ]
    else:
        start = time.perf_counter()
        until = time.monotonic() + seconds
        clients = [
            _connection(host, port, request, start, until, results) for _ in range(connections)
        ]
    await asyncio.gather(*clients)
    return results


def main() -> None:
    url, body_file, connections, seconds = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    rate = float(sys.argv[5]) if len(sys.argv) > 5 else None
    warmup = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    body = Path(body_file).read_bytes()
    results = asyncio.run(run(url, body, connections, seconds, rate, warmup))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
