"""The span exporter process: spans leave through it, and it neither outlives its
worker nor loses spans when it is killed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from conftest import descendants, free_port, reward_body, wait_gone
from otlp_receiver import OTLPReceiver


@pytest.fixture
def receiver():
    with OTLPReceiver(free_port()) as running:
        yield running


def _exporters(server_pid: int, timeout: float = 15) -> set[int]:
    """The span-exporter children of a worker (started with the first spans)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {pid for pid in descendants(server_pid) if b"spawn_main" in _cmdline(pid)}
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("no span exporter process appeared")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _env(receiver: OTLPReceiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}


def test_spans_are_encoded_outside_the_worker(start_server, receiver):
    server = start_server("workspace.fns:EchoReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).status_code == 200
    assert [s["name"] for s in receiver.wait_for(1)] == ["reward EchoReward"]
    (exporter,) = _exporters(server.proc.pid)
    assert exporter != server.proc.pid
    assert server.terminate() == 0
    assert wait_gone({exporter}, 10) == set()


def test_a_killed_exporter_is_replaced_and_later_spans_still_arrive(start_server, receiver):
    server = start_server("workspace.fns:EchoReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).status_code == 200
    receiver.wait_for(1)
    (first,) = _exporters(server.proc.pid)
    os.kill(first, signal.SIGKILL)
    assert wait_gone({first}, 10) == set()
    for _ in range(3):
        assert server.post(reward_body()).status_code == 200
    assert len(receiver.wait_for(4)) == 4
    assert first not in _exporters(server.proc.pid)
    assert "span exporter process stopped" in server.output()
    assert server.terminate() == 0


def test_the_exporter_does_not_outlive_a_killed_worker(start_server, receiver):
    server = start_server("workspace.fns:EchoReward", "--tracing", env=_env(receiver))
    assert server.post(reward_body()).status_code == 200
    receiver.wait_for(1)
    exporters = _exporters(server.proc.pid)
    server.proc.kill()
    server.proc.wait()
    assert wait_gone(exporters, 15) == set()
