"""App states that the wire cannot reach in time (uvicorn closes the listening socket at
once on SIGTERM), checked on the ASGI app in-process."""

from __future__ import annotations

import httpx
import pytest
from conftest import TESTS, reward_body

from runtime.config import Settings
from runtime.execution.function import Function
from runtime.execution.loading import load_target
from runtime.serving.app import FunctionApp


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


async def test_a_served_request_leaves_no_garbage_for_the_cycle_collector(app):
    """Each request runs in a task of its own (as uvicorn runs it); what the request binds
    to its task's context must not make a cycle with the task, or every request leaves
    garbage that only the GC frees (on a loaded worker: pauses of tens of ms, and memory)."""
    import asyncio
    import gc
    import json

    bodies = [json.dumps(reward_body()).encode(), b'{"func_type": "reward"}']  # 200, 422
    answers: list[int] = []

    async def one(body: bytes) -> None:
        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                answers.append(message["status"])

        scope = {
            "type": "http", "method": "POST", "path": "/api/v1", "query_string": b"",
            "headers": [(b"content-length", b"%d" % len(body))], "client": ("127.0.0.1", 1),
        }  # fmt: skip
        await app(scope, receive, send)

    await asyncio.create_task(one(bodies[0]))  # warm: what is made once is made
    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            for body in bodies:
                await asyncio.create_task(one(body))
        left = gc.collect()
    finally:
        gc.enable()
    assert answers.count(200) == 101 and answers.count(422) == 100
    assert left < 100, f"{left} objects only the cycle collector could free"


async def test_a_stuck_request_that_ends_at_last_gives_its_slot_back_once(monkeypatch):
    """A process() that swallows its cancellation is abandoned (its 504 sent, its slot
    given back so that others run); when it ends at last, its slot must not be given back
    a second time: the worker would run more than --concurrency at once from then on."""
    import asyncio

    from runtime.serving import running
    from runtime.serving.health import Health

    monkeypatch.setattr(running, "STUCK_AFTER", 0)
    target = load_target("workspace.odd_fns:SwallowsCancellation", TESTS)
    application = FunctionApp(Function(target), Settings(concurrency=1, timeout=0.2))
    application.state = Health.READY  # as after setup
    body = reward_body(hold=1.0)
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        late = await client.post("/api/v1", json=body)
        assert late.status_code == 504
        # (in-process, the answer returns once the request's task has ended: held 1 s)
        while application.runner.stuck_tasks:  # its overdue look, on the loop, ends too
            await asyncio.sleep(0.01)
        assert application.admission.in_flight == 0, "a slot given back twice"
        assert (await client.post("/api/v1", json=reward_body(hold=0))).status_code == 200
        assert application.admission.in_flight == 0
