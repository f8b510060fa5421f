"""OpenRLHF 0.11.2's own ``SingleTurnAgentExecutor`` scoring through ``/openrlhf/get_reward``
(issue 22).

``openrlhf/utils/agent.py`` comes from OpenRLHF's wheel (``TRAINER_WHEELS``, see
``trainer_wheels.py``) and runs as written: it tokenizes the prompt, asks the engine for a
continuation, decodes prompt and response into the query and posts
``{"query", "prompts", "labels"}`` with aiohttp to ``--reward.remote_url``, then keeps
``rewards``, ``scores`` and ``extra_logs`` of the answer. Only what stands for the model is
ours: a character-level tokenizer and an engine that answers a set text (OpenRLHF's are
vLLM's and Hugging Face's); its logger factory is a plain ``logging.getLogger``.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import Server, free_port
from helpers import started
from trainer_wheels import load_module, needs_wheel, wheel

OPENRLHF_VERSION = "0.11.2"  # the release these tests prove
pytestmark = [needs_wheel("openrlhf", OPENRLHF_VERSION), pytest.mark.xdist_group("openrlhf")]

PROMPT = "What is 6*7?"
# MatchReward: 1.0 when the response is the label; RAISE raises; HANG never answers
TARGET = "workspace.trainer_fns:MatchReward"


class CharTokenizer:
    """Hugging Face's call and decode, a token per character."""

    def __call__(self, text: str, add_special_tokens: bool, return_tensors: str) -> Any:
        return {"input_ids": np.array([[ord(c) for c in text]])}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


class Engine:
    """vLLM's ``generate`` as OpenRLHF's executor awaits it: ``response`` as the output."""

    def __init__(self, response: str) -> None:
        self.response = response

    async def generate(self, prompt_ids: list[int], params: Any, **kwargs: Any) -> Any:
        output = types.SimpleNamespace(
            token_ids=[ord(c) for c in self.response], finish_reason="stop", logprobs=None
        )
        return types.SimpleNamespace(outputs=[output])


@pytest.fixture(scope="module")
def agent() -> types.ModuleType:
    return load_module(
        wheel("openrlhf", OPENRLHF_VERSION),
        f"openrlhf-{OPENRLHF_VERSION}.data/purelib/openrlhf/utils/agent.py",
        "openrlhf_agent",
        {"openrlhf.utils.logging_utils": {"init_logger": logging.getLogger}},
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from started(TARGET, "--timeout", "2")


def execute(agent: types.ModuleType, url: str, response: str, label: str = "42") -> Any:
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=f"{url}/openrlhf/get_reward")
    params = types.SimpleNamespace(max_tokens=16, logprobs=None)
    return asyncio.run(
        executor.execute(PROMPT, label, params, 1024, CharTokenizer(), Engine(response))
    )


def test_openrlhf_0_11_2_keeps_the_servers_reward_and_every_metric_key(
    agent: types.ModuleType, server: Server
) -> None:
    right = execute(agent, server.url, "42")
    wrong = execute(agent, server.url, "41")
    raised = execute(agent, server.url, "RAISE")
    late = execute(agent, server.url, "HANG")  # past the server's 2 s deadline
    refused = execute(agent, server.url, "FAILEDSCORE")  # failed, with a score of 0.9
    outputs = (right, wrong, raised, late, refused)
    # lists of one, as from OpenRLHF's own reward server (serve_rm): its samples generator
    # makes each a tensor of the sample's reward
    assert [o["reward"] for o in outputs] == [[1.0], [0.0], [0.0], [0.0], [0.0]]
    assert [o["scores"] for o in outputs] == [[1.0], [0.0], [0.0], [0.0], [0.0]]
    # the response as the function saw it: the query less its prompt, one user message
    assert right["extra_logs"]["user_turns"] == [1.0]
    assert right["extra_logs"]["answer_chars"] == [2.0]
    # the failures are marked, and every answer has the same keys (OpenRLHF stacks them)
    failed = [o["extra_logs"]["reward_failed"] for o in outputs]
    assert failed == [[0.0], [0.0], [1.0], [1.0], [1.0]]
    keys = set(right["extra_logs"])
    assert all(set(o["extra_logs"]) == keys for o in outputs)
    assert {"reward_failed", "prompt_mismatch", "messages", "answer_chars"} <= keys
    assert right["extra_logs"]["prompt_mismatch"] == [0.0]


def test_openrlhf_0_11_2_with_the_server_down_leaves_the_sample_unscored(
    agent: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenRLHF's own client, not ours, handles a server that is down: 5 tries a second
    apart, then it logs and leaves the sample's reward None (no crash of the executor)."""
    with caplog.at_level(logging.INFO):
        down = execute(agent, f"http://127.0.0.1:{free_port()}", "42")
    assert (down["reward"], down["scores"], down["extra_logs"]) == (None, None, {})
    assert "Failed to fetch reward from remote RM" in caplog.text
