"""Plain functions and constants the test files share (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLES, Server, free_port
from platform_standin import PlatformStandIn


def interruptible() -> None:
    """``preexec_fn`` of a child that a test stops with SIGINT: Ctrl-C as from a terminal.
    A suite started in the background (``pytest &`` in a script) has SIGINT ignored, which
    its children inherit, and Python then never raises KeyboardInterrupt in them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---- waiting and /metrics ----


def wait_for(
    condition: Callable[[], object], what: str = "the condition", timeout: float = 60
) -> None:
    """Polls ``condition`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def started(target: str, *args: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """A served function, ready; closed after (``yield from started(...)`` in a fixture)."""
    server = Server(target, *args, env=env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = (
        re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    )
    found = re.search(pattern, text)
    assert found, f"{name}{{{labels}}} not in /metrics"
    return float(found.group(1))


def metric_sample(server: Server, sample: str) -> float | None:
    """The value of the /metrics line whose name and labels are exactly ``sample``."""
    for line in server.client.get("/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return None


# ---- the platform client's CLI, and raw HTTP servers to point it at ----

FT = "/api/v1/fine-tunes"


def cli(
    platform: PlatformStandIn,
    *args: str,
    cwd: Path = SAMPLES,
    key: str | None = None,
    env: dict[str, str] | None = None,
    python: tuple[str, ...] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``python -m runtime ARGS`` against ``platform`` (anything with ``base_url`` and
    ``api_key``); ``python``: arguments of the interpreter before ``-m``."""
    # a user's environment: no platform settings, and Python writes bytecode caches
    skip = ("DASHSCOPE_", "FC_", "PYTHONDONTWRITEBYTECODE")
    full = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    full.update(DASHSCOPE_HTTP_BASE_URL=platform.base_url)
    if key != "":
        full["DASHSCOPE_API_KEY"] = key or platform.api_key
    full.update(env or {})
    return subprocess.run(
        [sys.executable, *python, "-m", "runtime", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def opd_job(platform: PlatformStandIn, workspace: Path) -> Path:
    """An OPD job file for ``workspace``, its training data uploaded to ``platform``."""
    uploaded = cli(
        platform, "upload-data", "--training", "data/calc_train.jsonl", "-o", "json", cwd=workspace
    )
    assert uploaded.returncode == 0, uploaded.stderr
    (file_id,) = json.loads(uploaded.stdout)["training_file_ids"]
    opd = workspace / "opd.yaml"
    opd.write_text(f"teacher_model: t\ndatasets:\n- {{type: training, file_id: {file_id}}}\n")
    return opd


# Python 3.12+ warns at any fork of a process with threads (a reward client's background
# loop): the tests that fork as a trainer's pool does (AReaL's) prove the child is fine.
FORKS_THREADS = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded, use of fork:DeprecationWarning"
)


def in_forked_child(work: Callable[[], Any], timeout: float = 30) -> Any:
    """What ``work()`` returns in a child forked from this process (an AssertionError when
    it gives nothing within ``timeout`` seconds: it hung, or died)."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    child = context.Process(target=_send_back, args=(work, theirs))
    child.start()
    theirs.close()  # a child that dies is an EOF here, not a hang
    try:
        assert ours.poll(timeout), "the forked child gave nothing back"
        return ours.recv()
    finally:
        child.kill()
        child.join()
        ours.close()


def _send_back(work: Callable[[], Any], conn: Connection) -> None:
    conn.send(work())


Handler = Callable[[str, str, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """An HTTP/1.1 server on a loopback port, run by asyncio in a thread: ``handle(method,
    target, writer)`` writes each answer as it likes (all at once, a byte at a time, a
    stream without end). Leaving the ``with`` block ends every connection."""

    api_key = "sk-raw-test"

    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/api/v1"
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    def __enter__(self) -> RawServer:
        self._thread.start()
        assert self._ready.wait(10), "the raw server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        assert not self._thread.is_alive()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task] = set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                while True:  # one request after another on a kept-alive connection
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                    method, target, _ = head.split(" ", 2)
                    for line in head.split("\r\n")[1:]:
                        name, _, value = line.partition(":")
                        if name.strip().lower() == "content-length":
                            await reader.readexactly(int(value))
                    await self.handle(method, target, writer)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()
                tasks.discard(task)

        server = await asyncio.start_server(serve, "127.0.0.1", self.port)
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def send(writer: asyncio.StreamWriter, data: bytes) -> bool:
    """Write ``data``; False once the client has gone."""
    if writer.is_closing():
        return False
    writer.write(data)
    try:
        await writer.drain()
    except ConnectionError:
        return False
    return True


def http(status: int, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


# ---- the DashScope SDK: here, or in the Python DASHSCOPE_PYTHON names ----

HERE_HAS_SDK = importlib.util.find_spec("dashscope") is not None


def _sdk_python() -> str | None:
    if HERE_HAS_SDK:
        return sys.executable
    candidate = os.environ.get("DASHSCOPE_PYTHON")
    if candidate and Path(candidate).exists():
        return candidate
    return None


SDK_PYTHON = _sdk_python()


without_sdk = pytest.mark.skipif(
    HERE_HAS_SDK, reason="dashscope is installed in this interpreter; environment 1 needs it absent"
)


with_sdk = pytest.mark.skipif(
    SDK_PYTHON is None,
    reason="environment 2 needs dashscope: pip install -e '.[test,sdk]' here, "
    "or set DASHSCOPE_PYTHON to a Python that has it (.ci/run does)",
)


# ---- terminal control sequences ----


def controls(text: str) -> set[str]:
    """Characters a terminal acts on: C0 (but newline and tab), DEL, C1."""
    return {c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F}
