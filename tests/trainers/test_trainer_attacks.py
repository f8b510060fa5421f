"""Hostile bodies and labels on the trainer protocols: what a review found still open after
the fixes of failed samples, batch bounds and Gym rows (the loop kept free for every
route, label values bounded, a failed sample of a batch findable)."""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from conftest import Server
from helpers import started

from processors_base import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    reward_func,
    sub_reward_func,
)
from processors_base.dispatch import Services, runtime_services
from processors_base.rewards import SubRewardErrors

OWN_CODE = "workspace.attack_fns:OwnCodeReward"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from started(OWN_CODE)


def _worst_health_while(server: Server, path: str, body: bytes) -> tuple[httpx.Response, float]:
    """The answer to ``body``, and the slowest /health answered while it was in flight as a
    share of the whole request: near 1 when the loop was held for the work (a share, not
    seconds, so that a loaded machine slowing both alike cannot fail it)."""
    worst, answered = 0.0, 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        began = time.monotonic()
        answer = pool.submit(server.client.post, path, content=body, timeout=300)
        with httpx.Client(base_url=server.url, timeout=120) as health:
            while not answer.done():
                started = time.monotonic()
                assert health.get("/health").status_code == 200
                worst = max(worst, time.monotonic() - started)
                answered += 1
        result = answer.result()
        total = time.monotonic() - began
    assert answered >= 3, f"/health answered {answered} times in {total:.2f}s"
    return result, worst / total


def test_a_gym_row_of_a_million_items_keeps_the_loop_free() -> None:
    # 3 MB of empty Responses API items: each was a pydantic model built on the event
    # loop (seconds of /health unanswered, about 1 KB of memory per item). Parsed and
    # validated they still take 460 MB, a 413 within the default --max-buffered: raised here.
    items = b",".join([b"{}"] * 1_000_000)
    body = b'{"responses_create_params":{"input":[' + items + b']},"response":{"output":[]}}'
    server = Server(OWN_CODE, "--max-buffered", str(2 * 1024**3))
    try:
        server.wait_ready()
        answer, worst = _worst_health_while(server, "/verify", body)
    finally:
        server.close()
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["reward"] == 1.0
    assert worst < 0.5, f"/health waited {worst:.0%} of the time a large row was validated"


def test_a_single_huge_openrlhf_sample_keeps_the_loop_free() -> None:
    # a 5 MB prompt that is not in its query (a 10 MB body): the prompt-overlap search ran
    # on the loop, and held a Python int and a list slot per character
    size = 5_000_000
    body = b'{"query":["' + b"b" * (size - 1) + b'a"],"prompts":["' + b"a" * size + b'"]}'
    server = Server(OWN_CODE)  # its own: the peak RSS of this request alone
    try:
        server.wait_ready()
        answer, worst = _worst_health_while(server, "/openrlhf/get_reward", body)
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["extra_logs"]["prompt_mismatch"] == [1.0]
        assert worst < 0.5, f"/health waited {worst:.0%} of the time one large sample was built"
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
        assert peak_kb < 200 * 1024, f"peak RSS {peak_kb // 1024} MB for one 10 MB sample"
    finally:
        server.close()


def _labels(server: Server, name: str) -> set[str]:
    found = set()
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(name + "{"):
            found.add(re.search(r'error_code="([^"]*)"', line).group(1))  # type: ignore[union-attr]
    return found


def test_a_functions_own_error_codes_never_become_label_values(server: Server) -> None:
    for n in range(3):
        answer = server.client.post(
            "/slime/reward", json={"prompt": "q", "response": f"CODE mine-{n}", "label": "x"}
        )
        assert answer.json() == 0.0
        server.client.post(
            "/openrlhf/get_reward", json={"query": [f"CODE batch-{n}"], "prompts": [""]}
        )
    for name in ("rl_function_trainer_reward_failures_total", "rl_function_results_total"):
        labels = _labels(server, name)
        assert not {label for label in labels if "mine-" in label or "batch-" in label}, (
            name,
            labels,
        )
        assert "OTHER" in labels, (name, labels)


def test_a_failed_sample_of_a_batch_is_named_by_its_place(server: Server) -> None:
    queries: list[Any] = ["ok", "ok", "RAISE", "ok"]
    answer = server.client.post(
        "/openrlhf/get_reward",
        json={"query": queries, "prompts": [""] * 4},
        headers={"x-request-id": "batch-7"},
    )
    assert answer.json()["extra_logs"]["reward_failed"] == [0.0, 0.0, 1.0, 0.0]
    log = server.wait_output("the judge broke request_id=batch-7")
    line = next(line for line in log.splitlines() if "the judge broke request_id=batch-7" in line)
    assert "sample 2 of 4" in line, line


@reward_func("zero_sum")
class _ZeroSum(AbstractRewardProcessor):
    """A bonus and a penalty of the same weight (they sum to 0); the penalty's judge fails."""

    @sub_reward_func("good", sub_weight=1.0)
    def good(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))

    @sub_reward_func("penalty", sub_weight=-1.0)
    def penalty(self, input_data: RewardInput) -> RewardOutput:
        raise TimeoutError("the penalty's judge timed out")


def test_renormalize_never_scales_the_weights_left_to_zero() -> None:
    # weights summing to 0: the bonus left alone would be scaled by 0 / 1, its signal erased
    # and the result a success of 0.0; the README: weights left of another sign than the
    # whole's (0 has none) cannot carry it, the result fails
    processor = _ZeroSum()
    lent = Services(sub_reward_errors=SubRewardErrors(mode="renormalize"))
    token = runtime_services.set(lent)  # as the runtime lends it around a call
    try:
        result = anyio.run(processor.process, RewardInput(agent_output={"messages": []}))
    finally:
        runtime_services.reset(token)
    assert result.status is TaskStatus.FAILED, result
    assert result.error_code == "SUB_REWARD_ERROR"
    assert "no sub-reward that succeeded carries weight to renormalise" in result.error


def test_a_gym_row_nested_past_the_encoders_limit_is_a_422_before_scoring(server: Server) -> None:
    # JSON is read up to 1024 levels deep, but written only up to 254: the answer echoes the
    # row, so a deeper column was scored and then answered 500 INTERNAL_ERROR, a traceback
    # in the log
    row: dict[str, Any] = {
        "responses_create_params": {"input": "q"},
        "response": {"output": [{"content": "CODE nested-row-scored"}]},
        "col": "[" * 300 + "]" * 300,
    }
    body = orjson.dumps(row).replace(b'"' + row["col"].encode() + b'"', row["col"].encode())
    answer = server.client.post("/verify", content=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error_code"] == "INVALID_INPUT"
    assert "nested" in answer.json()["error"]
    log = server.output()
    assert "Traceback" not in log and "INTERNAL_ERROR" not in log, log
    assert "nested-row-scored" not in log  # refused before the processor ran


def test_lone_surrogates_from_user_code_never_break_a_trainer_answer(server: Server) -> None:
    for answer in ("LONE_ERROR", "LONE_RAISE"):
        row = {"responses_create_params": {"input": "q"}, "response": {"output": []}}
        row["response"]["output"] = [{"content": answer}]
        gym = server.client.post("/verify", json=row)
        assert gym.status_code == 200, (answer, gym.text)
        assert gym.json()["reward"] == 0.0
        assert "sandbox said \\udcff" in gym.json()["failure_reason"], gym.json()
    # a metric name: it is kept for every later answer, so one such output broke them all
    first = server.client.post("/openrlhf/get_reward", json={"query": ["LONE_METRIC"]})
    assert first.status_code == 200, first.text
    assert first.json()["extra_logs"]["m\\udcff"] == [1.0]
    later = server.client.post("/openrlhf/get_reward", json={"query": ["fine"]})
    assert later.status_code == 200, later.text
    assert later.json()["rewards"] == [1.0]
    keyed = server.client.post("/slime/reward?reward_key=r", json={"prompt": "q", "response": "ok"})
    assert keyed.status_code == 200, keyed.text
    assert "Traceback" not in server.output()
