"""``python -m runtime eval``: the sample functions over the SDK example's data against the
deterministic LLM stand-in, so that scores are known exactly; broken functions (always
raising, constant, slow, not starting from their package); an OPD job without a rollout;
exit codes, Ctrl-C, and the report page in a real headless browser.

Each test runs eval as a subprocess, which serves every function from its package with
``start.sh`` (the tests of a port taken before its server listens serve in-process); the
autouse fixture fails a test that leaves a server or a temp dir behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml
from conftest import SAMPLES, SERVER_TMP, SPEC_EXAMPLES, TESTS, free_port
from helpers import RawServer, controls, interruptible, send
from llm_stub import LLMStub

from runtime.eval import serving
from runtime.eval.plan import StartError, make
from runtime.eval.stats import percentile, score_stats

DATA = SPEC_EXAMPLES / "data" / "calc_train_min.jsonl"
WORKSPACE = TESTS / "eval_workspace"

ROLLOUT = {
    "type": "rollout",
    "name": "calc-rollout",
    "timeout": 60,
    "fcmodel": {
        "zipdir": str(SAMPLES),
        "classpath": "functions.rollout.rollout:DemoRolloutProcessor",
    },
}
ANSWER = {
    "type": "reward",
    "name": "answer-match",
    "timeout": 30,
    "weight": 1.0,
    "fcmodel": {"zipdir": str(SAMPLES), "classpath": "functions.reward.reward:DemoRewardProcessor"},
}
SAFETY = {
    "type": "reward",
    "name": "safety",
    "timeout": 30,
    "weight": 0.2,
    "fcmodel": {"zipdir": str(SAMPLES), "classpath": "functions.reward.safety:SafetyProcessor"},
}
GROUP = {
    "type": "group_reward",
    "name": "group-norm",
    "timeout": 30,
    "weight": 0.5,
    "fcmodel": {
        "zipdir": str(SAMPLES),
        "classpath": "functions.reward.group_reward:DemoGroupRewardProcessor",
    },
}


def _ours(kind: str, name: str, classpath: str, timeout: int = 30, **more: Any) -> dict:
    fcmodel = {"zipdir": str(WORKSPACE), "classpath": classpath}
    return {"type": kind, "name": name, "timeout": timeout, "fcmodel": fcmodel, **more}


def job_file(folder: Path, functions: list[dict], *, teacher: str | None = None) -> Path:
    job: dict[str, Any] = {
        "name": "eval-test",
        "model": {"name": "stub-model"},
        "functions": functions,
        "datasets": [{"type": "training", "file_name": str(DATA)}],
        "training": {
            "type": "pg_opd" if teacher else "reinforcement",
            "hyper_parameters": {"n_rollouts": 4},
        },
    }
    if teacher:
        job["teacher_model"] = teacher
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def eval_env() -> dict[str, str]:
    # TMPDIR: the fixture checks it for leftovers; no LLM_* from the developer's shell
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_")}
    return {**env, "TMPDIR": str(SERVER_TMP), "PYTHONUNBUFFERED": "1"}


def run_eval(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "eval", "-c", str(config), *args],
        cwd=config.parent,
        env=eval_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def chats(llm: LLMStub) -> list[dict[str, Any]]:
    """The LLM requests of the run, without eval's one-token test completion."""
    return [r for r in llm.requests if r.get("max_tokens") != 1]


def questions(count: int) -> list[str]:
    lines = DATA.read_text().splitlines()[:count]
    return [json.loads(line)["messages"][-1]["content"] for line in lines]


def solutions(count: int) -> list[str]:
    return [
        json.loads(line)["rollout_extra"]["solution"]
        for line in DATA.read_text().splitlines()[:count]
    ]


# ---- the sample functions, with known scores ------------------------------------------


# The tests of the one run share a worker of pytest-xdist, so that it runs once.
SAMPLE_RUN_GROUP = pytest.mark.xdist_group("eval-sample-run")


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """8 lines x 4 rollouts seeded 0..3. The stand-in knows the answers of lines 1 to 3 and
    gives them on even seeds; on odd seeds it guesses the question's first number (wrong on
    these lines); lines 4 to 8 it works out with the calculator tool, wrongly (their first
    arithmetic expression is not the answer)."""
    folder = tmp_path_factory.mktemp("eval-sample")
    config = job_file(folder, [ROLLOUT, ANSWER, SAFETY, GROUP])
    answers = dict(zip(questions(3), solutions(3), strict=True))
    with LLMStub(free_port(), answers=answers) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "-n", "8", "--seed", "0", "--out", "out"
        )
    return done, folder / "out", llm


@SAMPLE_RUN_GROUP
def test_sample_functions_give_known_scores(sample_run: Any) -> None:
    done, out, llm = sample_run
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is True and summary["stopped_early"] is None
    assert summary["samples"] == 8 and summary["rollouts_per_sample"] == 4  # n_rollouts
    assert summary["trajectories"] == {
        "total": 32,
        "succeeded": 32,
        "failed": 0,
        "not_run": 0,
        "unscored": 0,
        "failed_rollout": 0,
        "failed_reward": 0,
        "failed_sub_reward": 0,
    }
    assert summary["failures"] == {"calls": 0, "sub_rewards": 0, "total": 0}

    answer = summary["rewards"]["answer-match"]
    # lines 1-3: seeds 0 and 2 right, 1 and 3 wrong; lines 4-8: all wrong
    assert answer["scores"]["mean"] == pytest.approx(6 / 32)
    assert answer["scores"]["share_one"] == pytest.approx(6 / 32)
    assert answer["scores"]["distinct"] == 2
    assert (answer["groups"], answer["zero_variance_groups"]) == (8, 5)
    group = summary["rewards"]["group-norm"]  # normalised in its group: +1 / -1, or 0
    assert group["scores"]["mean"] == pytest.approx(0.0)
    assert (group["scores"]["min"], group["scores"]["max"]) == (-1.0, 1.0)
    safety = summary["rewards"]["safety"]
    assert set(safety["sub_rewards"]) == {"no_unsafe_content", "concise"}
    # the weighted total: right 1 + 0.2 + 0.5, wrong in a mixed group 0 + 0.2 - 0.5, else 0.2
    total = summary["total"]
    assert total["scores"]["mean"] == pytest.approx((6 * 1.7 + 6 * -0.3 + 20 * 0.2) / 32)
    assert (total["groups"], total["zero_variance_groups"]) == (8, 5)

    flags = {(f["kind"], f["function"]) for f in summary["flags"]}
    # answer_found is 1 on every trajectory (the stand-in always answers in the format);
    # safety's own sub-rewards are not flagged again under its flag
    assert flags == {
        ("constant", "safety"),
        ("sub_reward_constant", "answer-match"),
        ("zero_variance", "total"),
    }
    flat = [g["sample"] for g in total["zero_variance_samples"]]
    assert flat == [f"calc_train_min.jsonl:{n}" for n in range(4, 9)]
    functions = summary["functions"]
    assert [functions[n]["calls"] for n in ("calc-rollout", "answer-match", "group-norm")] == [
        32,
        32,
        8,
    ]
    assert all(f["failures"] == 0 for f in functions.values())

    # the rollout reached the LLM named in the job (model.name), with the seeds
    assert {r["model"] for r in llm.requests} == {"stub-model"}
    assert sorted({r["seed"] for r in chats(llm)}) == [0, 1, 2, 3]

    # the terminal table, and the red flags in words
    assert "answer-match" in done.stdout and "weighted total" in done.stdout
    assert "safety scored 1 on all 32 trajectories" in done.stdout
    assert "5 of 8 groups scored the same" in done.stdout


@SAMPLE_RUN_GROUP
def test_sample_run_files(sample_run: Any) -> None:
    _, out, _ = sample_run
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(lines) == 32
    first = next(t for t in lines if t["line"] == 1 and t["rollout"] == 0)
    assert first["scores"]["answer-match"] == 1.0
    assert first["messages"][-1]["content"] == "The answer is \\boxed{2/3}."
    assert first["ground_truth"] == "2/3"
    assert set(first["latency_s"]) == {"calc-rollout", "answer-match", "safety", "group-norm"}
    assert first["total"] == pytest.approx(1.7)
    assert first["sub_rewards"]["safety"] == {"no_unsafe_content": 1.0, "concise": 1.0}
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 5  # 3 rewards + the total, and latency
    assert "Lowest scored trajectories" in page and "Highest scored trajectories" in page
    assert "stub-model" in page and "EMPTY" not in page  # the LLM key never shows
    assert {p.name for p in (out / "logs").iterdir()} == {
        "calc-rollout.log",
        "answer-match.log",
        "safety.log",
        "group-norm.log",
    }


def chromium(tmp_path: Path, page: Path, *args: str) -> str:
    """Headless Chromium run on ``page`` (skips the test where there is none); its stdout."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium (apt-get install -y chromium)")
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@SAMPLE_RUN_GROUP
def test_the_report_renders_in_a_headless_browser(sample_run: Any, tmp_path: Path) -> None:
    _, out, _ = sample_run
    shot = tmp_path / "report.png"
    chromium(tmp_path, out / "report.html", f"--screenshot={shot}", "--window-size=1200,2000")
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1200, 2000)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    # a blank page has one colour; the report has text, tables and charts
    assert colours is not None and len(colours) > 200


def test_fail_on_flags_exits_1(tmp_path: Path) -> None:
    config = job_file(tmp_path, [ROLLOUT, ANSWER, SAFETY])
    with LLMStub(free_port()) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2", "--fail-on-flags"
        )
    assert done.returncode == 1, done.stderr
    assert "red flag(s) (--fail-on-flags)" in done.stderr
    assert "safety scored 1 on all 4 trajectories" in done.stdout


# ---- broken functions -----------------------------------------------------------------


def test_a_reward_that_always_raises_stops_the_run_early(tmp_path: Path) -> None:
    raises = _ours("reward", "raises", "eval_fns:AlwaysRaises")
    config = job_file(tmp_path, [ROLLOUT, raises])
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "16", "--out", "out")
    assert done.returncode == 1, done.stderr
    assert "stopped early: raises failed" in done.stderr
    assert "PROCESSOR_ERROR" in done.stderr and "the judge divided by zero" in done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["completed"] is False
    calls = summary["functions"]["raises"]
    assert 20 <= calls["calls"] < 64 and calls["failures"] == calls["calls"]
    assert calls["errors"] == {"PROCESSOR_ERROR": calls["calls"]}
    # the trajectories the stop left unscored are said to be, here and in the summary
    lines = _lines(tmp_path / "out")
    done_ = summary["trajectories"]
    assert done_["succeeded"] + done_["failed"] + done_["not_run"] == done_["total"] == 64
    assert done_["unscored"] == sum(bool(t["unscored"]) for t in lines)
    for t in lines:
        assert t["unscored"] == ([] if "raises" in t["errors"] else ["raises"])
    # the page's header says it stopped, and how many failures it had by then
    page = (tmp_path / "out" / "report.html").read_text()
    header = page[page.index('<p id="status">') : page.index("</p>", page.index('id="status"'))]
    assert f"stopped early · {done_['failed']} failure(s)" in header


def test_a_slow_reward_and_a_failing_sub_reward_are_flagged(tmp_path: Path) -> None:
    slow = _ours("reward", "slow", "eval_fns:SlowReward", timeout=1)
    broken = _ours("reward", "half-broken", "eval_fns:BrokenSubReward")
    config = job_file(tmp_path, [ROLLOUT, slow, broken])
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2", "--out", "o")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert {f["kind"] for f in summary["flags"] if f["function"] == "slow"} >= {"latency"}
    assert summary["functions"]["slow"]["latency_s"]["p95"] >= 0.8
    assert "slow: p95 latency" in done.stdout
    # the reward itself succeeds (0.5 each time); its judge failed on all 4 calls
    half = summary["rewards"]["half-broken"]
    assert half["scores"]["mean"] == 0.5 and summary["functions"]["half-broken"]["failures"] == 0
    assert half["sub_rewards"]["judge"]["failures"] == 4
    assert half["sub_rewards"]["format"]["failures"] == 0
    failing = [f for f in summary["flags"] if f["kind"] == "sub_reward_failing"]
    assert [(f["function"], "judge" in f["message"]) for f in failing] == [("half-broken", True)]
    # only sub-rewards failed: counted as failures, the page's header amber
    assert summary["failures"] == {"calls": 0, "sub_rewards": 4, "total": 4}
    assert "4 succeeded, 0 failed" not in done.stdout and "0 succeeded, 4 failed" in done.stdout
    page = (tmp_path / "o" / "report.html").read_text()
    assert '<span class="status warn">completed · 4 failure(s)</span>' in page


def test_without_the_eval_extra_the_page_is_skipped_and_said_so(tmp_path: Path) -> None:
    """An OPD job with no function of its own: only the LLM is tried; jinja2 made
    unimportable, as where the eval extra is not installed."""
    blocked = tmp_path / "blocked" / "jinja2"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text('raise ImportError("not installed", name="jinja2")\n')
    config = job_file(tmp_path, [], teacher="teacher-model")
    with LLMStub(free_port()) as llm:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "runtime",
                "eval",
                "-c",
                str(config),
                "--llm-base-url",
                llm.base_url,
                "-n",
                "2",
                "-k",
                "2",
                "--out",
                "out",
            ],
            cwd=tmp_path,
            env={**eval_env(), "PYTHONPATH": str(tmp_path / "blocked")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert "report.html not written: it needs jinja2" in done.stderr
    assert "pip install 'agentic-rl-runtime[eval]'" in done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "summary.json",
        "trajectories.jsonl",
    ]
    assert len(chats(llm)) == 4


def test_a_function_is_run_from_its_package(tmp_path: Path) -> None:
    """It imports in the workspace, but reads a *.md file that is not packaged: eval, which
    serves the package, says it cannot start, with the server's own error."""
    notes = _ours("reward", "notes", "needs_notes:NeedsNotes")
    config = job_file(tmp_path, [ROLLOUT, notes])
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url)
    assert done.returncode == 1, done.stderr
    assert "notes (needs_notes:NeedsNotes) exited with code" in done.stderr
    assert "notes.md" in done.stderr


def test_an_opd_job_without_a_rollout_asks_the_llm(tmp_path: Path) -> None:
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    answers = dict(zip(questions(1), solutions(1), strict=True))
    with LLMStub(free_port(), answers=answers) as llm:
        done = run_eval(
            config,
            "--llm-base-url",
            llm.base_url,
            "--llm-model",
            "m",
            "-n",
            "3",
            "-k",
            "2",
            "--out",
            "out",
        )
    assert done.returncode == 0, done.stderr
    # one chat completion per trajectory: the line's messages, no tools, the model given
    assert len(chats(llm)) == 6
    assert {r["model"] for r in llm.requests} == {"m"}
    asked = sorted(r["messages"][0]["content"] for r in chats(llm))
    assert asked == sorted(q for q in questions(3) for _ in range(2))
    assert all(len(r["messages"]) == 1 and "tools" not in r for r in chats(llm))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["functions"]["llm"]["calls"] == 6
    assert summary["rewards"]["answer-match"]["scores"]["mean"] == pytest.approx(2 / 6)
    lines = [
        json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert all(len(t["messages"]) == 2 and t["messages"][1]["role"] == "assistant" for t in lines)


# ---- exit codes and stopping ----------------------------------------------------------


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    config = job_file(tmp_path, [ROLLOUT, ANSWER])
    done = run_eval(config)
    assert done.returncode == 2 and "no LLM: pass --llm-base-url" in done.stderr
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--samples", "0")
    assert done.returncode == 2 and "must be above 0" in done.stderr
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--split", "validation")
    assert done.returncode == 2 and "no validation dataset" in done.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--data", str(bad))
    assert done.returncode == 2 and "bad.jsonl:2: not JSON" in done.stderr
    config.write_text(config.read_text() + "bogus_key: 1\n")
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1")
    assert done.returncode == 2 and "job.yaml:" in done.stderr and "bogus_key" in done.stderr


def test_ctrl_c_stops_every_server(tmp_path: Path) -> None:
    with LLMStub(free_port()) as llm, (tmp_path / "err").open("w") as err:
        process, _ = _start_slow_eval(tmp_path, llm, err)
        try:
            process.send_signal(signal.SIGINT)
            assert process.wait(60) == 130, (tmp_path / "err").read_text()
        finally:
            if process.poll() is None:  # a failed test leaves no eval behind either: its
                process.kill()  # servers go with it (the kernel tells them)
                process.wait()
    assert "interrupted" in (tmp_path / "err").read_text()
    # the autouse fixture: no server left running, no temporary directory left behind


@contextlib.contextmanager
def _port_held_by_a_client() -> Iterator[int]:
    """A loopback port held as an outgoing connection's source port, as the kernel hands
    them out: what once took the port eval had just found free (CI, 2026-12-04)."""
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as client,
        listener.accept()[0],
    ):
        yield client.getsockname()[1]


def _serve_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ports: list[int], **runtime: Any
) -> Any:
    """eval's serving of ANSWER in this process, its first ports ``ports``, not held."""
    answer = {**ANSWER, "runtime": runtime} if runtime else ANSWER
    config = job_file(tmp_path, [answer], teacher="stub-teacher")  # a reward alone will do
    plan = make(str(config), llm_base_url="http://127.0.0.1:9/v1")
    drawn, reserve = iter(ports), serving.reserve_port

    def first_these() -> tuple[int, socket.socket | None]:
        port = next(drawn, None)
        return (port, None) if port else reserve()

    monkeypatch.setattr(serving, "reserve_port", first_these)
    monkeypatch.setattr(tempfile, "tempdir", str(SERVER_TMP))  # checked for leftovers, as are
    monkeypatch.setenv("TMPDIR", str(SERVER_TMP))  # the servers' own temporary files
    logs: dict[str, str] = {}
    return serving.serve_all(plan.functions, logs=logs), logs


def test_a_port_eval_holds_is_free_to_its_server_only(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = [serving.reserve_port() for _ in range(20)]
    try:
        # above Linux's default range for the ports it hands outgoing connections (32768 to
        # 60999; besides, it skips a held one)
        assert all(port > 60999 for port, _ in ports)
        port = ports[0][0]
        with socket.socket() as other, pytest.raises(OSError):  # another process's bind
            other.bind(("127.0.0.1", port))
        drawn = iter([port, *range(61000, 65536)])  # another eval drawing it draws again
        monkeypatch.setattr(serving, "random", SimpleNamespace(randint=lambda *_: next(drawn)))
        ports.append(serving.reserve_port())
        assert ports[-1][0] != port
        with socket.create_server(("127.0.0.1", port)) as server:  # as serve binds
            assert server.getsockname()[1] == port
    finally:
        for _, hold in ports:
            assert hold is not None  # on Linux
            hold.close()


def test_a_server_whose_port_another_process_took_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _port_held_by_a_client() as taken:
        served, logs = _serve_in_process(tmp_path, monkeypatch, [taken, taken])
        with served as functions:
            port = functions["answer-match"].port
            assert port != taken
            assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    log = logs["answer-match"]
    assert log.count(f"cannot listen on 127.0.0.1 port {taken}") == 2
    lost = f"eval: port {taken} was taken before the server could listen"
    assert f"{lost}; start 2 of 3, on port {taken}\n" in log
    assert f"{lost}; start 3 of 3, on port {port}\n" in log


def test_a_port_taken_three_times_or_a_wrong_setting_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _port_held_by_a_client() as taken:
        served, _ = _serve_in_process(tmp_path, monkeypatch, [taken] * 3)
        with pytest.raises(StartError) as raised, served:
            pass
    message = str(raised.value)
    target = "functions.reward.reward:DemoRewardProcessor"
    assert (
        f"answer-match ({target}) exited with code 2 before it was ready at each of its 3 "
        "starts: its port was taken" in message
    )
    assert message.count(f"cannot listen on 127.0.0.1 port {taken}") == 3
    # exit 2 for a wrong setting: started once, and why said
    served, _ = _serve_in_process(tmp_path, monkeypatch, [], env={"CONCURRENCY": "many"})
    with pytest.raises(StartError) as raised, served:
        pass
    message = str(raised.value)
    assert f"answer-match ({target}) exited with code 2 before it was ready:" in message
    assert message.count("CONCURRENCY") == 1, message


# ---- the numbers ----------------------------------------------------------------------


def test_percentiles_and_score_stats() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(v) for v in range(1, 101)], 0.95) == pytest.approx(95.05)
    stats = score_stats([0.0, 1.0, 1.0, 0.5])
    assert stats["mean"] == 0.625 and stats["share_zero"] == 0.25 and stats["share_one"] == 0.5
    assert stats["distinct"] == 3 and stats["min"] == 0.0 and stats["max"] == 1.0
    assert score_stats([])["count"] == 0


# ---- secrets, names and answers that must not break a run ------------------------------

KEY = "sk-eval-Secret-0123456789abcdef"
PASSWORD = "pw-Secret-9876543210"


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]


def _everything(done: subprocess.CompletedProcess, out: Path) -> str:
    """All eval printed and wrote."""
    files = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    return done.stdout + done.stderr + "".join(p.read_text(errors="replace") for p in files)


def test_the_llm_key_and_url_password_never_show(tmp_path: Path) -> None:
    """No rollout: eval asks the LLM itself; the provider refuses the key and names it in
    its 401 (as real ones do). Neither the key nor the URL's password, in any encoding,
    reaches the terminal or a file."""
    import base64
    from urllib.parse import quote

    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    with LLMStub(free_port(), broken="401", broken_after=1) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "--llm-api-key", KEY, "-n", "2", "-k", "2",
            "--out", "key",
        )  # fmt: skip
        assert llm.authorizations[-1] == f"Bearer {KEY}"  # the provider was sent the key
    with LLMStub(free_port(), broken="401", broken_after=1) as llm:
        url = llm.base_url.replace("http://", f"http://user:{PASSWORD}@")
        with_password = run_eval(
            config, "--llm-base-url", url, "-n", "2", "-k", "2", "--out", "out"
        )  # the URL's userinfo goes as Basic authorization, which the provider echoes
    text = _everything(done, tmp_path / "key") + _everything(with_password, tmp_path / "out")
    assert text.count("Incorrect API key provided") >= 2  # the error itself is kept, blanked
    for secret in (KEY, PASSWORD):
        for form in (secret, quote(secret), base64.b64encode(secret.encode()).decode()):
            assert form not in text
    assert base64.b64encode(f"user:{PASSWORD}".encode()).decode()[:20] not in text
    done = with_password
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["llm"]["base_url"] == llm.base_url  # shown without user:password@
    assert summary["functions"]["llm"]["errors"] == {"invalid_api_key": 4}
    assert done.returncode == 1, done.stderr  # every call failed: stopped, not exit 0


def test_square_brackets_in_names_and_errors_are_printed_as_they_are(tmp_path: Path) -> None:
    raises = _ours("reward", "judge[/INST]", "eval_fns:RaisesBrackets")
    config = job_file(tmp_path, [ROLLOUT, raises])
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2", "--out", "o")
    assert done.returncode == 1, done.stderr  # all 4 calls failed
    assert "Traceback" not in done.stderr
    assert "judge[/INST]" in done.stdout
    assert "no answer after [/INST] in [bold]the output" in done.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "logs",
        "report.html",
        "summary.json",
        "trajectories.jsonl",
    ]


def test_a_non_json_llm_answer_fails_its_calls_not_the_run(tmp_path: Path) -> None:
    """No rollout; after the test completion the endpoint answers 200 with a web page."""
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    with LLMStub(free_port(), broken="html", broken_after=1) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2", "--out", "o")
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    assert done.returncode == 1, done.stderr  # all failed: a 100% failure rate is not exit 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["functions"]["llm"]["calls"] == 4
    assert summary["functions"]["llm"]["failures"] == 4
    assert "stopped early: llm failed 4 of its first 4 calls" in done.stderr
    lines = [
        json.loads(x) for x in (tmp_path / "o" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert {t["status"] for t in lines} == {"failed"}
    assert {t["error_code"] for t in lines} == {"INVALID_RESPONSE"}
    assert "Welcome to nginx" in lines[0]["error"]


def test_a_bad_out_is_refused_before_anything_starts(tmp_path: Path) -> None:
    config = job_file(tmp_path, [ROLLOUT, ANSWER])
    (tmp_path / "afile").write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    (full / "logs").mkdir()
    (full / "logs" / "keep.txt").write_text("mine too")  # not eval's: a log folder of theirs
    with LLMStub(free_port()) as llm:
        base = ("--llm-base-url", llm.base_url, "-n", "1", "-k", "1")
        done = run_eval(config, *base, "--out", "afile")
        assert done.returncode == 2 and "--out afile: exists and is not a directory" in done.stderr
        done = run_eval(config, *base, "--out", "afile/sub")
        assert done.returncode == 2 and "cannot write there" in done.stderr
        done = run_eval(config, *base, "--out", "full")
        assert done.returncode == 2
        assert "holds files that are not eval's (logs, notes.txt)" in done.stderr
        assert "checking that" not in done.stderr and not llm.requests  # nothing started
        done = run_eval(config, *base, "--out", "full", "--force")
        assert done.returncode == 0, done.stderr
    assert (full / "notes.txt").read_text() == "mine" and (full / "summary.json").exists()
    assert (full / "logs" / "keep.txt").exists() and (full / "logs" / "calc-rollout.log").exists()
    (full / "notes.txt").unlink()
    (full / "logs" / "keep.txt").unlink()
    (full / "report.html").write_text("stale")
    with LLMStub(free_port()) as llm:  # only eval's files of the last run: replaced, no --force
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "-n", "1", "-k", "1", "--out", "full"
        )
    assert done.returncode == 0, done.stderr
    assert "stale" not in (full / "report.html").read_text()


def test_an_llm_that_never_answers_is_named_before_anything_starts(tmp_path: Path) -> None:
    import socket

    config = job_file(tmp_path, [ROLLOUT, ANSWER])
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        done = run_eval(config, "--llm-base-url", url, "--llm-timeout", "1")
    assert done.returncode == 1, done.stderr
    assert f"the LLM at {url} did not answer a one-token test completion within 1 s" in (
        done.stderr
    )
    assert "starting" not in done.stderr  # no function was started for nothing
    with LLMStub(free_port()) as llm:  # it refuses the key, and names it
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "--llm-model", "reject-key",
            "--llm-api-key", KEY,
        )  # fmt: skip
    assert done.returncode == 1 and "starting" not in done.stderr
    assert "answered a test completion (model reject-key) with HTTP 401" in done.stderr
    assert KEY not in done.stderr and "Incorrect API key provided: ***" in done.stderr
    with LLMStub(free_port(), broken="html") as llm:  # a web server, not an LLM
        done = run_eval(config, "--llm-base-url", llm.base_url)
    assert done.returncode == 1 and "starting" not in done.stderr
    assert f"the LLM at {llm.base_url} answered a test completion with text/html" in done.stderr
    with LLMStub(free_port(), broken="max_tokens") as llm:  # up, only not for max_tokens
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "1", "-k", "1")
    assert done.returncode == 0, done.stderr
    assert "refused the one-token test completion with HTTP 400" in done.stderr


def test_weights_never_reported_and_a_ground_truth_key_that_matches_nothing(
    tmp_path: Path,
) -> None:
    safety = {**SAFETY, "reward_metric_weight": {"no_unsafe_content": 0.5, "toxicity": 0.5}}
    config = job_file(tmp_path, [ROLLOUT, safety])
    with LLMStub(free_port()) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2",
            "--ground-truth-key", "rollout_extra.answer", "--out", "o",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    kinds = {(f["kind"], f["function"]): f["message"] for f in summary["flags"]}
    assert kinds[("weight_never_reported", "safety")] == (
        "safety: weight set for sub-reward toxicity, which the function never reports "
        "(it reports: concise, no_unsafe_content)"
    )
    assert summary["rewards"]["safety"]["sub_rewards_without_weight"] == ["concise"]
    assert "note: safety reports sub-reward(s) with no weight: concise" in done.stdout
    assert (
        "--ground-truth-key rollout_extra.answer matches none of the 2 lines"
        in (kinds[("ground_truth_key", "data")])
    )


def test_a_server_that_dies_mid_run_is_named_with_its_exit_code_and_log(tmp_path: Path) -> None:
    dies = _ours("reward", "dies", "eval_fns:ExitsOnCall")
    config = job_file(tmp_path, [ROLLOUT, dies])
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2", "--out", "o")
    assert "stopped: dies's server exited with code 3 during the run" in done.stderr
    assert "ExitsOnCall: going down" in done.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "SERVER_EXITED" in summary["functions"]["dies"]["errors"]
    assert done.returncode == 1, done.stderr


def test_a_body_over_the_servers_limit_is_recorded_as_413(tmp_path: Path) -> None:
    """The reward's server takes 2000 bytes at most; the trajectories are megabytes, so it
    answers 413 and closes the connection while eval is still sending."""
    small = {**ANSWER, "runtime": {"env": {"MAX_BODY_BYTES": "2000"}}}
    config = job_file(tmp_path, [ROLLOUT, small])
    big = tmp_path / "big.jsonl"
    line = json.loads(DATA.read_text().splitlines()[0])
    line["messages"][-1]["content"] += " " + "padding " * 500_000
    big.write_text(json.dumps(line) + "\n")
    with LLMStub(free_port()) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "--data", str(big), "-k", "2", "--out", "o"
        )
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["functions"]["answer-match"]["errors"] == {"BODY_TOO_LARGE": 2}, done.stderr
    lines = [
        json.loads(x) for x in (tmp_path / "o" / "trajectories.jsonl").read_text().splitlines()
    ]
    message = lines[0]["errors"]["answer-match"]["message"]
    assert "larger than 2000 bytes" in message


def test_the_summary_line_and_a_job_without_rewards(tmp_path: Path) -> None:
    config = job_file(tmp_path, [], teacher="teacher-model")
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2", "--out", "o")
    assert done.returncode == 0, done.stderr
    assert (
        "2 samples x 2 rollouts = 4 trajectories: 4 succeeded, 0 failed, 0 not run" in done.stdout
    )
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "total" not in summary  # no reward, no total: absent, never null
    lines = [
        json.loads(x) for x in (tmp_path / "o" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert all("total" not in t and t["unscored"] == [] for t in lines)


def test_help_names_exit_codes_and_an_out_outside_the_workspace() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "eval", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**eval_env(), "COLUMNS": "200"},
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--out /tmp/calc-eval" in text and "--out eval-out" not in text
    assert "143 SIGTERM" in text and "129 SIGHUP" in text and "--llm-timeout" in text


def _slow_args(llm: LLMStub) -> list[str]:
    return ["--llm-base-url", llm.base_url, "-n", "2", "-k", "2"]


def _start_slow_eval(tmp_path: Path, llm: LLMStub, err: Any) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / "called"
    slow = _ours(
        "reward",
        "slow",
        "eval_fns:SlowReward",
        timeout=120,
        runtime={"env": {"EVAL_MARKER": str(marker), "SLOW_SECONDS": "60"}},
    )
    config = job_file(tmp_path, [ROLLOUT, slow])
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime", "eval", "-c", str(config), *_slow_args(llm)],
        cwd=tmp_path,
        env=eval_env(),
        stdout=subprocess.DEVNULL,
        stderr=err,
        preexec_fn=interruptible,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), (tmp_path / "err").read_text()
    return process, config


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_every_server(tmp_path: Path, sig: int, code: int) -> None:
    with LLMStub(free_port()) as llm, (tmp_path / "err").open("w") as err:
        process, _ = _start_slow_eval(tmp_path, llm, err)
        process.send_signal(sig)
        assert process.wait(60) == code, (tmp_path / "err").read_text()
    assert "interrupted" in (tmp_path / "err").read_text()
    # the autouse fixture: no server left running, no temporary directory left behind


def test_kill_9_takes_the_servers_along_and_the_next_eval_removes_the_temp_dir(
    tmp_path: Path,
) -> None:
    from conftest import descendants, wait_gone

    with LLMStub(free_port()) as llm, (tmp_path / "err").open("w") as err:
        process, config = _start_slow_eval(tmp_path, llm, err)
        servers = descendants(process.pid)
        assert servers
        left = [
            p for p in SERVER_TMP.iterdir() if p.name.startswith(f"runtime-eval-{process.pid}-")
        ]
        assert len(left) == 1
        process.kill()
        process.wait(30)
        assert wait_gone(servers, 60) == set()  # the kernel told them: SIGTERM
        assert left[0].exists()
        done = run_eval(config)  # any later eval, even one that stops at a usage error
        assert done.returncode == 2
        assert not left[0].exists()


def test_a_data_lines_model_resource_key_never_shows(tmp_path: Path) -> None:
    """A line that carries its own model_resource: eval writes the line's ground_truth
    (here, the whole rollout_extra) to trajectories.jsonl and the page, blanked."""
    line_key = "sk-line-Secret-abcdef0123456789"
    line = json.loads(DATA.read_text().splitlines()[0])
    line["rollout_extra"]["model_resource"] = {"api_key": line_key}
    data = tmp_path / "keyed.jsonl"
    data.write_text(json.dumps(line) + "\n")
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    with LLMStub(free_port()) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "--data", str(data), "-k", "2",
            "--ground-truth-key", "rollout_extra", "--out", "o",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _lines(tmp_path / "o")[0]["ground_truth"]["model_resource"] == {"api_key": "***"}
    assert line_key not in _everything(done, tmp_path / "o")


# ---- hostile data, bad job files, --out ------------------------------------------------

# What the page's template writes around a user message: a data line's api_key equal to it
# deleted it from the scrubbed page, and the message became the div's attributes.
MARKUP = 'class="msg user"><span class="role">user</span>'
PEM = "-----BEGIN PRIVATE KEY-----"  # with no END line, it blanked the page to its end


def data_file(folder: Path, lines: list[tuple[str, list[dict[str, str]]]]) -> Path:
    """A JSONL file of (model_resource.api_key, messages) lines; the key under
    rollout_extra, which --ground-truth-key rollout_extra writes out."""
    path = folder / "hostile.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"messages": messages, "rollout_extra": {"model_resource": {"api_key": key}}}
            )
            + "\n"
            for key, messages in lines
        )
    )
    return path


# scores every trajectory 0.5 at once, so that every one is shown on the page
HALF = _ours("reward", "half", "eval_fns:SlowReward", runtime={"env": {"SLOW_SECONDS": "0"}})


def _page_dom(text: str) -> dict[str, Any]:
    from html.parser import HTMLParser

    found: dict[str, Any] = {"messages": 0, "handlers": [], "title": ""}

    class Dom(HTMLParser):
        in_title = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found["handlers"] += [name for name, _ in attrs if name.startswith("on")]
            if tag == "div" and "msg" in (dict(attrs).get("class") or "").split():
                found["messages"] += 1
            self.in_title = tag == "title"

        def handle_endtag(self, tag: str) -> None:
            self.in_title = False

        def handle_data(self, data: str) -> None:
            if self.in_title:
                found["title"] += data

    Dom().feed(text)
    return found


def test_a_dataset_cannot_inject_markup_into_the_report(tmp_path: Path) -> None:
    """Secrets are blanked in the values before the page is rendered, never in the page:
    keys equal to the template's markup or shaped as a PEM key leave its structure whole,
    and a key with an ``&`` does not leak in its escaped form."""
    ampersand = "Tr0ub4dor&3-horse"
    data = data_file(
        tmp_path,
        [
            (MARKUP, [{"role": "user", "content": " onfocus=document.title=1 autofocus x="}]),
            (ampersand, [{"role": "user", "content": f"my key is {ampersand}"}]),
            (
                "sk-line-Secret-abcdef0123456789",
                [
                    {"role": PEM, "content": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"},
                    {"role": "user", "content": f"{PEM} and no END line"},
                ],
            ),
        ],
    )
    config = job_file(tmp_path, [HALF], teacher="teacher-model")
    with LLMStub(free_port()) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "--data", str(data), "-k", "1",
            "--ground-truth-key", "rollout_extra", "--out", "o",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = tmp_path / "o" / "report.html"
    assert ampersand not in page.read_text() and "Tr0ub4dor&amp;3-horse" not in page.read_text()
    dom = _page_dom(chromium(tmp_path, page, "--dump-dom"))
    # every message of the 3 trajectories (the line's, and the LLM's answer) in its own div
    assert dom["messages"] == sum(len(t["messages"]) for t in _lines(tmp_path / "o")) == 7
    assert dom["handlers"] == []
    assert dom["title"] == "eval: eval-test"


def test_a_short_key_is_not_taken_for_a_secret_and_said_so(tmp_path: Path) -> None:
    """Blanking a one-letter key turned summary.json's ``max`` into ``m***x`` (and the
    table's print crashed on it): a key under 8 characters is not blanked in text, with a
    warning naming where it came from; an api_key field is still blanked whole."""
    question = [{"role": "user", "content": "what is the max of 1 and a?"}]
    data = data_file(tmp_path, [("a", question)])
    config = job_file(tmp_path, [HALF], teacher="teacher-model")
    with LLMStub(free_port()) as llm:
        done = run_eval(
            config, "--llm-base-url", llm.base_url, "--llm-api-key", "x", "--data", str(data),
            "-k", "2", "--ground-truth-key", "rollout_extra", "--out", "o",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "under 8 characters" in line]
    assert len(warnings) == 1, done.stderr
    assert "--llm-api-key" in warnings[0] and "hostile.jsonl:1" in warnings[0]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["rewards"]["half"]["scores"]["max"] == 0.5
    assert " max " in done.stdout  # the table's column
    (line, _) = _lines(tmp_path / "o")
    assert line["ground_truth"] == {"model_resource": {"api_key": "***"}}
    assert line["messages"][0] == question[0]


def test_a_lone_surrogate_in_an_answer_is_replaced_and_flagged(tmp_path: Path) -> None:
    """Half an emoji in the LLM's answer: it is scored and written as U+FFFD, and flagged;
    it failed every reward call, then the writing of every file."""
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    with LLMStub(free_port(), broken="surrogate", broken_after=1) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "2", "-k", "2", "--out", "o")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "o"
    assert sorted(p.name for p in out.iterdir()) == [
        "logs", "report.html", "summary.json", "trajectories.jsonl",
    ]  # fmt: skip
    lines = _lines(out)
    assert len(lines) == 4 and all(t["invalid_text"] for t in lines)
    assert all(t["messages"][-1]["content"].endswith(" \ufffd") for t in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["functions"]["answer-match"]["failures"] == 0
    (flag,) = [f for f in summary["flags"] if f["kind"] == "invalid_text"]
    assert flag["message"].startswith("4 of 4 trajectories: the LLM's answer")
    assert "U+FFFD" in done.stdout


def test_bad_numbers_and_deep_nesting_are_usage_errors(tmp_path: Path) -> None:
    config = job_file(tmp_path, [ROLLOUT, ANSWER])
    job = yaml.safe_load(config.read_text())
    job["training"]["hyper_parameters"]["n_rollouts"] = -2
    config.write_text(yaml.safe_dump(job, sort_keys=False))
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url)
        assert not llm.requests  # nothing started
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {config}:")
    assert line.endswith(": training.hyper_parameters.n_rollouts: Input should be greater than 0")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: x\nobservability: " + "[" * 1000 + "]" * 1000)
    done = run_eval(deep, "--llm-base-url", "http://127.0.0.1:9/v1")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {deep}:2: nested more than 50 levels deep"]
    line = '{"messages": [{"role": "user", "content": "hi"}], "x": ' + "[" * 1000 + "]" * 1000
    (tmp_path / "deep.jsonl").write_text(line + "}\n")
    config = job_file(tmp_path, [ANSWER], teacher="teacher-model")
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--data", "deep.jsonl")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: deep.jsonl:1: nested more than 100 levels deep"]


def test_function_names_are_never_paths(tmp_path: Path) -> None:
    """A name that reads as an absolute or a climbing path unpacked the package, and left
    it, outside eval's temporary directory."""
    elsewhere = tmp_path / "elsewhere"
    absolute = {**ANSWER, "name": str(elsewhere / "absolute")}
    climbing = {**SAFETY, "name": "../" * 40 + str(elsewhere / "climbing").lstrip("/")}
    config = job_file(tmp_path, [absolute, climbing], teacher="teacher-model")
    with LLMStub(free_port()) as llm:
        done = run_eval(config, "--llm-base-url", llm.base_url, "-n", "1", "-k", "1", "--out", "o")
    assert done.returncode == 0, done.stderr
    assert not elsewhere.exists()
    logs = sorted(p.name for p in (tmp_path / "o" / "logs").iterdir())
    assert len(logs) == 2 and all(name.endswith(".log") and "/" not in name for name in logs)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["functions"][absolute["name"]]["calls"] == 1  # the name itself is kept


def test_out_files_replace_links_planted_after_the_check(tmp_path: Path) -> None:
    """Links planted in --out while eval runs (a shared /tmp/calc-eval) are replaced by
    eval's files, never followed; an --out that is itself a link is refused."""
    marker, release = tmp_path / "called", tmp_path / "release"
    waits = _ours(
        "reward",
        "waits",
        "eval_fns:WaitsForRelease",
        runtime={"env": {"EVAL_MARKER": str(marker), "EVAL_RELEASE": str(release)}},
    )
    config = job_file(tmp_path, [waits], teacher="teacher-model")
    outside, out = tmp_path / "outside", tmp_path / "o"
    (outside / "logs").mkdir(parents=True)
    names = ("trajectories.jsonl", "summary.json", "report.html")
    for name in names:
        (outside / name).write_text("mine")
    with LLMStub(free_port()) as llm, (tmp_path / "err").open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "runtime", "eval", "-c", str(config), "-n", "1", "-k", "1",
             "--llm-base-url", llm.base_url, "--out", str(out)],
            cwd=tmp_path, env=eval_env(), stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), (tmp_path / "err").read_text()
        for name in names:
            (out / name).symlink_to(outside / name)
        (out / "logs").symlink_to(outside / "logs", target_is_directory=True)
        release.touch()
        assert process.wait(120) == 0, (tmp_path / "err").read_text()
    for name in names:
        assert (outside / name).read_text() == "mine"
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 4
    assert not any((outside / "logs").iterdir())
    assert not (out / "logs").is_symlink() and (out / "logs" / "waits.log").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left

    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    done = run_eval(config, "--llm-base-url", "http://127.0.0.1:9/v1", "--out", "link")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: --out link: is a symbolic link; name the directory it points to"
    ]


# ---- control sequences, --out made a link, long names, bad numbers, the LLM's timeouts ----

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
            cwd=tmp_path, env=eval_env(), stdout=subprocess.DEVNULL, stderr=err,
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
    with RawServer(_trickle) as server:  # its 300 s answer would outlast run_eval's 120 s
        done = run_eval(
            config, "--llm-base-url", server.base_url, "--llm-timeout", "2", timeout=120
        )
    assert done.returncode == 1, done.stderr
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
    with RawServer(first_at_once) as server:  # a 300 s answer would outlast run_eval's 120 s
        done = run_eval(
            config, "--llm-base-url", server.base_url, "--llm-timeout", "2", "-n", "1",
            "-k", "1", timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr  # its only completion failed: stopped
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
