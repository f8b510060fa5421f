"""App states that the wire cannot reach in time (uvicorn closes the listening socket at
once on SIGTERM), checked on the ASGI app in-process."""

from __future__ import annotations

import httpx
import pytest
from conftest import TESTS, reward_body

from runtime.app import FunctionApp
from runtime.config import Settings
from runtime.function import Function
from runtime.loading import load_target


@pytest.fixture
async def app():
    target = load_target("workspace.fns:EchoReward", TESTS)
    application = FunctionApp(Function(target), Settings())
    application.state = "healthy"  # as after setup
    return application


async def test_draining_answers_503_on_health_and_requests(app):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.post("/api/v1", json=reward_body())).status_code == 200
        app.begin_drain()
        health = await client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "draining"
        refused = await client.post("/api/v1", json=reward_body())
        assert refused.status_code == 503
        assert refused.json()["error_code"] == "DRAINING"
        assert refused.headers["retry-after"] == "1"
