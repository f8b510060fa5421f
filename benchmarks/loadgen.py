"""A small HTTP/1.1 keep-alive load generator that records each response's status and
latency (wrk reports latency over all responses; the overload scenario needs the
latency of accepted requests alone). Clients back off briefly on a 503, as the
platform's retrying clients do.

    python benchmarks/loadgen.py URL BODY_FILE CONNECTIONS SECONDS  -> JSON on stdout
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit


async def _connection(
    host: str, port: int, path: str, body: bytes, until: float, results: list[tuple[int, float]]
) -> None:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.monotonic() < until:
            started = time.perf_counter()
            writer.write(request)
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            results.append((status, time.perf_counter() - started))
            if status == 503:
                await asyncio.sleep(0.05)
    except (ConnectionError, asyncio.IncompleteReadError):
        results.append((-1, 0.0))
    finally:
        writer.close()


async def run(url: str, body: bytes, connections: int, seconds: float) -> list[tuple[int, float]]:
    parts = urlsplit(url)
    results: list[tuple[int, float]] = []
    until = time.monotonic() + seconds
    await asyncio.gather(
        *(
            _connection(
                parts.hostname or "127.0.0.1", parts.port or 80, parts.path, body, until, results
            )
            for _ in range(connections)
        )
    )
    return results


def main() -> None:
    url, body_file, connections, seconds = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    results = asyncio.run(run(url, Path(body_file).read_bytes(), connections, seconds))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
