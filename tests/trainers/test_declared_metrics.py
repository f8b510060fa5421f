"""Declared metric names: every answer carries them from the first request on.

verl stacks per-sample metrics by key and checks every key has one value per sample; each
of its reward workers is a process of its own, so a worker whose first sample fails must
still answer every key. A processor declares them (``metric_names``), ``/health`` lists them,
the trainer protocols and the in-process client pad every answer with them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import httpx
import pytest
from conftest import TESTS, Server
from helpers import RawServer, http, send, started
from test_trainers import PROMPT, gym_row, openrlhf, slime

from processors_base.client import RewardClient
from processors_base.models import Reward, RewardInput, RewardOutput
from processors_base.processors import AbstractRewardProcessor, declared_metrics
from runtime.config import Settings
from runtime.execution.loading import TargetError
from runtime.serving.server import build_app

DECLARED = {"answer_found": 0.0, "format_ok": 0.0}
RAISE = [{"role": "assistant", "content": "RAISE"}]
ANSWER = [{"role": "assistant", "content": "42"}]
UNDECLARED = "reported the metric 'surprise', which its metric_names declaration lacks"
FAILED_LINE = "reward failed, answered 0 and marked it"


class Paths(httpx.AsyncBaseTransport):
    """httpx's transport, noting the path of each request."""

    def __init__(self) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await self.real.handle_async_request(request)

    async def aclose(self) -> None:
        await self.real.aclose()


@pytest.fixture
def server() -> Iterator[Server]:
    """A fresh server per test: its first request is the one under test."""
    yield from started("workspace.declared_fns:DeclaredReward", "--trainer-timeout", "5")


async def test_a_first_failure_carries_every_declared_name(server: Server) -> None:
    health = server.client.get("/health").json()
    assert health == {
        "status": "healthy",
        "func_type": "reward",
        "processor": "DeclaredReward",
        "parser": "RewardRequestParser",
        "metrics": ["answer_found", "format_ok"],
    }
    # the first sample this server ever scores fails: every declared key, 0.0, and marked
    first = openrlhf(server, [PROMPT + "RAISE"], [PROMPT], ["42"]).json()
    assert first["rewards"] == [0.0]
    assert first["extra_logs"] == {
        "answer_found": [0.0],
        "format_ok": [0.0],
        "reward_failed": [1.0],
        "prompt_mismatch": [0.0],
    }
    keyed = slime(server, "q", "RAISE", "42", reward_key="reward").json()
    assert keyed == {**DECLARED, "reward": 0.0, "reward_failed": True}
    verified = server.client.post("/verify", json=gym_row("RAISE")).json()
    assert verified["reward_components"] == {**DECLARED, "reward_failed": 1.0}
    assert verified["mask_sample"] is True
    # a fresh client (a trainer worker's own process) whose first calls fail
    paths = Paths()
    async with RewardClient(server.url, timeout=30, transport=paths) as client:
        raised = await asyncio.gather(*(client.score(RAISE, "42") for _ in range(3)))
        assert all((r.score, r.failed, r.metrics) == (0.0, True, DECLARED) for r in raised)
        ok = await client.score([{"role": "assistant", "content": "42"}], "42")
        assert (ok.score, ok.failed, ok.metrics) == (1.0, False, dict.fromkeys(DECLARED, 1.0))
    # the names learnt with one GET /health, not one a call
    assert sorted(paths.paths) == ["/api/v1"] * 4 + ["/health"]


async def test_the_client_pads_with_the_names_learnt_once_the_server_is_gone() -> None:
    server = Server("workspace.declared_fns:DeclaredReward")
    try:
        server.wait_ready()
        async with RewardClient(server.url, timeout=30, failure_threshold=1) as client:
            assert (await client.score(RAISE, "42")).metrics == DECLARED
            server.close()  # down before any call succeeded
            down = await client.score([{"role": "assistant", "content": "42"}], "42")
            assert down.failed and down.reason is not None and "Connect" in down.reason
            assert down.metrics == DECLARED
    finally:
        server.close()


def test_an_undeclared_name_is_logged_once(server: Server) -> None:
    extra = openrlhf(server, [PROMPT + "EXTRA"], [PROMPT], ["EXTRA"]).json()
    assert extra["extra_logs"]["surprise"] == [1.0]  # still answered, and kept from now on
    server.wait_output(UNDECLARED)
    openrlhf(server, [PROMPT + "EXTRA"], [PROMPT], ["EXTRA"])
    # a failure after it, logged after it: the second EXTRA has been logged about by then
    failed = openrlhf(server, [PROMPT + "RAISE"], [PROMPT], ["42"]).json()
    assert failed["extra_logs"]["surprise"] == [0.0]
    assert server.wait_output(FAILED_LINE).count(UNDECLARED) == 1


def test_a_bad_declaration_stops_the_server_at_startup() -> None:
    server = Server("workspace.declared_fns:NotANameReward")
    try:
        assert server.proc.wait(60) == 3
        assert (
            "workspace.declared_fns:NotANameReward: NotANameReward.metric_names holds 3: each "
            "metric name must be a string of 1 to 200 characters" in server.output()
        )
    finally:
        server.close()
    with pytest.raises(TargetError, match="declares 'reward_failed', which the trainer proto"):
        build_app(
            Settings(target="workspace.declared_fns:ReservedNameReward", workspace=str(TESTS))
        )


def test_a_declaration_is_a_sequence_of_names() -> None:
    class Bare(AbstractRewardProcessor):
        metric_names: ClassVar[Sequence[str]] = "answer_found"  # one-letter names: refused

        def process(self, input_data: RewardInput) -> RewardOutput:
            return RewardOutput(reward=Reward(reward_score=1.0))

    with pytest.raises(TypeError, match="must be a sequence of metric names"):
        declared_metrics(Bare)
    Bare.metric_names = ("a", "b", "a")
    assert declared_metrics(Bare) == ("a", "b")
    # every answer carries each name: a bound on their number and length
    Bare.metric_names = tuple(f"m{i}" for i in range(1001))
    with pytest.raises(TypeError, match="declares 1001 names: at most 1000"):
        declared_metrics(Bare)
    Bare.metric_names = ("x" * 201,)
    with pytest.raises(TypeError, match="a string of 1 to 200 characters"):
        declared_metrics(Bare)


# --- a /health that does not answer as ours does ----------------------------------------

REWARD = http(200, b'{"status": "success", "reward": {"reward_score": 1.0}}')


def health_of(answers: list[bytes]) -> Callable[..., Any]:
    """A RawServer handler: every POST scored 1.0, each GET /health the next of ``answers``
    (b"" leaves it unanswered)."""

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        if method == "GET":
            answer = answers.pop(0) if answers else http(404, b"{}")
            if not answer:
                await asyncio.sleep(3600)
            await send(writer, answer)
        else:
            await send(writer, REWARD)

    return handle


async def test_a_health_that_never_answers_costs_a_call_seconds_not_its_deadline() -> None:
    with RawServer(health_of([b""])) as raw:
        async with RewardClient(raw.base_url, timeout=60) as client:
            started = time.monotonic()
            result = await client.score(ANSWER)
            waited = time.monotonic() - started
    assert (result.score, result.failed, result.metrics) == (1.0, False, {})
    assert waited < 30  # NAMES_WAIT (2 s), not the 60 s deadline


async def test_a_health_too_deep_for_json_or_a_proxys_503_is_asked_again() -> None:
    deep = http(200, b"[" * 100_000 + b"]" * 100_000)
    proxy = http(503, b'{"status": "starting"}')
    ours = http(200, b'{"status": "healthy", "metrics": ["answer_found"]}')
    with RawServer(health_of([deep, proxy, ours])) as raw:
        async with RewardClient(raw.base_url) as client:
            results = [await client.score(ANSWER) for _ in range(3)]
    # never an exception; the names once /health says them
    assert [r.metrics for r in results] == [{}, {}, {"answer_found": 0.0}]
    assert all(r.score == 1.0 and not r.failed for r in results)
