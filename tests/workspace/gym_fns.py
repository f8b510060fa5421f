"""A reward for the NeMo Gym tests: ``MatchReward`` (``RAISE`` raises, ``HANG`` passes its
deadline, ``FAILEDSCORE`` says it failed), and ``JUDGEDOWN``, which calls a judge that is
not there (a loopback port nothing listens on) and says so as Gym names it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

from processors_base import Reward, RewardInput, RewardOutput, TaskStatus
from workspace.trainer_fns import MatchReward


@contextlib.contextmanager
def _closed_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound, never listened, for as long as it is
    used (closed, another process could listen on it, or a connection take it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _last_answer(input_data: RewardInput) -> str:
    messages = input_data.agent_output.messages or []
    said = [m.get("content") for m in messages if m.get("role") == "assistant"]
    return str(said[-1] or "").strip() if said else ""


class GymReward(MatchReward):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        if _last_answer(input_data) != "JUDGEDOWN":
            return await super().process(input_data)
        try:
            with _closed_port() as port:
                await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            return RewardOutput(
                reward=Reward(reward_score=0.0),
                status=TaskStatus.FAILED,
                error=f"the judge is unreachable: {exc!r}",
                error_code="judge_failed",  # Gym's failure kind for it
            )
        raise AssertionError("a judge answered on a closed port")
