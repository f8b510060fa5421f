"""Microseconds a request spends in this runtime's Python, without sockets or a load
generator: the figure to watch while changing the hot path (wrk's req/s moves by 5-10%
between runs on a shared machine; this moves by about 2%).

    python benchmarks/inprocess.py                 # the app alone: POST /api/v1 as ASGI calls
    python benchmarks/inprocess.py --http          # uvicorn's protocol and the app, fed bytes
    python benchmarks/inprocess.py --http --bare   # the bare ASGI app on plain uvicorn
    python benchmarks/inprocess.py --tracing       # with a processor span a request
    python benchmarks/inprocess.py --body group    # a group reward of 64 x 3 KB (group32: 32 KB)
    python benchmarks/inprocess.py --profile out.prof   # cProfile of the app alone

Instructions a request, steady on a busy machine: the difference between two runs under
``valgrind --tool=callgrind`` (PYTHONHASHSEED=0) with ``--repeat 1 --warm 200`` and two
``--requests`` counts, divided by the difference of the counts.

The app runs its lifespan (setup) first; spans, with --tracing, go to the export queue and
the exporter process as in the server (OTEL_EXPORTER_OTLP_ENDPOINT: where they are sent;
benchmarks/otlp_sink.py takes them). A loop this tight outruns the exporter: spans beyond
OTEL_BSP_MAX_QUEUE_SIZE are dropped and counted, as the server would.
With --http each of 32 connections is handed a whole request per round, as wrk's arrive,
and the answers are dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

BODY = (
    b'{"func_type": "reward", "ground_truth": "42", "agent_output": {"messages": [{"role": '
    b'"user", "content": "What is 6 times 7?"}, {"role": "assistant", "content": "The answer '
    b'is 42."}]}}'
)
CONNECTIONS = 32
TARGETS = {
    "echo": "functions.ours:EchoReward",
    "group": "functions.ours:GroupEcho",
    "group32": "functions.ours:GroupEcho",
}


def _body(kind: str) -> bytes:
    if kind == "echo":
        return BODY
    from run import group_body  # benchmarks/run.py's realistic group requests (64 x 3 or 32 KB)

    return group_body(answer_chars=32_000 if kind == "group32" else 3000).encode()


def _request(body: bytes) -> bytes:
    head = (
        b"POST /api/v1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    return head + body


class _Transport(asyncio.Transport):
    """A connection that keeps nothing it is given."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class _Lifespan:
    """The app's lifespan: setup() before the measurements, shutdown() after."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._messages: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        async def ignore(message: dict[str, str]) -> None:
            pass

        await self._messages.put({"type": "lifespan.startup"})
        lifespan = self._app({"type": "lifespan"}, self._messages.get, ignore)
        self._task = asyncio.get_running_loop().create_task(lifespan)
        while self._app.state != "healthy":
            await asyncio.sleep(0.01)
        from runtime.serving.server import settle_garbage_collector

        settle_garbage_collector()  # as the server does once ready

    async def __aexit__(self, *exc: object) -> None:
        await self._messages.put({"type": "lifespan.shutdown"})
        assert self._task is not None
        await self._task


def _app_rounds(app: Any, body: bytes) -> Any:
    """Requests as the ASGI calls our protocol makes (WHOLE_RESPONSE advertised)."""
    from runtime.serving.sending import WHOLE_RESPONSE

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(body))],
        "client": ("127.0.0.1", 50000),
        "extensions": {WHOLE_RESPONSE: {}},
    }  # fmt: skip
    message = {"type": "http.request", "body": body, "more_body": False}
    answers: list[int] = []

    async def receive() -> dict[str, Any]:
        return message

    async def send(sent: dict[str, Any]) -> None:
        answers.append(sent["status"])

    async def rounds(count: int) -> None:
        for _ in range(count):
            await app(dict(scope), receive, send)
        if answers[-1] != 200:
            raise SystemExit(f"the app answered {answers[-1]}")
        answers.clear()

    return rounds


def _http_rounds(app: Any, bare: bool, body: bytes = BODY) -> Any:
    """Whole requests fed to uvicorn's protocol (ours, or uvicorn's own for --bare)."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from runtime.serving.protocol import protocol_class

    config = Config(app, http="httptools", ws="none", lifespan="off", access_log=False)
    config.load()
    state = ServerState()
    cls = HttpToolsProtocol if bare else protocol_class(max_connections=1024, read_timeout=10)
    loop = asyncio.get_running_loop()
    protocols = []
    request = _request(body)
    for _ in range(CONNECTIONS):
        protocol = cls(config=config, server_state=state, app_state={}, _loop=loop)
        protocol.connection_made(_Transport())
        protocols.append(protocol)

    async def rounds(count: int) -> None:
        for _ in range(max(1, count // CONNECTIONS)):
            for protocol in protocols:
                protocol.data_received(request)
            while state.tasks:  # every answer sent (and the write batch's turn taken)
                await asyncio.sleep(0)
            await asyncio.sleep(0)

    return rounds


async def _measure(args: argparse.Namespace) -> None:
    if args.bare:
        from bare_app import app

        await _rounds(args, _http_rounds(app, bare=True, body=_body(args.body)))
        return
    from runtime.config import Settings
    from runtime.serving.server import build_app

    settings = Settings(target=TARGETS[args.body], workspace=str(HERE))
    app = build_app(dataclasses.replace(settings, tracing=args.tracing))
    body = _body(args.body)
    async with _Lifespan(app):
        rounds = _http_rounds(app, False, body) if args.http else _app_rounds(app, body)
        await _rounds(args, rounds)


async def _rounds(args: argparse.Namespace, rounds: Any) -> None:
    await rounds(args.warm)
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        await rounds(args.requests)
        profiler.disable()
        profiler.dump_stats(args.profile)
        print(f"profile written to {args.profile} (python -m pstats {args.profile})")
        return
    best = float("inf")
    for _ in range(args.repeat):
        started = time.perf_counter()
        await rounds(args.requests)
        best = min(best, (time.perf_counter() - started) / args.requests)
    what = "bare app on uvicorn" if args.bare else f"runtime, {args.body}"
    what += ", tracing" if args.tracing else ""
    where = "HTTP protocol and app" if args.http else "app alone"
    print(f"{best * 1e6:.2f} us a request ({what}; {where}; best of {args.repeat})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--http", action="store_true", help="through uvicorn's protocol")
    parser.add_argument("--bare", action="store_true", help="the bare app (implies --http)")
    parser.add_argument("--tracing", action="store_true", help="a processor span a request")
    parser.add_argument(
        "--body",
        choices=sorted(TARGETS),
        default="echo",
        help="the request: echo, group (64 x 3 KB) or group32 (64 x 32 KB)",
    )
    parser.add_argument("--requests", type=int, default=50_000, help="requests a measurement")
    parser.add_argument("--warm", type=int, default=2000, help="requests before measuring")
    parser.add_argument("--repeat", type=int, default=5, help="measurements; the best counts")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of one measurement")
    args = parser.parse_args()
    args.http = args.http or args.bare
    import uvloop

    uvloop.run(_measure(args))


if __name__ == "__main__":
    main()
