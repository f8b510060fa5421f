"""The reward client against servers that answer badly: what a trainer meets from a
broken proxy, a hostile endpoint or its own misconfiguration. Every failure is a score of
0.0 marked failed, within the call's deadline, naming no secret; never an exception."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import Awaitable, Callable, Iterator

import httpx
import orjson
import pytest
from conftest import Server, free_port
from helpers import FORKS_THREADS, RawServer, http, in_forked_child, send, started

from processors_base.client import MAX_ANSWER, RewardClient, shared_client
from processors_base.trainer_hooks import AReaLReward, trl_reward_func, verl_compute_score_sync

ANSWER = [{"role": "assistant", "content": "42"}]
GOOD = orjson.dumps({"status": "success", "reward": {"reward_score": 1.0}})
Writer = asyncio.StreamWriter


def answering(body: bytes, status: int = 200) -> Callable[[str, str, Writer], Awaitable[None]]:
    async def handle(method: str, target: str, writer: Writer) -> None:
        await send(writer, http(status, body))

    return handle


@pytest.mark.parametrize(
    "status, body",
    [
        (200, b'{"reward": {"reward_score": 1' + b"0" * 400 + b"}}"),  # past a float
        (200, b'{"reward": {"reward_score": 1.0, "reward_metrics": {"m": 1' + b"0" * 400 + b"}}}"),
        (200, b"[" * 100_000 + b"]" * 100_000),  # past any parser's depth
        (500, b"[" * 100_000 + b"]" * 100_000),
        (200, b'"' + b"a" * (MAX_ANSWER + 1) + b'"'),  # read no further than MAX_ANSWER
    ],
    ids=["huge-score", "huge-metric", "deep", "deep-error", "too-large"],
)
async def test_a_hostile_answer_is_a_failed_score_never_an_exception(
    status: int, body: bytes
) -> None:
    with RawServer(answering(body, status)) as server:
        async with RewardClient(server.base_url, timeout=30) as client:
            result = await client.score(ANSWER, "42")
        assert (result.score, result.failed) == (0.0, True)
        assert result.reason is not None
        # the hooks too: each returns its failure, none raises
        loop = asyncio.get_running_loop()
        verl = await loop.run_in_executor(
            None, lambda: verl_compute_score_sync("d", "42", "42", url=server.base_url)
        )
        assert (verl["score"], verl["reward_failed"]) == (0.0, 1.0)
        trl = trl_reward_func(server.base_url, failed_value=None)
        assert await loop.run_in_executor(None, lambda: trl(["q"], ["42"])) == [None]


async def test_the_deadline_bounds_an_answer_sent_a_byte_at_a_time() -> None:
    async def trickle(method: str, target: str, writer: Writer) -> None:
        for byte in http(200, GOOD):  # about 80 bytes, one every 0.25 s: 20 s in all
            if not await send(writer, bytes([byte])):
                return
            await asyncio.sleep(0.25)

    with RawServer(trickle) as server:
        async with RewardClient(server.base_url, timeout=1) as client:
            result = await client.score(ANSWER, "42")
    # httpx's timeout bounds each read only: each byte came within it
    assert result.failed and result.reason == "DEADLINE_EXCEEDED: no answer within 1s"


async def test_an_answer_cut_in_its_body_is_not_retried_nor_a_connection_failure() -> None:
    posts: list[str] = []

    async def cut(method: str, target: str, writer: Writer) -> None:
        if method == "POST":
            posts.append(target)
        await send(writer, http(200, GOOD)[:-20])
        writer.close()  # the server may have scored it: a retry would score it twice

    with RawServer(cut) as server:
        async with RewardClient(server.base_url, timeout=10, failure_threshold=1) as client:
            result = await client.score(ANSWER, "42")
            assert result.failed and result.reason is not None
            assert result.reason.startswith("the answer was cut: ")
            assert client.circuit == "closed"  # it answered: the server is up
    assert posts == ["/api/v1"]


async def test_garbage_retry_after_backs_off_instead_of_retrying_at_once() -> None:
    posts = []

    async def refuse(method: str, target: str, writer: Writer) -> None:
        posts.append(target)
        head = b"HTTP/1.1 503 X\r\nRetry-After: nan\r\nContent-Length: 2\r\n\r\n{}"
        await send(writer, head)

    with RawServer(refuse) as server:
        async with RewardClient(server.base_url, timeout=3) as client:
            result = await client.score(ANSWER, "42")
    assert result.failed and result.reason is not None and "HTTP 503" in result.reason
    # backing off (0.2, 0.4, 0.8, 1.6 s) it asks 4 or 5 times; at once, thousands of times
    assert 1 < len(posts) <= 8


async def test_no_secret_reaches_a_reason_or_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    targets = []

    async def record(method: str, target: str, writer: Writer) -> None:
        targets.append((method, target))
        await send(writer, http(200, GOOD))

    caplog.set_level(logging.INFO)
    with RawServer(record) as server:
        base = f"http://trainer:pass-s3cret@127.0.0.1:{server.port}/?token=tok3n-s3cret"
        async with RewardClient(base) as client:
            ok = await client.score(ANSWER, "42")
        # a key read from a file with its newline: httpx refuses it, quoting the value
        bad = {"Authorization": "Bearer sk-VERYSECRET123\n"}
        async with RewardClient(server.base_url, headers=bad) as client:
            refused = await client.score(ANSWER, "42")
    assert (ok.score, ok.failed) == (1.0, False)
    # the query kept, after the path (of /health too, where the metric names are read)
    assert ("POST", "/api/v1?token=tok3n-s3cret") in targets
    assert {t for _, t in targets} <= {"/api/v1?token=tok3n-s3cret", "/health?token=tok3n-s3cret"}
    assert refused.failed and refused.reason is not None
    assert "LocalProtocolError" in refused.reason
    for secret in ("pass-s3cret", "tok3n-s3cret", "VERYSECRET123"):
        assert secret not in refused.reason
        assert secret not in caplog.text
    assert "HTTP Request: POST http://127.0.0.1" in caplog.text  # httpx's line, without them


async def test_a_compressed_answer_is_refused_before_it_is_inflated() -> None:
    bomb = gzip.compress(b"[" * 50_000_000)  # 50 MB inflated, about 50 KB sent
    seen = []

    async def compressed(method: str, target: str, writer: Writer) -> None:
        head = b"HTTP/1.1 200 X\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        await send(writer, head % len(bomb) + bomb)

    async def record(method: str, target: str, writer: Writer) -> None:
        seen.append(target)
        await send(writer, http(200, GOOD))

    with RawServer(compressed) as server:
        async with RewardClient(server.base_url) as client:
            result = await client.score(ANSWER, "42")
    assert result.failed and result.reason is not None
    assert result.reason.startswith("the answer was cut: it is compressed (gzip)")
    with RawServer(record) as server:
        async with RewardClient(server.base_url) as client:
            assert (await client.score(ANSWER, "42")).score == 1.0  # identity asked, and taken


async def test_secrets_in_an_error_page_are_blanked_before_it_is_cut() -> None:
    key = "sk-live-0123456789abcdef"
    page = b"x" * 190 + key.encode() + b" and the rest of a proxy's page" * 1000
    with RawServer(answering(page, 502)) as server:
        async with RewardClient(server.base_url, headers={"X-Api-Key": key}) as client:
            result = await client.score(ANSWER, "42")
    assert result.failed and result.reason is not None
    assert result.reason.startswith("HTTP 502: xxx") and len(result.reason) <= 2000
    assert key[:10] not in result.reason


async def test_header_values_given_as_bytes_still_fail_as_a_score() -> None:
    down = f"http://127.0.0.1:{free_port()}"
    async with RewardClient(down, headers={"Authorization": b"Bearer sk-bytes-secret"}) as client:  # type: ignore[dict-item]
        result = await client.score(ANSWER, "42", timeout=2)
    assert result.failed and result.reason is not None and "ConnectError" in result.reason


def test_clients_are_shared_by_url_and_options() -> None:
    url = "http://127.0.0.1:9/api/v1"  # never called
    assert shared_client(url, timeout=2) is shared_client(url, timeout=2)
    assert shared_client(url, timeout=2).timeout == 2
    assert shared_client(url, timeout=100).timeout == 100  # not the first one's deadline
    # httpx.Headers hides an Authorization in its repr: each key its own client all the same
    first = shared_client(url, headers=httpx.Headers({"Authorization": "Bearer key-one-111"}))
    other = shared_client(url, headers=httpx.Headers({"Authorization": "Bearer key-two-222"}))
    assert first is not other


def test_bad_settings_are_errors_that_name_them(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="concurrency must be a whole number >= 1, not 0"):
        RewardClient("http://127.0.0.1:9", concurrency=0)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0, not nan"):
        RewardClient("http://127.0.0.1:9", timeout=float("nan"))
    with pytest.raises(ValueError, match="not a valid http") as raised:
        RewardClient("http://user:pass-s3cret@[::1")
    assert "pass-s3cret" not in str(raised.value)
    monkeypatch.setenv("AGENTIC_RL_REWARD_TIMEOUT", "abc")
    with pytest.raises(ValueError, match="AGENTIC_RL_REWARD_TIMEOUT='abc' is not a number"):
        AReaLReward("http://127.0.0.1:9")("q", "42")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from started("workspace.trainer_fns:MatchReward")


@FORKS_THREADS
def test_a_trl_reward_function_made_before_a_fork_scores_in_the_child(server: Server) -> None:
    trl = trl_reward_func(server.url)
    assert trl(["q"], ["42"], answer=["42"]) == [1.0]  # the parent's client, on its loop
    assert in_forked_child(lambda: trl(["q"], ["42"], answer=["42"])) == [1.0]
    assert trl(["q"], ["42"], answer=["42"]) == [1.0]  # and the parent's still works
