"""``eval`` against what a review found after the first round of fixes: control sequences
from the data or the job file reaching the terminal, an ``--out`` made a link to another
directory while eval runs, numbers and names the job file may hold that crashed it, a
malformed LLM URL, a ``$`` in a name that lost the page, an LLM that trickles its answer
past ``--llm-timeout``. Each runs eval as a subprocess, as the user does."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SAMPLES, free_port
from llm_stub import LLMStub
from test_eval import ANSWER, _env, _ours, job_file, run_eval
from test_platform_hostile import RawServer, controls, send

ECHO_REWARD = '''
from processors_base import AbstractRewardProcessor, RewardInput, RewardOutput


class EchoesTruth(AbstractRewardProcessor):
    """Its error names the line's ground truth, as many checks do."""

    async def process(self, input_data: RewardInput) -> RewardOutput:
        raise ValueError(f"expected {input_data.ground_truth}")
'''
EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b31m"


def test_control_sequences_in_data_and_names_never_reach_the_terminal(tmp_path: Path) -> None:
    """A reward whose error quotes a data line, and a function name from the job file:
    eval printed both raw (a window title set, the screen cleared)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "echo_fns.py").write_text(ECHO_REWARD)
    echo = {
        "type": "reward",
        "name": f"echo {EVIL}",
        "timeout": 30,
        "fcmodel": {"zipdir": str(workspace), "classpath": "echo_fns:EchoesTruth"},
    }
    config = job_file(tmp_path, [echo], teacher="teacher-model")
    data = tmp_path / "evil.jsonl"
    line = {"messages": [{"role": "user", "content": "1+1?"}], "ground_truth": f"2 {EVIL}"}
    data.write_text(json.dumps(line) + "\n")
    with LLMStub(free_port()) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "--data", str(data), "-n", "1", "-k", "1",
            "--out", "o",
        )  # fmt: skip
    assert done.returncode == 1, done.stderr  # its only call failed: stopped
    shown = done.stdout + done.stderr
    assert not controls(shown), sorted(controls(shown))
    assert "pwned" in shown and "Traceback" not in shown
    assert "expected 2 \\x1b]0;pwned\\x07\\x1b[2J" in done.stderr
    # the files keep the text as it was: JSON escapes it
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert f"echo {EVIL}" in summary["functions"]


def test_out_made_a_link_while_eval_runs_is_not_followed(tmp_path: Path) -> None:
    """``--out`` is checked, then, while eval runs, renamed away and replaced by a link to
    another directory (as the owner of a shared /tmp/calc-eval can): eval wrote its files,
    and replaced the user's own, in the directory the link points to."""
    marker, release = tmp_path / "called", tmp_path / "release"
    waits = _ours(
        "reward",
        "waits",
        "eval_fns:WaitsForRelease",
        runtime={"env": {"EVAL_MARKER": str(marker), "EVAL_RELEASE": str(release)}},
    )
    config = job_file(tmp_path, [waits], teacher="teacher-model")
    out, moved, victim = tmp_path / "shared", tmp_path / "moved", tmp_path / "victim"
    victim.mkdir()
    (victim / "summary.json").write_text("mine")
    with LLMStub(free_port()) as llm, (tmp_path / "err").open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "runtime", "eval", "-c", str(config), "-n", "1", "-k", "1",
             "--llm-base-url", llm.base_url, "--out", str(out)],
            cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), (tmp_path / "err").read_text()
        out.rename(moved)
        out.symlink_to(victim, target_is_directory=True)
        release.touch()
        assert process.wait(120) == 0, (tmp_path / "err").read_text()
    assert sorted(p.name for p in victim.iterdir()) == ["summary.json"]
    assert (victim / "summary.json").read_text() == "mine"
    # the files are in the directory that was checked, wherever it is now
    assert sorted(p.name for p in moved.iterdir()) == [
        "logs", "report.html", "summary.json", "trajectories.jsonl",
    ]  # fmt: skip
    assert (moved / "logs" / "waits.log").is_file()


SAMPLE_REWARD = {
    "type": "reward",
    "timeout": 30,
    "fcmodel": {"zipdir": str(SAMPLES), "classpath": "functions.reward.reward:DemoRewardProcessor"},
}


def test_a_long_function_name_or_a_dollar_in_it_loses_nothing(tmp_path: Path) -> None:
    """A 300-character name ended in ``OSError: File name too long`` and a traceback (it
    named the package's folder and log); ``cost$\\nosuch$`` read as matplotlib math lost
    the page."""
    long = {**SAMPLE_REWARD, "name": "n" * 300}
    dollar = {**SAMPLE_REWARD, "name": "cost$\\nosuch$"}
    config = job_file(tmp_path, [long, dollar], teacher="teacher-model")
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "1", "-k", "1", "--out", "o")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    out = tmp_path / "o"
    assert sorted(p.name for p in out.iterdir()) == [
        "logs", "report.html", "summary.json", "trajectories.jsonl",
    ]  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["functions"]["n" * 300]["calls"] == 1
    assert summary["functions"]["cost$\\nosuch$"]["calls"] == 1
    assert len(list((out / "logs").iterdir())) == 2


@pytest.mark.parametrize("field", ["timeout", "runtime.concurrency"])
def test_a_number_too_large_for_its_meaning_is_a_usage_error(tmp_path: Path, field: str) -> None:
    """``timeout`` of 401 digits ended in ``OverflowError`` and a traceback; ``job run`` sent
    such numbers to the platform as they were."""
    huge = 10**400
    function = {**ANSWER}
    if field == "timeout":
        function["timeout"] = huge
    else:
        function["runtime"] = {"concurrency": huge}
    config = job_file(tmp_path, [function], teacher="teacher-model")
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {config}:") and f"functions[0].{field}:" in line
    assert "less than or equal to" in line


@pytest.mark.parametrize(
    "url", ["http://[::1/v1", "http://127.0.0.1:8001/v1\n", "127.0.0.1:8001/v1"]
)
def test_a_malformed_llm_url_is_a_usage_error(tmp_path: Path, url: str) -> None:
    """``http://[::1/v1`` or a URL with its line break (``$(cat url.txt)``) ended in
    ``httpx.InvalidURL`` and a traceback."""
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    done = run_eval(config, "--llm-base-url", url)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: --llm-base-url ") and "is not an http(s) URL" in line


async def _trickle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
    """Headers at once, then a body of a byte a second (at most 300 s)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 300\r\n\r\n"
    if not await send(writer, head):
        return
    for _ in range(300):
        if not await send(writer, b" "):
            return
        await asyncio.sleep(1)


def test_llm_timeout_bounds_the_test_completion_whatever_the_llm_does(tmp_path: Path) -> None:
    """An endpoint that answers a byte a second never tripped httpx's per-read timeout:
    eval waited for the whole answer, far past --llm-timeout."""
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    with RawServer(_trickle) as server:
        started = time.monotonic()
        done = run_eval(
            config, "--llm-base-url", server.base_url, "--llm-timeout", "2", timeout=120
        )
        elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert elapsed < 30, elapsed
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "did not answer a one-token test completion within 2 s" in lines[0]


def test_llm_timeout_bounds_each_chat_completion_of_a_job_without_rollout(tmp_path: Path) -> None:
    """Without a rollout eval asks the LLM itself, through openai, whose timeout is httpx's,
    per read: a completion trickled a byte a second held the run far past --llm-timeout."""
    answered = 0
    completion = json.dumps(
        {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "OK"}}]}
    ).encode()  # fmt: skip

    async def first_at_once(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        answered += 1
        if answered == 1:  # the one-token test completion
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            await send(writer, head + f"Content-Length: {len(completion)}\r\n\r\n".encode())
            await send(writer, completion)
        else:
            await _trickle(method, target, writer)

    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    with RawServer(first_at_once) as server:
        started = time.monotonic()
        done = run_eval(
            config, "--llm-base-url", server.base_url, "--llm-timeout", "2", "-n", "1",
            "-k", "1", timeout=120,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr  # its only completion failed: stopped
    assert elapsed < 40, elapsed
    assert "CLIENT_TIMEOUT" in done.stderr and "within 2 s (--llm-timeout)" in done.stderr


def test_half_an_emoji_in_the_one_token_test_completion_is_an_answer(tmp_path: Path) -> None:
    """One token of an emoji is half of it: the test completion's lone surrogate was taken
    for "not JSON" and eval refused the LLM (exit 1)."""
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    with LLMStub(free_port(), broken="surrogate") as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "1", "-k", "2", "--out", "o")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert [f["kind"] for f in summary["flags"] if f["kind"] == "invalid_text"] == ["invalid_text"]


@pytest.mark.parametrize("key", ["sk-secrét-key-123", "sk-secret\nkey-123", "sk secret key"])
def test_an_llm_key_that_cannot_be_sent_is_a_usage_error(tmp_path: Path, key: str) -> None:
    """A key with a non-ASCII character ended in ``UnicodeEncodeError`` and a traceback;
    one with a line break or a space was sent to fail as "cannot reach the LLM"."""
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--llm-api-key", key)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: the LLM key (--llm-api-key, LLM_API_KEY) has a character")
    assert "secr" not in line and "key-123" not in line


def test_an_llm_timeout_that_is_not_a_number_is_a_usage_error(tmp_path: Path) -> None:
    """``--llm-timeout nan`` passed argparse (nan is not <= 0) and ended in ``ValueError:
    deadline must not be NaN`` and a traceback."""
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--llm-timeout", "nan")
    assert done.returncode == 2, done.stderr
    assert "argument --llm-timeout: must be above 0: 'nan'" in done.stderr.splitlines()[-1]
