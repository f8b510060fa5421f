"""Fixtures that start the real server as a subprocess and talk HTTP to it.

The tests live in a folder per subject (serving/, execution/, tracing/, ...) with no
``__init__.py``: pytest imports each by its file name, so every test file's name is unique,
and ``from conftest import ...`` and ``from helpers import ...`` (this folder's shared
functions) work from any of them. Run under pytest-xdist (pyproject's addopts), each worker
has its own process mark and temp folder below."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from otlp_receiver import OTLPReceiver
    from platform_standin import PlatformStandIn

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
SAMPLES = ROOT / "sample_functions"
# The platform spec's example files (its §13: job files, datasets, function inputs), kept
# in the repository so that a clone has them.
SPEC_EXAMPLES = TESTS / "data" / "spec_examples"

# Every process a test starts inherits this mark, so one left running (an orphaned worker)
# is found by its environment even after its parent is gone and it was reparented. A helper
# a test starts that imports this module (tests/platform_standin.py) keeps the mark it
# inherited, so that what the helper starts is found too.
# Under pytest-xdist the workers inherit the controller's mark: each one makes it its own,
# so that its leak checks never count or kill what another worker's tests started.
_run = os.environ.setdefault("RL_FN_TEST_RUN", uuid.uuid4().hex[:8])
_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and not _run.endswith(f"-{_worker}"):
    os.environ["RL_FN_TEST_RUN"] = f"{_run}-{_worker}"
RUN_MARK = f"RL_FN_TEST_RUN={os.environ['RL_FN_TEST_RUN']}"
# TMPDIR of the servers the tests start: whatever is left in it was not cleaned up.
SERVER_TMP = ROOT / ".pytest_cache" / "tmp" / RUN_MARK.split("=", 1)[1]


# How long a server may take to start before a test gives up on it: a few seconds alone, far
# more with parallel workers on a busy machine. A bound on a wait, never on the behaviour.
STARTUP = 120


# Ports handed to the servers tests start: below the kernel's ephemeral range (32768 up),
# where bind(0) and outgoing connections take theirs, and above Ray's worker ports.
PORTS = range(21000, 31000)
PORT_COUNTER = ROOT / ".pytest_cache" / "next-port"


def free_port() -> int:
    """A free loopback port that no other process of the run is handed. bind(0) alone is
    not enough: a port is free again once the probe closes, and two xdist workers were once
    handed the same one, so a test talked to another test's server. The next port comes
    from a counter in a locked file shared by every process of the run (workers and the
    helpers they start); one still in use is skipped. A new counter starts at a random
    place, so that runs from two checkouts at once do not walk the same ports."""
    PORT_COUNTER.parent.mkdir(exist_ok=True)
    descriptor = os.open(PORT_COUNTER, os.O_RDWR | os.O_CREAT, 0o644)
    with open(descriptor, "r+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)  # released when the file closes
        try:
            start = int(counter.read(5))
        except ValueError:  # new, or cut short
            start = random.randrange(len(PORTS))
        for step in range(len(PORTS)):
            port = PORTS[(start + step) % len(PORTS)]
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            counter.seek(0)
            counter.write(f"{(start + step + 1) % len(PORTS):05d}")  # in place: no truncation
            return port
    raise RuntimeError(f"no free port in {PORTS}")


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for its parent to reap it."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """Live processes below ``pid`` (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found and alive(child):
                found.add(child)
                todo.append(child)
    return found


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Waits until none of ``pids`` runs; returns those still running at the timeout."""
    deadline = time.monotonic() + timeout
    while (left := {pid for pid in pids if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def marked_processes() -> dict[int, str]:
    """Live processes started by this test run (any depth, orphaned or not): pid -> command."""
    if not Path("/proc/self/environ").exists():
        return {}
    mark = RUN_MARK.encode() + b"\0"
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark not in (entry / "environ").read_bytes() or not alive(int(entry.name)):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry.name)] = command.strip()
    return found


def _left_behind(before: set[int], files_before: set[str], timeout: float) -> list[str]:
    """Processes and server temp files that appeared since ``before``; kills and removes them."""
    problems = []
    new = {pid: cmd for pid, cmd in marked_processes().items() if pid not in before}
    for pid in wait_gone(set(new), timeout):
        problems.append(f"process {pid} still running: {new[pid][:200]}")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for entry in sorted(SERVER_TMP.iterdir()) if SERVER_TMP.exists() else []:
        if entry.name not in files_before:
            problems.append(f"temporary file left behind: {entry}")
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
    return problems


@pytest.fixture(autouse=True)
def _no_process_or_file_left() -> Iterator[None]:
    """A test fails (in its teardown) if it leaves a process running or a temp file behind."""
    before = set(marked_processes())
    files = {e.name for e in SERVER_TMP.iterdir()} if SERVER_TMP.exists() else set()
    yield
    problems = _left_behind(before, files, timeout=30)
    if problems:
        pytest.fail("left behind (now cleaned up):\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _nothing_left_at_the_end() -> Iterator[None]:
    """Also after module- and session-scoped servers: the whole run leaves nothing behind."""
    SERVER_TMP.mkdir(parents=True, exist_ok=True)
    yield
    problems = _left_behind(set(), set(), timeout=30)
    shutil.rmtree(SERVER_TMP, ignore_errors=True)
    if problems:
        pytest.fail("left behind (now cleaned up):\n" + "\n".join(problems), pytrace=False)


class Server:
    """A ``python -m runtime serve`` subprocess on a free loopback port (``module``: another
    module that runs it, such as a launcher that breaks something first)."""

    def __init__(
        self,
        target: str,
        *args: str,
        workspace: Path = TESTS,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        module: str = "runtime",
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = ROOT / ".pytest_cache" / f"server-{self.port}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        full_env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(SERVER_TMP),  # checked for leftovers after each test
            **(env or {}),
        }
        for name in ("PROCESSOR_CLASS", "FUNC_TYPE", "PORT", "SERVER_PORT", "WORKERS_COUNT"):
            if env is None or name not in env:
                full_env.pop(name, None)
        command = [python, "-m", module, "serve"]
        if target:
            command.append(target)
        command += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            command, cwd=workspace, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def wait_listening(self, timeout: float = STARTUP) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                self.client.get("/health", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"server did not listen within {timeout}s:\n{self.output()}")

    def wait_ready(self, timeout: float = STARTUP) -> None:
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.client.get("/health", timeout=10).status_code == 200:
                    return
            except httpx.TimeoutException:  # a proxy holding it while the function deploys
                pass  # (Ray Serve's, on a busy machine: once more than the client's 30 s)
            time.sleep(0.05)
        raise AssertionError(f"server not ready within {timeout}s:\n{self.output()}")

    def post(self, body: object | bytes, **kwargs: object) -> httpx.Response:
        if isinstance(body, bytes):
            return self.client.post("/api/v1", content=body, **kwargs)
        return self.client.post("/api/v1", json=body, **kwargs)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_output(self, text: str, count: int = 1, timeout: float = 60) -> str:
        """The log once ``text`` appears ``count`` times: lines are written by a background
        thread of the server, so they may trail the response they are about."""
        deadline = time.monotonic() + timeout
        while (output := self.output()).count(text) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} x{count} not logged within {timeout}s:\n{output}")
            time.sleep(0.05)
        return output

    def terminate(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        """Kills what is left of the server's process tree (a graceful stop costs ~0.7 s a
        test; tests of stopping call terminate()), and removes its log. A supervisor killed
        this way leaves its metrics directory behind, which the leftover check reports: a
        test of --workers ends with terminate()."""
        if self.proc.poll() is None:
            tree = descendants(self.proc.pid)
            self.proc.kill()  # first, so that it starts no replacement for the workers
            self.proc.wait(10)
            for pid in tree:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self.client.close()
        self._log.close()
        self.log_path.unlink(missing_ok=True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: three workers a usable CPU. Most of a test's time is spent waiting on the
    servers and CLIs it starts: on 2 CPUs the suite took 10:00 with 4 workers, 8:01 with 6."""
    if wanted := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(wanted)
    return 3 * len(os.sched_getaffinity(0))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    report = yield
    if report.failed:  # the logs of the test's servers, shown with its failure
        for server in getattr(item, "servers", []):
            if server.log_path.exists():
                report.sections.append((f"server {server.port} log", server.output()[-20000:]))
    return report


@pytest.fixture
def start_server(request: pytest.FixtureRequest) -> Iterator:
    servers: list[Server] = []
    request.node.servers = servers

    def start(target: str, *args: str, ready: bool = True, **kwargs: object) -> Server:
        server = Server(target, *args, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        if ready:
            server.wait_ready()
        return server

    yield start
    for server in servers:
        server.close()


def reward_body(messages: int = 1, **extra: object) -> dict:
    return {
        "func_type": "reward",
        "ground_truth": "42",
        "agent_output": {
            "messages": [{"role": "assistant", "content": "42"}] * messages,
            "rollout_extra": extra or None,
        },
    }


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the sample workspace, to change or to package."""
    return Path(
        shutil.copytree(SAMPLES, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    )


@pytest.fixture
def platform() -> Iterator[PlatformStandIn]:
    """The stand-in platform; after the test, every instance it started is stopped and its
    files are removed."""
    from platform_standin import PlatformStandIn  # it imports this module

    with PlatformStandIn() as standin:
        yield standin
    for instance in standin.started:
        assert instance.process.poll() is not None
        assert not Path(instance.directory.name).exists()


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    """An OTLP/HTTP receiver on a free port, keeping the spans it is sent."""
    from otlp_receiver import OTLPReceiver

    with OTLPReceiver(free_port()) as running:
        yield running
