"""The reward client's circuit breaker: a server that is down costs a call no retries.

Real sockets throughout: a port where nothing listens, and ``RawServer`` on that same port
once the server "comes back". Connection attempts are counted by a transport wrapped
around httpx's own (with nothing listening, every request is one connection attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import httpx
import pytest
from conftest import free_port
from helpers import RawServer, http, send, wait_for

from processors_base.client import RewardClient, RewardResult, shared_client
from processors_base.trainer_hooks import trl_reward_func

ANSWER = [{"role": "assistant", "content": "42"}]
REWARD = http(200, b'{"status": "succeeded", "reward": {"reward_score": 1.0}}')


def busy(retry_after: int) -> bytes:
    """A 503, as the runtime answers when its slots and queue are full."""
    answer = http(503, b'{"error_code": "OVERLOADED", "error": "busy"}')
    return answer.replace(b"\r\n", f"\r\nRetry-After: {retry_after}\r\n".encode(), 1)


SECRET = "sk-circuit-secret"


class Counting(httpx.AsyncBaseTransport):
    """httpx's transport, counting the requests it is given."""

    def __init__(self) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.tries = 0
        self.answers = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.tries += 1
        response = await self.real.handle_async_request(request)
        self.answers += 1
        return response

    async def aclose(self) -> None:
        await self.real.aclose()


def lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


@pytest.fixture(autouse=True)
def _logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="processors_base.client")


async def test_a_down_server_opens_the_circuit_and_calls_fail_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counting = Counting()
    url = f"http://user:{SECRET}@127.0.0.1:{free_port()}"
    headers = {"authorization": f"Bearer {SECRET}"}
    async with RewardClient(
        url, failure_threshold=3, cool_down=3600, timeout=60, headers=headers, transport=counting
    ) as client:
        first = await client.score(ANSWER, "42")
        # 3 refusals in a row open it: the call stops there, not at its 60 s deadline
        assert counting.tries == 3 and client.circuit == "open"
        assert first.failed and first.score == 0.0 and first.reason is not None
        assert first.reason.startswith("UNREACHABLE: the reward server is unreachable")
        assert "ConnectError" in first.reason and "the next probe in" in first.reason
        results = await asyncio.gather(*(client.score(ANSWER, "42") for _ in range(20)))
    assert counting.tries == 3  # not one more connection attempt during the cool-down
    assert all(r.failed and r.reason and r.reason.startswith("UNREACHABLE") for r in results)
    # logged once: the first refusal and the opening, never per call, never a secret
    assert lines(caplog, "cannot connect") == 1
    assert lines(caplog, "circuit open") == 1
    assert lines(caplog, "reward call to") == 0
    assert SECRET not in caplog.text


async def first_probe(
    client: RewardClient, timeout: float | None = None
) -> asyncio.Future[RewardResult]:
    """Calls until one is the probe of the half-open circuit (the others fail at once)."""
    deadline = time.monotonic() + 60  # a bound on a hang: the cool-down is far shorter
    while time.monotonic() < deadline:
        call = asyncio.ensure_future(client.score(ANSWER, timeout=timeout))
        await asyncio.sleep(0)  # its first step: failed at once, or made the probe
        if client.circuit == "half-open":
            return call
        assert (await call).failed
        await asyncio.sleep(0.01)
    raise AssertionError("no call probed within 60s")


async def test_one_probe_after_the_cool_down_closes_it_when_the_server_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()  # the server holds its answers until then
    seen = 0

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        seen += 1
        while not release.is_set():
            await asyncio.sleep(0.01)
        await send(writer, REWARD)

    server = RawServer(handle)  # its port: nothing listens there until it is entered
    counting = Counting()
    async with RewardClient(
        f"http://127.0.0.1:{server.port}",
        failure_threshold=2,
        cool_down=0.05,
        timeout=30,
        transport=counting,
    ) as client:
        assert (await client.score(ANSWER)).failed
        assert counting.tries == 2 and client.circuit == "open"

        # after the cool-down one call probes; refused, it opens the circuit again
        assert (await (await first_probe(client))).failed
        assert counting.tries == 3 and client.circuit == "open"
        assert lines(caplog, "the probe failed") == 1

        with server:  # the server is back, slow to answer
            # a probe that ends at its own deadline leaves the verdict to the next call
            late = await (await first_probe(client, timeout=1))  # time to reach a busy server
            assert late.reason == "DEADLINE_EXCEEDED: no answer within 1s"
            assert client.circuit == "open" and lines(caplog, "ended unanswered") == 1
            probe = await first_probe(client)
            await asyncio.to_thread(wait_for, lambda: seen == 2, "the probe to arrive")
            assert client.circuit == "half-open"
            # while the probe is under way the others still fail at once
            others = await asyncio.gather(*(client.score(ANSWER) for _ in range(10)))
            assert all(r.reason and "a probe is under way" in r.reason for r in others)
            assert counting.tries == 5
            release.set()
            assert (await probe).score == 1.0  # the probe's own answer is its score
            assert client.circuit == "closed"
            flowing = await asyncio.gather(*(client.score(ANSWER) for _ in range(5)))
            assert [r.score for r in flowing] == [1.0] * 5
    assert lines(caplog, "cannot connect") == 1
    assert lines(caplog, "circuit open") == 2  # opened, then again after the failed probe
    assert lines(caplog, "circuit half-open") == 3
    assert lines(caplog, "circuit closed") == 1
    assert lines(caplog, "reward call to") == 1  # the late probe: its deadline, not the circuit


async def test_a_retrying_call_stops_when_the_circuit_opens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        await send(writer, busy(3600))

    server = RawServer(handle)
    counting = Counting()
    async with RewardClient(
        server.base_url, failure_threshold=2, max_retry_wait=3600, timeout=7200, transport=counting
    ) as client:
        with server:  # up but busy: the first call waits an hour to retry its 503
            waiting = asyncio.ensure_future(client.score(ANSWER))
            await asyncio.to_thread(wait_for, lambda: counting.answers == 1, "the 503")
        # the server is gone: a second call's refusals open the circuit, and the waiting
        # call gives up at once instead of retrying in an hour
        opener = await client.score(ANSWER)
        stopped = await asyncio.wait_for(waiting, 60)  # a bound on a hang, not on the time
    for result in (opener, stopped):
        assert result.failed and result.reason is not None
        assert result.reason.startswith("UNREACHABLE")
    assert counting.tries == 3  # the 503, then the second call's two refusals


async def test_busy_answers_never_open_it(caplog: pytest.LogCaptureFixture) -> None:
    answers = [busy(0)] * 6 + [REWARD] * 2  # the last for the GET /health of metric names

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        await send(writer, answers.pop(0))

    counting = Counting()
    with RawServer(handle) as server:
        async with RewardClient(server.base_url, failure_threshold=1, transport=counting) as client:
            result = await client.score(ANSWER)
            assert client.circuit == "closed"
    assert (result.score, result.failed, counting.tries) == (1.0, False, 8)
    assert lines(caplog, "circuit") == 0


def test_sync_hooks_fail_fast_on_a_down_server(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    counting = Counting()
    # one client a process for this URL and these options: a second hook made with them
    # shares it, and its open circuit
    options = {"failure_threshold": 4, "cool_down": 3600, "timeout": 60, "transport": counting}
    reward = trl_reward_func(url, **options)
    batch = {"prompts": ["q"] * 16, "completions": ["42"] * 16, "answer": ["42"] * 16}
    assert reward(**batch) == [0.0] * 16
    # the 4 failures that open it and at most one try per call besides (without the
    # circuit breaker each call retries until its 60 s deadline: hundreds of tries)
    assert 4 <= counting.tries <= 4 + 16
    tries = counting.tries
    assert reward(**batch) == [0.0] * 16  # the next step: no connection attempt at all
    assert trl_reward_func(url, name="another", **options)(**batch) == [0.0] * 16
    assert counting.tries == tries
    assert shared_client(url, **options).circuit == "open"
    assert lines(caplog, "cannot connect") == 1
    assert lines(caplog, "circuit open") == 1
    assert lines(caplog, "reward call to") == 0


async def test_calls_queued_for_a_slot_fail_fast_once_the_circuit_opens() -> None:
    counting = Counting()
    async with RewardClient(
        f"http://127.0.0.1:{free_port()}",
        concurrency=1,
        failure_threshold=1,
        cool_down=3600,
        transport=counting,
    ) as client:
        results = await asyncio.gather(*(client.score(ANSWER, timeout=30) for _ in range(5)))
    # the first is refused and opens it; the four that waited for its slot never connect
    assert counting.tries == 1 and all(r.failed for r in results)
    assert all(r.reason and r.reason.startswith("UNREACHABLE") for r in results)


async def test_a_host_that_never_completes_a_handshake_opens_the_circuit() -> None:
    """A listener whose accept queue is full drops new connections, as a host gone from
    the network does: each call ends at its deadline (ConnectTimeout), and those count."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = [socket.socket() for _ in range(3)]  # fill the queue, never accepted
        for sock in queued:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # connecting: it stays queued
                sock.connect(("127.0.0.1", port))
        try:
            async with RewardClient(
                f"http://127.0.0.1:{port}", failure_threshold=2, cool_down=3600
            ) as client:
                for _ in range(2):
                    timed_out = await client.score(ANSWER, timeout=0.3)
                    assert timed_out.reason == "DEADLINE_EXCEEDED: no answer within 0.3s"
                assert client.circuit == "open"
                fast = await client.score(ANSWER, timeout=30)
                assert fast.reason is not None and fast.reason.startswith("UNREACHABLE")
                assert "ConnectTimeout" in fast.reason
        finally:
            for sock in queued:
                sock.close()
