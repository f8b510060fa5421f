"""What ``eval`` tells of a run with failures: failures counted per function and per
sub-reward with their messages (scrubbed, escaped on the page), flags on sub-rewards, the
zero-variance groups by name, transcripts grouped by prompt with duplicates collapsed, and
the run's own record (time, seed, job file, commit, versions, LLM).

One eval run serves every test of the module: an OPD job (each trajectory one chat
completion) over 4 lines, 4 rollouts each, no seed, so that the stand-in answers every
rollout of a line alike. It knows lines 1 to 3 and answers them right; line 4 it answers
with a tool call, no text. ``judged`` scores 0.5 for its format (always 1) and 0.5 for its
judge, which raises on a trajectory without text; ``flaky`` raises there too, naming the
line's ground truth (its ``model_resource.api_key``), and scores 0.5 elsewhere.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from helpers import controls
from llm_stub import LLMStub
from test_eval import DATA, chromium, eval_env, job_file, questions, solutions

KEY = "sk-report-Secret-0123456789abcdef"

REWARDS = """
from processors_base import (
    AbstractRewardProcessor, Reward, RewardInput, RewardOutput, reward_func, sub_reward_func,
)


def text(input_data):
    messages = input_data.agent_output.messages or []
    return str(messages[-1].get("content") or "") if messages else ""


@reward_func("judged")
class Judged(AbstractRewardProcessor):
    @sub_reward_func("format", sub_weight=0.5)
    def format_ok(self, input_data: RewardInput) -> RewardOutput:
        return RewardOutput(reward=Reward(reward_score=1.0))

    @sub_reward_func("judge", sub_weight=0.5)
    def judge(self, input_data: RewardInput) -> RewardOutput:
        if not text(input_data):
            raise ValueError("the judge got no answer <b>to judge</b>")
        return RewardOutput(reward=Reward(reward_score=1.0))


class Flaky(AbstractRewardProcessor):
    async def process(self, input_data: RewardInput) -> RewardOutput:
        if not text(input_data):
            raise RuntimeError(f"<script>alert(1)</script> no text for {input_data.ground_truth}")
        return RewardOutput(reward=Reward(reward_score=0.5))
"""


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("eval-failing")
    workspace = folder / "ws"
    workspace.mkdir()
    (workspace / "report_fns.py").write_text(REWARDS)
    rewards = [
        {
            "type": "reward",
            "name": name,
            "timeout": 30,
            "weight": 1.0,
            "fcmodel": {"zipdir": str(workspace), "classpath": f"report_fns:{cls}"},
        }
        for name, cls in (("judged", "Judged"), ("flaky", "Flaky"))
    ]
    config = job_file(folder, rewards, teacher="teacher-model")
    data = folder / "keyed.jsonl"
    lines = [json.loads(line) for line in DATA.read_text().splitlines()[:4]]
    for line in lines:
        line["rollout_extra"]["model_resource"] = {"api_key": KEY}
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    answers = dict(zip(questions(3), solutions(3), strict=True))
    with LLMStub(free_port(), answers=answers) as llm:
        done = subprocess.run(
            [sys.executable, "-m", "runtime", "eval", "-c", str(config), "--llm-base-url",
             llm.base_url, "--data", str(data), "-n", "4", "-k", "4",
             "--ground-truth-key", "rollout_extra", "--out", "out"],
            cwd=folder, env=eval_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((folder / "out" / "summary.json").read_text())
    return done, folder / "out", summary


def test_failures_are_counted_where_they_happen(failing_run: Any) -> None:
    done, _, summary = failing_run
    flaky = summary["functions"]["flaky"]
    assert (flaky["calls"], flaky["failures"], flaky["failure_rate"]) == (16, 4, 0.25)
    (error,) = flaky["error_messages"]
    assert error["code"] == "PROCESSOR_ERROR" and error["count"] == 4
    assert error["example"] == "keyed.jsonl:4"
    assert "no text for" in error["message"] and KEY not in error["message"]
    judge = summary["rewards"]["judged"]["sub_rewards"]["judge"]
    assert (judge["calls"], judge["failures"], judge["failure_rate"]) == (16, 4, 0.25)
    assert judge["first_failure"] == "keyed.jsonl:4"
    # the protocol carries only judge.failed: the message is the one its server logged
    (logged,) = judge["errors_logged"]
    assert logged["message"] == "ValueError: the judge got no answer <b>to judge</b>"
    assert logged["example"] == "keyed.jsonl:4" and logged["count"] >= 1
    assert summary["failures"] == {"calls": 4, "sub_rewards": 4, "total": 8}
    # a trajectory is failed when anything on it failed: here the same 4 trajectories
    trajectories = summary["trajectories"]
    assert (trajectories["succeeded"], trajectories["failed"]) == (12, 4)
    assert trajectories["failed_reward"] == trajectories["failed_sub_reward"] == 4
    assert "16 trajectories: 12 succeeded, 4 failed (on: 4 reward, 4 sub-reward)" in done.stdout
    assert "8 failure(s): 4 failed call(s), 4 failed sub-reward(s)" in done.stdout
    table = done.stdout[done.stdout.index("Failures") :]
    assert "judged └ judge" in table and "the judge got no answer" in table
    # the failures its server did not log one by one are counted, not passed over
    unlogged = judge["failures"] - logged["count"]
    assert unlogged > 0  # one logged a minute: the run takes seconds
    assert f"{unlogged} more not logged one by one" in table
    assert "PROCESSOR_ERROR: RuntimeError" in table and "e.g. keyed.jsonl:4" in table
    assert KEY not in done.stdout + done.stderr and not controls(done.stdout)


def test_flags_on_sub_rewards_and_the_zero_variance_groups_by_name(failing_run: Any) -> None:
    _, _, summary = failing_run
    flags = {(f["kind"], f["function"]): f["message"] for f in summary["flags"]}
    assert flags[("sub_reward_constant", "judged")].startswith(
        "judged: sub-reward format scored 1 on all 16 trajectories"
    )
    assert (
        "sub-reward judge scored the same on all the rollouts of each of its 4 groups"
        in (flags[("sub_reward_no_group_variance", "judged")])
    )
    assert (
        "judged scored the same on all the rollouts of each of its 4 groups"
        in (flags[("no_group_variance", "judged")])
    )
    assert ("constant", "flaky") in flags and ("failure_rate", "flaky") in flags
    # a sub-reward failing now and then is a silent 0 each time: flagged as a function is
    assert flags[("sub_reward_failure_rate", "judged")] == (
        "judged: sub-reward judge failed 4 of 16 calls (25%, over 5%), scoring 0 each time: "
        "training would learn from those zeros"
    )
    total = summary["total"]
    assert (total["groups"], total["zero_variance_groups"]) == (3, 3)
    assert [g["sample"] for g in total["zero_variance_samples"]] == [
        f"keyed.jsonl:{n}" for n in (1, 2, 3)
    ]
    first = json.loads(DATA.read_text().splitlines()[0])["messages"][-1]["content"]
    assert total["zero_variance_samples"][0]["prompt"] == first.splitlines()[0][:200] + (
        " [...]" if len(first.splitlines()[0]) > 200 else ""
    )
    assert "keyed.jsonl:1, keyed.jsonl:2, keyed.jsonl:3" in flags[("zero_variance", "total")]
    # judged's own list names line 4 too (it was scored there, 0.5 each time)
    assert [g["sample"] for g in summary["rewards"]["judged"]["zero_variance_samples"]] == [
        f"keyed.jsonl:{n}" for n in (1, 2, 3, 4)
    ]


def test_the_run_is_recorded(failing_run: Any) -> None:
    import hashlib
    import platform

    _, out, summary = failing_run
    run = summary["run"]
    config = out.parent / "job.yaml"
    assert run["job_file"] == {
        "path": str(config),
        "sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", run["started_at"])
    assert run["duration_s"] == summary["elapsed_s"] and run["seed"] is None
    assert run["python_version"] == platform.python_version() and run["runtime_version"]
    assert run["llm"]["model"] == "stub-model"  # model.name
    assert run["llm"]["base_url"].startswith("http://127.0.0.1:")
    # the workspace is a temporary folder, in no repository: no git keys, not null ones
    assert run["workspaces"] == [{"path": str(out.parent / "ws")}]
    page = (out / "report.html").read_text()
    assert run["job_file"]["sha256"] in page and "not in a git repository" in page


def test_git_state_of_a_workspace(tmp_path: Path) -> None:
    from runtime.eval.metadata import git_state

    assert git_state(tmp_path) == {}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f.py").write_text("x = 1\n")
    subprocess.run([*git, "-C", str(tmp_path), "add", "f.py"], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-qm", "one"], check=True)
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert git_state(tmp_path) == {"git_commit": head, "git_dirty": False}
    (tmp_path / "f.py").write_text("x = 2\n")
    assert git_state(tmp_path) == {"git_commit": head, "git_dirty": True}


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_report_shows_failures_groups_and_collapses_duplicates(
    failing_run: Any, tmp_path: Path
) -> None:
    _, out, _ = failing_run
    page = (out / "report.html").read_text()
    assert KEY not in page
    # error messages are text on the page, never markup
    assert "<script>alert(1)</script>" not in page and "<b>to judge</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    status = page[page.index('<p id="status">') : page.index("</p>", page.index('id="status"'))]
    assert 'class="status bad"' in status and "8 failure(s)" in _text(status)
    failures = page[page.index('id="failures"') : page.index("<h2>Rewards</h2>")]
    shown = _text(failures)
    assert "flaky" in shown and "judged └ judge" in shown and "25%" in shown
    assert "e.g. keyed.jsonl:4" in shown and "more not logged one by one" in shown
    # every line's 4 rollouts were the same: each line once, under its prompt, "4 identical"
    transcripts = page[page.index("Lowest scored trajectories") :]
    assert transcripts.count('class="transcript"') == 4
    assert transcripts.count("4 identical") == 4 and "rollouts 0, 1, 2, 3" in transcripts
    assert transcripts.count('class="prompt"') == 4
    assert "judged/judge failed" in transcripts  # line 4's failed sub-reward, as a badge
    # badges in the job's order of rewards in every transcript
    for header in re.findall(r"<header>(.*?)</header>", transcripts, re.S):
        badges = re.findall(r'class="badge[^"]*">([^ <:]+)', header)
        assert badges[:2] == ["judged", "flaky"], header
    dom = chromium(tmp_path, out / "report.html", "--dump-dom")
    assert "<script>alert" not in dom and "failure(s)" in dom
    shot = tmp_path / "report.png"
    chromium(tmp_path, out / "report.html", f"--screenshot={shot}", "--window-size=1200,1600")
    from PIL import Image

    with Image.open(shot) as image:
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200
    # the header's failure badge is drawn red: #fde8e6 on the page
    assert any(abs(c[0] - 0xFD) + abs(c[1] - 0xE8) + abs(c[2] - 0xE6) < 6 for _, c in colours)


def test_a_secret_across_the_cut_of_a_message_or_a_prompt_is_blanked_whole() -> None:
    """Messages (300 characters) and prompts (200) are scrubbed first and cut after: a key
    the cut splits would no longer be recognised, and its first characters would remain."""
    from runtime.eval.secrets import Scrubber
    from runtime.eval.stats import prompt_line, top_errors

    scrub = Scrubber(KEY, None, []).text
    for at in range(150, 310, 7):  # the key ends before, across and after each cut
        text = "x" * at + KEY
        (error,) = top_errors([("PROCESSOR_ERROR", text, "data.jsonl:1")], scrub)
        prompt = prompt_line([{"role": "user", "content": text}], scrub)
        for shown in (error["message"], prompt):
            assert not any(KEY[:n] in shown for n in range(6, len(KEY) + 1)), (at, shown)
