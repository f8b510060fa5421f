"""The reward client and the trainers' in-process hooks, against a real served function."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import Server, free_port
from helpers import FORKS_THREADS, in_forked_child, metric_sample, started, wait_for

from processors_base import client as client_module
from processors_base.client import RewardClient
from processors_base.trainer_hooks import (
    AREAL_TIMEOUT,
    AReaLReward,
    areal_reward_fn,
    trl_reward_func,
    verl_compute_score,
    verl_compute_score_batch,
    verl_compute_score_sync,
)

TARGET = "workspace.trainer_fns:MatchReward"
ANSWER = [{"role": "assistant", "content": "42"}]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from started(TARGET, "--timeout", "3")


async def test_score_and_failure_reason(server: Server) -> None:
    async with RewardClient(server.url) as client:
        ok = await client.score(ANSWER, "42")
        assert (ok.score, ok.failed, ok.reason) == (1.0, False, None)
        assert ok.metrics["messages"] == 1.0
        raised = await client.score([{"role": "assistant", "content": "RAISE"}], "42")
        assert raised.failed and raised.score == 0.0
        assert raised.reason is not None
        assert raised.reason.startswith("HTTP 500: PROCESSOR_ERROR: ValueError: the judge broke")
        assert raised.metrics["messages"] == 0.0  # the same keys as a success


async def test_deadline_bounds_a_hanging_call(server: Server) -> None:
    async with RewardClient(server.url + "/api/v1", timeout=1) as client:
        late = await client.score([{"role": "assistant", "content": "HANG"}], "42")
        assert late.failed and late.score == 0.0
        # the client's own 1 s deadline, not the server's 3 s one (an "HTTP 504: ..." reason)
        assert late.reason == "DEADLINE_EXCEEDED: no answer within 1s"


async def test_connection_refused_fails_within_the_deadline() -> None:
    async with RewardClient(f"http://127.0.0.1:{free_port()}", timeout=1) as client:
        result = await client.score(ANSWER, "42")
        # failed on the refusal itself, not retried until the deadline
        assert result.failed and result.reason is not None and "ConnectError" in result.reason


def _metric(server: Server, name: str) -> float:
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def test_503_is_retried_after_retry_after() -> None:
    server = Server(TARGET, "--concurrency", "1", "--queue", "0", "--timeout", "2")
    try:
        server.wait_ready()
        hang = {"agent_output": {"messages": [{"role": "assistant", "content": "HANG"}]}}
        blocker = threading.Thread(target=server.post, args=(hang,))
        blocker.start()
        deadline = time.monotonic() + 20
        while _metric(server, "rl_function_requests_in_flight") < 1:
            assert time.monotonic() < deadline, "the blocking request never started"
            await asyncio.sleep(0.02)
        async with RewardClient(server.url, timeout=20) as client:
            result = await client.score(ANSWER, "42")  # 503 until the blocker's 504 frees the slot
        blocker.join()
        assert (result.score, result.failed) == (1.0, False)
        assert _metric(server, "rl_function_rejected_total") >= 1  # it was refused, then retried
    finally:
        server.close()


async def test_verl_compute_score_as_verls_reward_loop_calls_it(server: Server) -> None:
    # verl's reward loop awaits an async compute_score with these keywords, and the
    # custom_reward_function.reward_kwargs bound in (here the URL)
    results = await asyncio.gather(
        *(
            verl_compute_score(
                data_source="openai/gsm8k",
                solution_str=answer,
                ground_truth="42",
                extra_info={"index": 3, "split": "train"},
                reward_router_address=None,
                reward_model_tokenizer=None,
                url=server.url,
            )
            for answer in ("42", "41", "RAISE")
        )
    )
    assert [r["score"] for r in results] == [1.0, 0.0, 0.0]
    assert [r["reward_failed"] for r in results] == [0.0, 0.0, 1.0]
    assert results[0].keys() == results[2].keys()  # verl stacks the keys of every sample
    # a sync reward manager runs it in an executor
    loop = asyncio.get_running_loop()
    sync = await loop.run_in_executor(
        None,
        lambda: verl_compute_score_sync(
            data_source="openai/gsm8k", solution_str="42", ground_truth="42", url=server.url
        ),
    )
    assert sync["score"] == 1.0


def test_trl_reward_function_with_its_column_kwargs(server: Server) -> None:
    reward = trl_reward_func(server.url, name="match")
    assert reward.__name__ == "match"
    prompt = [{"role": "user", "content": "What is 6*7?"}]
    scores = reward(
        prompts=[prompt, prompt, prompt],
        completions=[
            [{"role": "assistant", "content": "42"}],
            [{"role": "assistant", "content": "41"}],
            [{"role": "assistant", "content": "RAISE"}],
        ],
        completion_ids=[[1], [2], [3]],
        answer=["42", "42", "42"],
        difficulty=[1, 2, 3],
        trainer_state=object(),
    )
    assert scores == [1.0, 0.0, 0.0]
    leave_out = trl_reward_func(server.url, failed_value=None)
    assert leave_out(prompts=["q"], completions=["RAISE"], solution=["42"]) == [None]
    assert leave_out(prompts=["q"], completions=["42"], solution=["42"]) == [1.0]


@FORKS_THREADS
def test_areal_reward_fn_from_a_process_pool(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTIC_RL_REWARD_URL", server.url)
    assert areal_reward_fn("What is 6*7?", "42", [1, 2], [3], answer="42") == 1.0
    assert areal_reward_fn("What is 6*7?", "RAISE", [1, 2], [3], answer="42") == 0.0
    # AReaL runs reward functions in a pool of processes (forked: the client's background
    # loop thread did not survive the fork, and the child must start its own)
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        assert pool.submit(areal_reward_fn, "q", "42", [1], [2], answer="42").result(60) == 1.0


@FORKS_THREADS
def test_a_forked_child_does_not_inherit_a_held_client_lock(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTIC_RL_REWARD_URL", server.url)
    assert areal_reward_fn("q", "42", [1], [2], answer="42") == 1.0  # the parent's client
    # The process's client lock, held at the fork (as by a trainer thread making its first
    # client): the child's copy of it is held by no one there, and must not be waited on.
    with client_module._lock:
        assert in_forked_child(lambda: areal_reward_fn("q", "42", [1], [2], answer="42")) == 1.0


# --- odd values, failed scores, deadlines on the trainers' side -------------------------

NAN = float("nan")


async def test_non_finite_dataset_values_never_raise(server: Server) -> None:
    verl = await verl_compute_score(
        data_source="d",
        solution_str="42",
        ground_truth="42",
        extra_info={"difficulty": NAN, "weights": [1.0, float("inf")]},
        url=server.url,
    )
    assert (verl["score"], verl["reward_failed"]) == (1.0, 0.0)
    numeric = await verl_compute_score(
        data_source="d", solution_str="x", ground_truth=NAN, url=server.url
    )
    assert numeric["reward_failed"] == 0.0  # scored (as null), not an exception
    loop = asyncio.get_running_loop()
    trl = trl_reward_func(server.url)
    scores = await loop.run_in_executor(
        None, lambda: trl(prompts=["q"], completions=["42"], answer=["42"], weight=[NAN])
    )
    assert scores == [1.0]
    areal = AReaLReward(server.url)
    assert await loop.run_in_executor(None, lambda: areal("q", "42", answer="42", w=NAN)) == 1.0


async def test_one_deadline_covers_waiting_for_a_slot(server: Server) -> None:
    hang = [{"role": "assistant", "content": "HANG"}]
    async with RewardClient(server.url, concurrency=1) as client:
        # the first holds the only slot until the server's 3 s deadline answers it; the
        # second's 1 s deadline runs out while it waits for that slot
        first, second = await asyncio.gather(
            client.score(hang, timeout=30), client.score(hang, timeout=1)
        )
    assert first.failed and first.reason is not None and first.reason.startswith("HTTP 504")
    assert second.reason == "DEADLINE_EXCEEDED: no answer within 1s (waiting for one of 1 slots)"


async def test_failed_status_scores_zero_everywhere(server: Server) -> None:
    answer = [{"role": "assistant", "content": "FAILEDSCORE"}]
    async with RewardClient(server.url) as client:
        result = await client.score(answer)
    assert (result.score, result.failed) == (0.0, True)
    assert result.reason is not None and "judge unsure" in result.reason
    verl = await verl_compute_score(
        data_source="d", solution_str="FAILEDSCORE", ground_truth="42", url=server.url
    )
    assert (verl["score"], verl["reward_failed"]) == (0.0, 1.0)
    loop = asyncio.get_running_loop()
    areal = AReaLReward(server.url)
    assert await loop.run_in_executor(None, lambda: areal("q", "FAILEDSCORE")) == 0.0
    trl = trl_reward_func(server.url, failed_value=-1.0)
    assert await loop.run_in_executor(None, lambda: trl(["q"], ["FAILEDSCORE"])) == [-1.0]


def test_areal_timeout_from_its_argument_and_the_environment(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert AREAL_TIMEOUT < 15  # AReaL's AsyncRewardWrapper waits 15 s
    # A call that gives up at its 0.5 s leaves before the server's 3 s deadline answers it:
    # the server counts a 499 (the client left), never a 504.
    gone = 'rl_function_requests_total{func_type="reward",path="/api/v1",status="499"}'
    left = metric_sample(server, gone) or 0.0
    assert AReaLReward(server.url, timeout=0.5)("q", "HANG") == 0.0
    wait_for(lambda: metric_sample(server, gone) == left + 1, "the server to see the call leave")
    monkeypatch.setenv("AGENTIC_RL_REWARD_URL", server.url)
    monkeypatch.setenv("AGENTIC_RL_REWARD_TIMEOUT", "0.5")
    assert areal_reward_fn("q", "HANG") == 0.0
    wait_for(lambda: metric_sample(server, gone) == left + 2, "the server to see the call leave")


async def test_every_result_carries_every_metric_name_seen() -> None:
    server = Server("workspace.trainer_fns:KeysReward")
    try:
        server.wait_ready()
        async with RewardClient(server.url) as client:
            first = await client.score([{"role": "assistant", "content": "a"}])
            second = await client.score([{"role": "assistant", "content": "b"}])
        assert first.metrics == {"a": 1.0}
        assert second.metrics == {"a": 0.0, "b": 1.0}  # verl stacks keys across samples
    finally:
        server.close()


def test_verl_batch_deadlines_run_from_each_call_not_from_the_batch() -> None:
    """40 samples of 0.2 s through 4 slots take 2 s: with a 1 s deadline from the batch's
    start, every sample past the first 20 would fail; each is timed from when it is sent."""
    server = Server("workspace.verl_fns:VerlBatchReward")
    try:
        server.wait_ready()
        results = verl_compute_score_batch(
            ["src"] * 40,
            ["7"] * 40,
            ["7"] * 40,
            [{"index": i, "sleep": 0.2} for i in range(40)],
            url=server.url,
            concurrency=4,
            timeout=1.5,
        )
    finally:
        server.close()
    assert [r["reward_failed"] for r in results] == [0.0] * 40
    assert [r["index"] for r in results] == [float(i) for i in range(40)]  # in order
    with pytest.raises(ValueError, match="differ in length: 2, 1, 2, 1"):
        verl_compute_score_batch(["a", "b"], ["7"], ["7", "7"], url=server.url)
