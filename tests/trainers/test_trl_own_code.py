"""TRL 1.16's own ``GRPOTrainer`` trains two steps against a served function (issue 22).

TRL needs torch: its code runs in a Python that has ``trl==1.16.0`` and torch, named in
``TRL_PYTHON`` (``.ci/run`` builds one), as one subprocess for the module
(``trl_driver.py``). Without one these tests skip, saying so. Each step's batch holds two
completions of each prompt ``PromptKindReward`` knows: scored, raising, hanging past the
server's deadline, and a failed result; a second run trains against a port where nothing
listens.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, free_port

TRL_VERSION = "1.16.0"  # the release these tests prove
TRL_PYTHON = os.environ.get("TRL_PYTHON") or None
DRIVER = Path(__file__).with_name("trl_driver.py")
pytestmark = pytest.mark.skipif(
    TRL_PYTHON is None,
    reason=f"TRL (trl=={TRL_VERSION} with torch) is not installed here: name a Python that "
    "has it and this project in TRL_PYTHON (.ci/run builds one)",
)


@pytest.fixture(scope="module")
def trl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What TRL logged, what the server scored (in the order it was asked) and the driver's
    log lines (one driver run for the module)."""
    assert TRL_PYTHON is not None
    where = tmp_path_factory.mktemp("trl")
    scores = where / "scores.jsonl"
    server = Server(
        "workspace.trainer_fns:PromptKindReward",
        "--timeout",
        "1",
        env={"SCORES_FILE": str(scores)},
    )
    try:
        server.wait_ready()
        down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        done = subprocess.run(
            [TRL_PYTHON, str(DRIVER), server.url, down],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-6000:]
        logged = json.loads(done.stdout.strip().splitlines()[-1])
        assert logged["version"] == TRL_VERSION
        seen = [json.loads(line) for line in scores.read_text().splitlines()]
        yield {"logged": logged, "seen": seen, "log": done.stderr, "down": down}
    finally:
        server.close()


def test_trl_logs_at_each_step_the_rewards_the_server_scored(trl: dict[str, Any]) -> None:
    steps = trl["logged"]["served"]["steps"]
    seen = trl["seen"]
    samples = list(trl["logged"]["served"]["samples"])
    assert [step["step"] for step in steps] == [1, 2]
    assert len(seen) == 20  # 10 completions a step, each asked once
    for step, asked in zip(steps, (seen[:10], seen[10:]), strict=True):
        # every kind in every step's batch: 2 scored prompts, a raise, a hang, a failed
        kinds = sorted(call["kind"] for call in asked)
        assert kinds == sorted(["score"] * 4 + ["raise", "hang", "failed"] * 2)
        # the raising, the timed-out and the failed samples are 0.0 (trl_reward_func's
        # failed_value), the others the server's own score
        values = [call["score"] if call["kind"] == "score" else 0.0 for call in asked]
        assert any(values), "no completion scored above 0: the check would prove little"
        # each sample's value, as TRL got it, is the server's for that completion
        scored = {
            (call["prompt"], call["completion"]): value
            for call, value in zip(asked, values, strict=True)
        }
        got = samples[: len(asked)]
        del samples[: len(asked)]
        assert [scored[s["prompt"], s["completion"]] for s in got] == [s["value"] for s in got]
        assert step["rewards/remote_reward/mean"] == pytest.approx(statistics.mean(values))
        # TRL's nanstd is the sample standard deviation (Bessel's correction)
        assert step["rewards/remote_reward/std"] == pytest.approx(statistics.stdev(values))


def test_a_server_that_is_down_costs_trl_seconds_not_the_call_timeout(
    trl: dict[str, Any],
) -> None:
    down = trl["logged"]["down"]
    assert [step["rewards/remote_reward/mean"] for step in down["steps"]] == [0.0, 0.0]
    # Without the circuit breaker each step retried for up to the client's 100 s deadline
    # ("gave up after 52 tries"); with it a step fails at once (0.03 s here).
    assert max(down["seconds"]) < 20, down["seconds"]
    # the first failure and the opening are logged once each, not once per sample
    lines = [line for line in trl["log"].splitlines() if trl["down"] in line]
    assert sum("cannot connect" in line for line in lines) == 1, lines
    assert sum("circuit open" in line for line in lines) == 1, lines
    assert not [line for line in lines if "scoring 0.0" in line], lines
