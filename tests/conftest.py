"""Fixtures that start the real server as a subprocess and talk HTTP to it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
SAMPLES = ROOT / "sample_functions"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A ``python -m runtime serve`` subprocess on a free loopback port."""

    def __init__(
        self,
        target: str,
        *args: str,
        workspace: Path = TESTS,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = ROOT / ".pytest_cache" / f"server-{self.port}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        for name in ("PROCESSOR_CLASS", "FUNC_TYPE", "PORT", "SERVER_PORT", "WORKERS_COUNT"):
            if env is None or name not in env:
                full_env.pop(name, None)
        command = [python, "-m", "runtime", "serve"]
        if target:
            command.append(target)
        command += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            command, cwd=workspace, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def wait_listening(self, timeout: float = 20) -> None:
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

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout)
        while time.monotonic() < deadline:
            if self.client.get("/health").status_code == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"server not ready within {timeout}s:\n{self.output()}")

    def post(self, body: object | bytes, **kwargs: object) -> httpx.Response:
        if isinstance(body, bytes):
            return self.client.post("/api/v1", content=body, **kwargs)
        return self.client.post("/api/v1", json=body, **kwargs)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.client.close()
        self._log.close()


@pytest.fixture
def start_server() -> Iterator:
    servers: list[Server] = []

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
