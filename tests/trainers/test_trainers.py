"""The trainer protocols, driven by stand-ins that send exactly what each trainer sends.

Wire shapes, as read from the trainers' sources:
- OpenRLHF's SingleTurnAgentExecutor (``openrlhf/utils/agent.py``): aiohttp POST of
  ``{"query": [...], "prompts": [...], "labels": [...]}``, 180 s total, 5 tries 1 s apart;
  it reads ``rewards``, ``scores`` and ``extra_logs`` from the answer.
- slime's ``remote_rm`` (``slime/rollout/rm_hub/__init__.py``): POST of
  ``{"prompt": sample.prompt, "response": sample.response, "label": sample.label}``, 120 s
  total; the JSON answer is the sample's reward; ``get_reward_value`` indexes it with
  ``--reward-key`` when set.
- NeMo Gym's ``SimpleResourcesServer`` (``nemo_gym/base_resources_server.py``):
  ``/seed_session`` and ``/verify``; verify takes ``responses_create_params`` and
  ``response`` (a Responses API object) plus the row's columns, and answers them back with
  ``reward`` (and ``reward_components`` for several objectives).
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Server, reward_body
from helpers import started, wait_for

from runtime.config import Settings

TARGET = "workspace.trainer_fns:MatchReward"
PROMPT = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"


def _started(
    *args: str, target: str = TARGET, env: dict[str, str] | None = None
) -> Iterator[Server]:
    return started(target, *args, env=env)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from _started("--trainer-timeout", "3")


@pytest.fixture(scope="module")
def strict() -> Iterator[Server]:
    yield from _started("--trainer-timeout", "3", "--trainer-errors", "error")


# --- the stand-ins ---------------------------------------------------------------------


def openrlhf(
    server: Server,
    queries: list[str],
    prompts: list[str],
    labels: list[Any],
    headers: dict[str, str] | None = None,
):
    """As OpenRLHF's reward executor posts (0.9.1+: one sample, lists of one)."""
    payload = {"query": queries, "prompts": prompts, "labels": labels}
    return server.client.post("/openrlhf/get_reward", json=payload, headers=headers, timeout=180)


def slime(server: Server, prompt: Any, response: str, label: Any, reward_key: str = ""):
    payload = {"prompt": prompt, "response": response, "label": label}
    url = "/slime/reward" + (f"?reward_key={reward_key}" if reward_key else "")
    return server.client.post(url, json=payload, timeout=120)


def gym_row(answer: str, expected: str = "42") -> dict[str, Any]:
    """A NeMo Gym dataset row plus the policy's Responses API object, as /verify gets it."""
    tool = {"type": "function", "name": "calculator", "parameters": {"type": "object"}}
    return {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "You are a careful calculator."},
                {"role": "user", "content": "What is 6*7?"},
            ],
            "tools": [tool],
        },
        "response": {
            "id": "resp_1",
            "object": "response",
            "created_at": 1764460800,
            "model": "policy",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [tool],
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "calculator",
                    "arguments": '{"expr": "6*7"}',
                    "status": "completed",
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "42"},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": answer, "annotations": []}],
                },
            ],
        },
        "expected_answer": expected,
        "task_id": 7,
    }


def metric(server: Server, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    line_start = f"{name}{{{wanted}}} " if labels else f"{name} "
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.split()[-1])
    return 0.0


# --- OpenRLHF --------------------------------------------------------------------------


def test_openrlhf_single_sample(server: Server) -> None:
    answer = openrlhf(server, [PROMPT + "42"], [PROMPT], ["42"])
    assert answer.status_code == 200
    assert answer.json() == {
        "rewards": [1.0],
        "scores": [1.0],
        "extra_logs": {
            "messages": [2.0],  # the prompt as the user's turn, the response as the assistant's
            "user_turns": [1.0],
            "tool_turns": [0.0],
            "answer_chars": [2.0],  # the query minus its prompt
            "has_tools": [0.0],
            "reward_failed": [0.0],
            "prompt_mismatch": [0.0],
        },
    }


def test_openrlhf_batch_runs_samples_concurrently(server: Server) -> None:
    # PAIR only returns once a second PAIR runs at the same time: one after the other,
    # both would pass the deadline and be marked failed.
    queries = [PROMPT + a for a in ("42", "PAIR", "41", "PAIR", "RAISE")]
    labels = ["42", "PAIR", "42", "PAIR", "42"]
    answer = openrlhf(server, queries, [PROMPT] * 5, labels)
    assert answer.status_code == 200
    body = answer.json()
    assert body["rewards"] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert body["extra_logs"]["reward_failed"] == [0.0, 0.0, 0.0, 0.0, 1.0]
    # the failed sample still carries every metric name, so the trainer can stack them
    assert body["extra_logs"]["messages"] == [2.0, 2.0, 2.0, 2.0, 0.0]
    # the two PAIRs scored 1.0: they ran together (one after the other, each would have
    # waited for the other until the deadline)


def test_openrlhf_query_without_prompts(server: Server) -> None:
    # OpenRLHF's older remote_rm_fn posted the templated queries alone
    answer = server.client.post("/openrlhf/get_reward", json={"query": ["42"]})
    assert answer.status_code == 200
    assert answer.json()["extra_logs"]["messages"] == [1.0]


def test_openrlhf_raise_and_hang_give_zero_and_a_mark(server: Server) -> None:
    before = metric(
        server,
        "rl_function_trainer_reward_failures_total",
        protocol="openrlhf",
        error_code="DEADLINE_EXCEEDED",
    )
    # HANG never returns: the answer is --trainer-timeout's (3 s), far inside OpenRLHF's 180 s
    answer = openrlhf(server, [PROMPT + "HANG"], [PROMPT], ["42"])
    assert answer.status_code == 200
    assert answer.json()["rewards"] == [0.0]
    assert answer.json()["extra_logs"]["reward_failed"] == [1.0]
    after = metric(
        server,
        "rl_function_trainer_reward_failures_total",
        protocol="openrlhf",
        error_code="DEADLINE_EXCEEDED",
    )
    assert after == before + 1
    raised = openrlhf(server, [PROMPT + "RAISE"], [PROMPT], ["42"])
    assert raised.json()["rewards"] == [0.0]
    assert raised.json()["extra_logs"]["reward_failed"] == [1.0]
    # the log's own thread writes the line: it may trail the answer
    log = server.wait_output("reward failed, answered 0 and marked it: PROCESSOR_ERROR")
    assert "the judge broke" in log


def test_openrlhf_bad_request_is_an_error_not_a_zero(server: Server) -> None:
    answer = server.client.post(
        "/openrlhf/get_reward", json={"query": ["a", "b"], "prompts": ["a"], "labels": [1, 2]}
    )
    assert answer.status_code == 422
    assert answer.json()["error_code"] == "INVALID_INPUT"
    assert server.client.post("/openrlhf/get_reward", content=b"{").status_code == 400


# --- slime -----------------------------------------------------------------------------


def test_slime_without_reward_key_answers_a_number(server: Server) -> None:
    answer = slime(server, "What is 6*7?", "42", "42")
    assert answer.status_code == 200
    assert answer.json() == 1.0
    assert slime(server, "What is 6*7?", "41", "42").json() == 0.0
    assert slime(server, "What is 6*7?", "RAISE", "42").json() == 0.0


def test_slime_with_reward_key_answers_a_dict(server: Server) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6*7?"},
    ]
    answer = slime(server, messages, "42", "42", reward_key="reward")
    assert answer.status_code == 200
    body = answer.json()
    assert body["reward"] == 1.0  # what slime's get_reward_value picks with --reward-key reward
    assert body["reward_failed"] is False
    assert body["messages"] == 3.0  # the prompt's messages and the response
    failed = slime(server, messages, "RAISE", "42", reward_key="reward").json()
    assert failed["reward"] == 0.0
    assert failed["reward_failed"] is True
    assert failed["messages"] == 0.0  # same keys as a success
    assert slime(server, None, "x", None).status_code == 200  # a null label is allowed
    assert (
        server.client.post("/slime/reward", json={"prompt": "p", "response": 3}).status_code == 422
    )


# --- NeMo Gym --------------------------------------------------------------------------


def test_gym_seed_session_and_verify(server: Server) -> None:
    seeded = server.client.post("/nemo-gym/seed_session", json={})
    assert seeded.status_code == 200
    assert seeded.json() == {}
    row = gym_row("42")
    answer = server.client.post("/nemo-gym/verify", json=row)
    assert answer.status_code == 200
    body = answer.json()
    assert body["reward"] == 1.0
    assert {k: body[k] for k in row} == row  # the row comes back as it was sent
    assert body["reward_components"] == {
        "messages": 5.0,  # system, user, the tool call, its output, the answer
        "user_turns": 1.0,
        "tool_turns": 1.0,
        "answer_chars": 2.0,
        "has_tools": 1.0,
        "reward_failed": 0.0,
    }
    assert (body["mask_sample"], body["failure_kind"], body["failure_reason"]) == (
        False,
        None,
        None,
    )
    assert server.client.post("/nemo-gym/verify", json=gym_row("41")).json()["reward"] == 0.0


def test_gym_failure_is_zero_with_a_reason(server: Server) -> None:
    body = server.client.post("/nemo-gym/verify", json=gym_row("RAISE")).json()
    assert body["reward"] == 0.0
    assert body["reward_components"]["reward_failed"] == 1.0
    assert body["failure_reason"].startswith("PROCESSOR_ERROR: ValueError: the judge broke")
    late = server.client.post("/nemo-gym/verify", json=gym_row("HANG"), timeout=60).json()
    assert late["reward"] == 0.0
    assert late["failure_reason"].startswith("DEADLINE_EXCEEDED")


# --- --trainer-errors error, overload, prefix, isolation ---------------------------------


def test_trainer_errors_error_restores_http_errors(strict: Server) -> None:
    raised = openrlhf(strict, [PROMPT + "RAISE"], [PROMPT], ["42"])
    assert raised.status_code == 500
    assert raised.json()["error_code"] == "PROCESSOR_ERROR"
    late = slime(strict, "q", "HANG", "42")
    assert late.status_code == 504
    assert late.json()["error_code"] == "DEADLINE_EXCEEDED"
    assert openrlhf(strict, [PROMPT + "42"], [PROMPT], ["42"]).json()["rewards"] == [1.0]
    assert (
        metric(
            strict,
            "rl_function_trainer_requests_total",
            protocol="openrlhf",
            status="500",
        )
        == 1.0
    )


def test_batch_larger_than_the_queue_runs_in_chunks() -> None:
    for server in _started("--concurrency", "1", "--queue", "1", "--trainer-timeout", "20"):
        # five samples, two places: they run two at a time, each handing its place on
        answer = openrlhf(server, [PROMPT + "42"] * 5, [PROMPT] * 5, ["42"] * 5)
        assert answer.status_code == 200
        assert answer.json()["rewards"] == [1.0] * 5
        assert metric(server, "rl_function_rejected_total") == 0.0
        # while both places are taken, a batch is answered 503 at once
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            hung = [pool.submit(slime, server, "q", "STUBBORN 4", "42") for _ in range(2)]
            wait_for(lambda s=server: metric(s, "rl_function_requests_in_flight") >= 1)
            wait_for(lambda s=server: metric(s, "rl_function_requests_queued") >= 1)
            full = openrlhf(server, [PROMPT + "42"] * 3, [PROMPT] * 3, ["42"] * 3)
            assert full.status_code == 503
            assert full.headers["retry-after"] == "1"
            assert full.json()["error_code"] == "OVERLOADED"
            assert [f.result().json() for f in hung] == [0.0, 0.0]
        assert metric(server, "rl_function_rejected_total") == 1.0


def test_prefix_and_process_isolation_kill_a_hung_sync_reward() -> None:
    target = "workspace.trainer_fns:SyncHangReward"
    args = ("--trainer-prefix", "/trainers", "--isolation", "process", "--processes", "1")
    for server in _started(*args, "--trainer-timeout", "3", target=target):
        assert server.client.post("/slime/reward", json={}).status_code == 404
        payload = {"prompt": "q", "response": "HANG", "label": None}
        late = server.client.post("/trainers/slime/reward?reward_key=r", json=payload, timeout=60)
        assert late.json() == {"r": 0.0, "reward_failed": True}
        server.wait_output("isolation process was killed and replaced")
        payload["response"] = "fine"
        ok = server.client.post("/trainers/slime/reward", json=payload, timeout=60)
        assert ok.json() == 1.0


def test_not_a_reward_function() -> None:
    for server in _started(target="workspace.fns:EchoGroupReward"):
        answer = server.client.post("/nemo-gym/verify", json=gym_row("42"))
        assert answer.status_code == 404
        assert "reward processors" in answer.json()["error"]


def test_trainer_settings_are_validated() -> None:
    server = Server(TARGET, "--trainer-errors", "maybe")
    try:
        assert server.proc.wait(30) == 2
        assert "--trainer-errors" in server.output()
    finally:
        server.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/health", timeout=1)


# --- Gym at the root, rewards that resist their deadline, odd outputs -------------------


def test_gym_routes_at_the_root_where_gym_posts(server: Server) -> None:
    # NeMo Gym's client posts to http://HOST:PORT/verify: no path prefix can be configured
    assert server.client.post("/seed_session", json={}).json() == {}
    answer = server.client.post("/verify", json=gym_row("42"))
    assert answer.status_code == 200
    assert answer.json()["reward"] == 1.0
    assert answer.json()["reward_components"]["reward_failed"] == 0.0


def test_a_reward_that_swallows_cancellation_is_answered_at_the_deadline() -> None:
    for server in _started("--trainer-timeout", "2"):
        answer = openrlhf(server, [PROMPT + "STUBBORN 8", PROMPT + "42"], [PROMPT] * 2, [42] * 2)
        assert answer.status_code == 200
        assert answer.json()["rewards"] == [0.0, 1.0]
        assert answer.json()["extra_logs"]["reward_failed"] == [1.0, 0.0]
        # answered at the 2 s deadline, not when the task gives up at 8 s: after the answer
        # it keeps being cancelled, is counted as stuck, and its place is given back
        wait_for(lambda s=server: metric(s, "rl_function_stuck_sync_calls") == 1.0)
        server.wait_output("ignores its cancellation")
        fine = slime(server, "q", "42", "42")
        assert fine.json() == 1.0
        wait_for(lambda s=server: metric(s, "rl_function_stuck_sync_calls") == 0.0)


def test_non_finite_odd_and_self_failed_outputs_are_failed_samples(server: Server) -> None:
    answers = ["42", "NAN", "NONE", "TEXT", "FAILEDSCORE"]
    answer = openrlhf(server, [PROMPT + a for a in answers], [PROMPT] * 5, ["42"] * 5)
    assert answer.status_code == 200  # one odd output does not sink the batch
    body = answer.json()
    assert body["rewards"] == [1.0, 0.0, 0.0, 0.0, 0.0]  # failed is 0.0, whatever its score
    assert body["extra_logs"]["reward_failed"] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert "m" not in body["extra_logs"]  # the NaN metric never reaches the trainer as null
    gym = server.client.post("/verify", json=gym_row("NAN")).json()
    assert gym["reward"] == 0.0
    assert gym["failure_reason"].startswith("INVALID_OUTPUT")
    assert None not in gym["reward_components"].values()
    assert slime(server, "q", "FAILEDSCORE", "42").json() == 0.0
    invalid = metric(
        server,
        "rl_function_trainer_reward_failures_total",
        protocol="openrlhf",
        error_code="INVALID_OUTPUT",
    )
    assert invalid == 3.0


def test_metric_keys_of_a_decorated_reward_are_known_from_the_start() -> None:
    for server in _started(target="workspace.trainer_fns:JudgedReward"):
        keys = {"format", "answer", "format.failed", "answer.failed", "reward_failed"}
        first = slime(server, "q", "42", "42", reward_key="reward").json()
        assert set(first) == keys - {"reward_failed"} | {"reward", "reward_failed"}
        assert first["answer.failed"] == 0.0
        later = openrlhf(server, [PROMPT + "RAISE"], [PROMPT], ["42"]).json()["extra_logs"]
        assert set(later) == keys | {"prompt_mismatch"}
        assert later["answer.failed"] == [1.0]


def test_metric_keys_are_the_union_within_a_batch_and_kept_after() -> None:
    for server in _started(target="workspace.trainer_fns:KeysReward"):
        logs = openrlhf(server, [PROMPT + "a", PROMPT + "b"], [PROMPT] * 2, [None] * 2).json()
        assert logs["extra_logs"]["a"] == [1.0, 0.0]
        assert logs["extra_logs"]["b"] == [0.0, 1.0]
        after = openrlhf(server, [PROMPT + "c"], [PROMPT], [None]).json()["extra_logs"]
        assert (after["a"], after["b"], after["c"]) == ([0.0], [0.0], [1.0])


def test_openrlhf_truncated_prompt_end_tokens_and_mismatch(server: Server) -> None:
    # the README's example: the end token is not part of the answer
    ended = openrlhf(server, [PROMPT + "42<|im_end|>"], [PROMPT], ["42"]).json()
    assert ended["rewards"] == [1.0]
    assert ended["extra_logs"]["answer_chars"] == [2.0]
    # OpenRLHF left-truncates a long prompt: the query starts with the prompt's tail
    long_prompt = "<|im_start|>user\n" + "Think step by step. " * 20 + "6*7?<|im_end|>\n"
    truncated = long_prompt[40:] + "42<|endoftext|>"
    answer = openrlhf(server, [truncated], [long_prompt], ["42"]).json()
    assert answer["rewards"] == [1.0]
    assert answer["extra_logs"]["prompt_mismatch"] == [0.0]
    # a prompt that is not in the query: scored as the whole query, marked, counted, logged
    mismatched = openrlhf(server, ["something else 42"], [long_prompt], ["42"]).json()
    assert mismatched["extra_logs"]["prompt_mismatch"] == [1.0]
    assert metric(server, "rl_function_trainer_prompt_mismatches_total") == 1.0
    server.wait_output("a prompt is not part of its query")
    openrlhf(server, ["still else"], [long_prompt], ["42"])
    # a failure's line, logged after the second mismatch: once it is written, so would be a
    # second warning (lines leave the server's log thread in order)
    after = {"x-request-id": "after-the-second-mismatch"}
    openrlhf(server, [PROMPT + "RAISE"], [PROMPT], ["42"], headers=after)
    log = server.wait_output("request_id=after-the-second-mismatch")
    assert log.count("a prompt is not part of its query") == 1  # logged once


def test_slime_reserved_reward_key(server: Server) -> None:
    refused = slime(server, "q", "42", "42", reward_key="reward_failed")
    assert refused.status_code == 422
    assert "reserved" in refused.json()["error"]
    named_failed = slime(server, "q", "RAISE", "42", reward_key="failed").json()
    assert named_failed["failed"] == 0.0  # the reward, not the flag
    assert named_failed["reward_failed"] is True


def test_trainer_bodies_share_the_body_limits() -> None:
    for server in _started("--max-body", "3000", "--max-buffered", "3000"):
        padding = "x" * 2000
        for _ in range(4):  # each body is held in the budget until answered, then given back
            answer = slime(server, padding, "42", "42")
            assert answer.status_code == 200
        too_big = server.client.post("/slime/reward", content=b"{" + b" " * 4000 + b"}")
        assert too_big.status_code == 413
        assert too_big.json()["error_code"] == "BODY_TOO_LARGE"
        assert too_big.headers["connection"] == "close"  # its body was left unread


# --- failed samples, batch bounds, malformed Gym rows, renormalize ----------------------


def test_a_failed_sample_is_zero_in_every_score_field() -> None:
    # FAILEDMETRIC returns status failed with reward_score 1.0 and a "score" metric of 1.0
    for server in _started():
        body = openrlhf(server, [PROMPT + "42", PROMPT + "FAILEDMETRIC"], [PROMPT] * 2, [42] * 2)
        assert body.json()["rewards"] == [1.0, 0.0]
        assert body.json()["scores"] == [1.0, 0.0]  # OpenRLHF's dynamic filtering averages these
        assert body.json()["extra_logs"]["score"] == [0.0, 0.0]
        assert body.json()["extra_logs"]["reward_failed"] == [0.0, 1.0]
        assert slime(server, "q", "FAILEDMETRIC", "42").json() == 0.0
        for key in ("reward", "score"):
            answer = slime(server, "q", "FAILEDMETRIC", "42", reward_key=key).json()
            assert (answer[key], answer["score"], answer["reward_failed"]) == (0.0, 0.0, True)
        gym = server.client.post("/verify", json=gym_row("FAILEDMETRIC")).json()
        assert (gym["reward"], gym["reward_components"]["score"]) == (0.0, 0.0)
        assert gym["reward_components"]["reward_failed"] == 1.0


def test_a_batch_over_the_sample_limit_is_refused_before_any_sample_runs() -> None:
    for server in _started("--trainer-max-samples", "4"):
        assert openrlhf(server, [PROMPT + "42"] * 4, [PROMPT] * 4, [42] * 4).status_code == 200
        over = openrlhf(server, [PROMPT + "RAISE"] * 5, [PROMPT] * 5, [42] * 5)
        assert over.status_code == 413
        assert over.json()["error_code"] == "BODY_TOO_LARGE"
        assert "5 samples" in over.json()["error"]
        assert "at most 4 (--trainer-max-samples, TRAINER_MAX_SAMPLES)" in over.json()["error"]
        assert "the judge broke" not in server.output()  # no sample was scored


def test_the_issues_batch_of_750000_samples_is_refused_within_the_memory_bound() -> None:
    # 9.75 MB of one-character samples: once 1.9 GB of RSS and 152 s of a blocked loop
    count = 750_000
    for server in _started():
        answer = openrlhf(server, ["x"] * count, [""] * count, ["x"] * count)
        assert answer.status_code == 413
        # refused before it is parsed: its 2.25 million values would not fit --max-buffered
        assert "--max-buffered" in answer.json()["error"]
        assert server.client.get("/health").status_code == 200
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
        assert peak_kb < 512 * 1024  # the README's worst case per worker


def test_health_answers_while_a_batch_at_the_limit_is_validated(tmp_path: Path) -> None:
    limit = Settings().trainer_max_samples
    labels = ["42"] * (limit - 1) + ["PAUSE"]  # the last sample's validation blocks
    target = "workspace.trainer_fns:PausingReward"
    for server in _started(target=target, env={"PAUSE_DIR": str(tmp_path)}):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            batch = pool.submit(openrlhf, server, [PROMPT + "42"] * limit, [PROMPT] * limit, labels)
            try:
                wait_for(lambda b=batch: (tmp_path / "paused").exists() or b.done())
                assert not batch.done(), batch.result().text[:300]
                # validation is held up in user code: the event loop must not be
                assert server.client.get("/health", timeout=15).status_code == 200
            finally:
                (tmp_path / "release").touch()
            answer = batch.result()
        assert answer.status_code == 200
        assert answer.json()["rewards"] == [1.0] * limit


def test_a_batch_holds_its_samples_in_the_body_budget() -> None:
    # --max-body / --trainer-max-samples: each sample holds 1000 bytes of the 6000
    args = ("--max-body", "4000", "--max-buffered", "6000", "--trainer-max-samples", "4")
    for server in _started(*args, "--trainer-timeout", "5"):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            hung = pool.submit(openrlhf, server, [PROMPT + "HANG"] * 4, [PROMPT] * 4, [42] * 4)
            wait_for(lambda s=server: metric(s, "rl_function_requests_in_flight") >= 1)
            full = openrlhf(server, [PROMPT + "42"] * 3, [PROMPT] * 3, [42] * 3)
            assert full.status_code == 503
            assert full.json()["error_code"] == "OVERLOADED"
            assert full.headers["retry-after"] == "1"
            assert slime(server, "q", "42", "42").json() == 1.0  # a single sample still fits
            assert hung.result().json()["rewards"] == [0.0] * 4
        assert openrlhf(server, [PROMPT + "42"] * 4, [PROMPT] * 4, [42] * 4).status_code == 200


def _gym_malformed() -> list[tuple[str, dict[str, Any]]]:
    """(what is wrong, the row): the issue's three shapes and their siblings."""
    shapes = []

    def shape(what: str, change: Callable[[dict[str, Any]], None]) -> None:
        row = gym_row("42")
        change(row)
        shapes.append((what, row))

    params = "responses_create_params"
    shape("input is a number", lambda r: r[params].update(input=5))
    shape("output is a number", lambda r: r["response"].update(output=7))
    shape(
        "a text part holds a number",
        lambda r: r["response"]["output"][3]["content"][0].update(text=5),
    )
    shape("an input item is a number", lambda r: r[params]["input"].append(5))
    shape("an input content part is text", lambda r: r[params]["input"][1].update(content=["hi"]))
    shape(
        "a refusal is a number",
        lambda r: r["response"]["output"][3]["content"].append({"type": "refusal", "refusal": 5}),
    )
    shape("a role is a number", lambda r: r[params]["input"][0].update(role=5))
    shape("an item type is a number", lambda r: r["response"]["output"][0].update(type=5))
    shape(
        "call arguments are an object",
        lambda r: r["response"]["output"][1].update(arguments={"expr": "6*7"}),
    )
    shape("a tool output is a number", lambda r: r["response"]["output"][2].update(output=42))
    shape("tools are a number", lambda r: r[params].update(tools=5))
    return shapes


def test_gym_malformed_rows_are_422_without_a_traceback() -> None:
    for server in _started():
        for what, row in _gym_malformed():
            answer = server.client.post("/verify", json=row)
            assert answer.status_code == 422, (what, answer.text)
            assert answer.json()["error_code"] == "INVALID_INPUT", what
            assert answer.json()["detail"][0]["field"], what  # names the offending field
        log = server.output()
        assert "Traceback" not in log and "INTERNAL_ERROR" not in log, log
        assert server.client.post("/verify", json=gym_row("42")).json()["reward"] == 1.0


def test_sub_reward_errors_renormalize_leaves_a_failed_judge_out() -> None:
    # correct (0.8) succeeds, style (0.2, the judge) times out: zero would give 0.8, fail 0.0
    target = "workspace.trainer_fns:StyleJudgedReward"
    for server in _started(target=target, env={"SUB_REWARD_ERRORS": "renormalize"}):
        timed_out = reward_body()
        timed_out["agent_output"]["messages"] = [{"role": "assistant", "content": "42 TIMEOUT"}]
        body = server.post(timed_out).json()
        assert body["status"] == "success"
        assert body["reward"]["reward_score"] == pytest.approx(1.0)  # 0.8 of 0.8, renormalised
        assert body["reward"]["reward_metrics"] == {
            "correct": 1.0,
            "style": 0.0,
            "style.failed": 1.0,
            "renormalized": 1.0,
        }
        plain = server.post(reward_body()).json()["reward"]  # nothing failed: unmarked
        assert plain == {
            "reward_score": pytest.approx(0.9),
            "reward_metrics": {"correct": 1.0, "style": 0.5},
        }
        both = reward_body()
        both["agent_output"]["messages"] = [{"role": "assistant", "content": "BOTH"}]
        failed = server.post(both).json()  # nothing left to renormalise: a failure
        assert (failed["status"], failed["error_code"]) == ("failed", "SUB_REWARD_ERROR")

        first = slime(server, "q", "42", "42", reward_key="reward").json()
        assert first["renormalized"] == 0.0  # a name known from the start, as the ".failed"
        answers = ["42 TIMEOUT", "42", "BOTH"]
        logs = openrlhf(server, [PROMPT + a for a in answers], [PROMPT] * 3, [42] * 3).json()
        assert logs["rewards"] == pytest.approx([1.0, 0.9, 0.0])
        assert logs["extra_logs"]["renormalized"] == [1.0, 0.0, 0.0]
        assert logs["extra_logs"]["style.failed"] == [1.0, 0.0, 1.0]
        assert logs["extra_logs"]["reward_failed"] == [0.0, 0.0, 1.0]

        assert slime(server, "q", "42 TIMEOUT", "42").json() == pytest.approx(1.0)
        keyed = slime(server, "q", "42 TIMEOUT", "42", reward_key="reward").json()
        assert (keyed["reward"], keyed["renormalized"], keyed["reward_failed"]) == (
            pytest.approx(1.0),
            1.0,
            False,
        )
        assert slime(server, "q", "BOTH", "42", reward_key="reward").json()["reward_failed"]
        server.wait_output("left out, the weights of the others renormalised")
