"""Health (runtime.serving.health): one enum for /health, the heartbeat and the
supervisor, the same strings on the wire as before it was one."""

from __future__ import annotations

import multiprocessing

import httpx
import orjson
import pytest
from conftest import TESTS

from runtime.config import Settings
from runtime.execution.function import Function
from runtime.execution.loading import load_target
from runtime.serving.app import FunctionApp
from runtime.serving.health import Health
from runtime.serving.heartbeat import Heartbeat


def test_the_wire_words_are_unchanged():
    assert [h.value for h in Health] == [
        "starting",
        "healthy",
        "draining",
        "unhealthy",
        "stopped",
    ]
    assert Health.READY == "healthy" and Health("draining") is Health.DRAINING
    assert orjson.dumps({"status": Health.READY}) == b'{"status":"healthy"}'
    assert f"{Health.UNHEALTHY}" == str(Health.UNHEALTHY)


@pytest.mark.parametrize("state", list(Health))
def test_the_heartbeat_carries_every_state(state):
    heartbeat = Heartbeat(multiprocessing.get_context("spawn"))
    assert heartbeat.state is Health.STARTING and not heartbeat.was_ready
    heartbeat.beat(state)
    assert heartbeat.state is state
    assert heartbeat.was_ready is (state is Health.READY)


@pytest.fixture
def app():
    return FunctionApp(Function(load_target("workspace.fns:EchoReward", TESTS)), Settings())


async def _health(app: FunctionApp) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get("/health")


@pytest.mark.parametrize(
    ("state", "status"),
    [(Health.STARTING, 503), (Health.READY, 200), (Health.DRAINING, 503)],
)
async def test_health_answers_the_state(app, state, status):
    app.state = state
    answer = await _health(app)
    assert answer.status_code == status
    assert answer.json()["status"] == state.value and "reason" not in answer.json()
    assert app.health() == (state, "")


async def test_set_up_but_unable_to_serve_is_unhealthy_and_says_why(app, monkeypatch):
    app.state = Health.READY
    monkeypatch.setattr(app, "unhealthy_reason", lambda: "every thread is stuck")
    answer = await _health(app)
    assert answer.status_code == 503
    assert answer.json()["status"] == "unhealthy"
    assert answer.json()["reason"] == "every thread is stuck"
    assert app.health() == (Health.UNHEALTHY, "every thread is stuck")
