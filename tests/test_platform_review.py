"""The platform commands under attack: what ships, what is printed, what a local mistake
or a flaky platform does. The real CLI (a subprocess) against the stand-in platform."""

from __future__ import annotations

import base64
import io
import json
import shutil
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SAMPLES
from platform_standin import PlatformStandIn
from test_platform_cli import FT, cli, one_error_line


@pytest.fixture
def platform() -> Iterator[PlatformStandIn]:
    with PlatformStandIn() as standin:
        yield standin
    for instance in standin.started:
        assert instance.process.poll() is not None
        assert not Path(instance.directory.name).exists()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return Path(
        shutil.copytree(SAMPLES, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    )


def _own(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "own"
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    return ws


REWARD = (
    "from processors_base import AbstractRewardProcessor, Reward, RewardOutput\n"
    "{imports}\n\n"
    "class R(AbstractRewardProcessor):\n"
    "    def process(self, input_data):\n"
    "        return RewardOutput(reward=Reward(reward_score={score}))\n"
)


def test_the_import_check_imports_what_ships_and_nested_data_packages_ship(platform, tmp_path):
    ws = _own(
        tmp_path,
        {
            "fns/__init__.py": "",
            "fns/data/__init__.py": "",
            "fns/data/table.py": "SCORE = 0.5\n",
            "fns/r.py": REWARD.format(imports="from fns.data.table import SCORE", score="SCORE"),
            # a namespace package at the top named data/: importable here, never shipped
            "data/extra.py": "BONUS = 1\n",
            "fns/bad.py": REWARD.format(imports="from data.extra import BONUS", score="BONUS"),
        },
    )
    done = cli(platform, "register", str(ws), "--reward", "fns.r:R", "-o", "json")
    assert done.returncode == 0, done.stderr
    (package,) = platform.uploads.values()
    assert "fns/data/table.py" in zipfile.ZipFile(io.BytesIO(package)).namelist()

    count = len(platform.requests)
    bad = cli(platform, "register", str(ws), "--reward", "fns.bad:R")
    assert bad.returncode == 1
    line = one_error_line(bad)
    assert "No module named 'data'" in line and "imported from the package" in line
    assert len(platform.requests) == count  # nothing sent


def test_an_instance_that_fails_to_start_is_reported_with_its_logs_and_deleted(platform, tmp_path):
    ws = _own(
        tmp_path,
        {
            "fns/__init__.py": "",
            # imports here; dies on the instance (where the platform sets FC_SERVER_PORT)
            "fns/r.py": "import os\n"
            "if os.environ.get('FC_SERVER_PORT'):\n"
            "    raise SystemExit('no GPU on this instance: giving up')\n"
            + REWARD.format(imports="", score="1.0"),
        },
    )
    done = cli(
        platform, "register", str(ws), "--reward", "fns.r:R", "--no-lazy-load",
        "--poll-interval", "0.1", "--timeout", "240",
    )  # fmt: skip
    assert done.returncode == 1
    line = one_error_line(done)
    assert "failed to start (platform status -1)" in line and "was deleted" in line
    assert "no GPU on this instance: giving up" in done.stderr  # its last log lines
    assert not platform.instances  # deleted
    assert any(r["path"].startswith(f"{FT}/delete/faas/") for r in platform.requests)


def test_a_key_the_platform_echoes_back_is_never_printed(platform):
    platform.echo_key = True
    key = "sk-echoed/key+with=odd&chars-0123456789"
    forms = (
        key,
        urllib.parse.quote(key, safe=""),
        urllib.parse.quote_plus(key),
        base64.b64encode(key.encode()).decode(),
    )
    for args in (("job", "get", "ft-1"), ("instance", "logs", "rw-ins-1")):
        for fmt in ("table", "json"):
            done = cli(platform, *args, "--api-key", key, "-o", fmt)
            assert done.returncode == 1, done.stderr
            one_error_line(done)
            shown = done.stdout + done.stderr
            assert not [form for form in forms if form in shown], shown
            assert "Bearer sk-" not in shown and "***" in shown
    assert platform.requests[-1]["authorization"] == f"Bearer {key}"  # the key was sent


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        ({"DASHSCOPE_HTTP_BASE_URL": "ftp://x/api"}, (), "is not an http(s) URL"),
        ({"DASHSCOPE_HTTP_BASE_URL": "localhost:8080/api"}, (), "is not an http(s) URL"),
        ({"FC_QUERY_API": "nowhere"}, (), "FC_QUERY_API 'nowhere' is not an http(s) URL"),
        ({}, ("--api-key", "sk-abc\nX-Injected: 1"), "cannot go in an HTTP header"),
        ({}, ("--api-key", "sk-ключ"), "cannot go in an HTTP header"),
        ({"FC_WORKERS_COUNT": "abc"}, (), "FC_WORKERS_COUNT must be a positive whole number"),
        ({"HTTP_REQUEST_TIMEOUT": "soon"}, (), "must be a positive number of seconds"),
    ],
)
def test_local_mistakes_are_usage_errors_and_nothing_is_sent(platform, env, args, expected):
    done = cli(platform, "job", "list", *args, env=env)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done)
    assert expected in line and "Traceback" not in done.stderr
    assert "the request was sent" not in line and "nothing was sent" in line
    assert "ключ" not in line and "X-Injected" not in line  # the key not printed
    assert not platform.requests


def test_the_workspace_header_goes_on_job_calls_only(platform, workspace):
    listed = cli(platform, "job", "list", "--workspace-id", "ws-9")
    assert listed.returncode == 0, listed.stderr
    assert platform.requests[-1]["workspace"] == "ws-9"
    done = cli(
        platform, "upload-data", "--training", "data/calc_train.jsonl", "--workspace-id", "ws-9",
        cwd=workspace,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert platform.requests[-1]["path"] == "/api/v1/files"
    assert platform.requests[-1]["workspace"] is None  # never on file and function calls


def _opd_job(platform: PlatformStandIn, workspace: Path) -> Path:
    uploaded = cli(
        platform, "upload-data", "--training", "data/calc_train.jsonl", "-o", "json", cwd=workspace
    )
    assert uploaded.returncode == 0, uploaded.stderr
    (file_id,) = json.loads(uploaded.stdout)["training_file_ids"]
    opd = workspace / "opd.yaml"
    opd.write_text(f"teacher_model: t\ndatasets:\n- {{type: training, file_id: {file_id}}}\n")
    return opd


def test_waiting_rides_out_transient_errors_and_exit_codes_tell_the_outcomes_apart(
    platform, workspace
):
    opd = _opd_job(platform, workspace)
    platform.flaky[f"GET {FT}/ft-"] = 2  # two 502s on the job's status
    done = cli(platform, "job", "run", "-c", str(opd), "--wait", "--poll-interval", "0.05")
    assert done.returncode == 0, done.stderr
    assert "HTTP 502: <html>502 Bad Gateway</html>; retrying in 0.05 s" in done.stderr
    assert done.stdout.splitlines()[1].split() == ["status", "SUCCEEDED"]

    platform.job_outcome = "FAILED"
    failed = cli(platform, "job", "run", "-c", str(opd), "--wait", "--poll-interval", "0.05")
    assert failed.returncode == 1 and "status      FAILED" in failed.stdout

    platform.job_outcome = "RUNNING"  # never ends
    submitted = cli(platform, "job", "run", "-c", str(opd), "-o", "json")
    job_id = json.loads(submitted.stdout)["job_id"]
    late = cli(platform, "job", "wait", job_id, "--timeout", "0.5", "--poll-interval", "0.05")
    assert late.returncode == 124
    assert one_error_line(late) == f"error: job {job_id} is still RUNNING after 0.5 s"

    platform.slow[f"{FT}/{job_id}/logs"] = 30.0  # the deadline cuts a poll short
    cut = cli(platform, "job", "wait", job_id, "--timeout", "0.5", "--poll-interval", "0.05")
    assert cut.returncode == 124, cut.stderr
    assert one_error_line(cut) == f"error: job {job_id} is still RUNNING after 0.5 s"
    del platform.slow[f"{FT}/{job_id}/logs"]

    platform.flaky[f"GET {FT}/{job_id}"] = 1000  # the platform keeps failing
    lost = cli(platform, "job", "wait", job_id, "--timeout", "0.5", "--poll-interval", "0.05")
    assert lost.returncode == 3
    assert "HTTP 502" in one_error_line(lost) and "its state is unknown" in lost.stderr


def _with_datasets(job: Path, lines: str) -> str:
    last = "  file_name: ./data/calc_validation.jsonl\n"
    return job.read_text().replace(last, last + lines)


def test_ids_created_before_a_failure_are_printed(platform, workspace):
    refused = cli(
        platform, "job", "run", "-c", "rl-job.yaml", "-o", "json", cwd=workspace,
        env={"FC_REGISTER_REWARD_API": f"{platform.base_url}/nowhere"},
    )  # fmt: skip
    assert refused.returncode == 1
    assert "registering functions[1] (answer-match) failed" in one_error_line(refused)
    shown = json.loads(refused.stdout)
    (rollout,) = shown["entity_ids"].values()  # registered before the reward failed
    assert rollout.startswith("ro-") and list(shown["entity_ids"]) == [
        "functions[0] (calc-rollout)"
    ]

    job = workspace / "rl-job.yaml"
    job.write_text(_with_datasets(job, "- {type: training, file_id: file-unknown}\n"))
    unsent = cli(platform, "job", "run", "-c", "rl-job.yaml", "-o", "yaml", cwd=workspace)
    assert unsent.returncode == 1
    assert "submitting the job failed" in one_error_line(unsent)
    assert "./data/calc_train.jsonl: file-" in unsent.stdout  # the uploaded file ids
    assert "functions[2] (safety): rw-" in unsent.stdout


def test_an_unclear_outcome_says_what_to_look_for(platform):
    from runtime.platform import jobs
    from runtime.platform.http import Platform, UnclearOutcome

    platform.slow[FT] = 3.0
    with (
        Platform(platform.base_url, platform.api_key, timeout=0.5) as client,
        pytest.raises(
            UnclearOutcome,
            match="check python -m runtime job list for a job named my-job before running it again",
        ),
    ):
        jobs.submit(client, {"job_name": "my-job"})


def test_smaller_checks_before_anything_is_sent(platform, workspace):
    long_name = cli(
        platform, "job", "run", "-c", "rl-job.yaml", "--job-name", "n" * 257, cwd=workspace
    )
    assert long_name.returncode == 2
    assert "--job-name must be 1 to 256 characters, not 257" in one_error_line(long_name)
    wrong_type = cli(
        platform,
        "test-function",
        "rw-ins-1",
        "-t",
        "reward",
        "-i",
        '{"func_type": "rollout", "agent_output": {}}',
    )
    assert wrong_type.returncode == 2
    assert "func_type is 'rollout' but --type is 'reward'" in one_error_line(wrong_type)
    for missing in (
        cli(platform, "upload-data", "--training", "nope.jsonl", cwd=workspace),
        cli(platform, "job", "run", "-c", "nope.yaml", cwd=workspace),
    ):
        assert missing.returncode == 2 and "no such" in one_error_line(missing)
    (workspace / "bad.jsonl").write_text('{"messages": ["hi"]}\n')
    bad = cli(platform, "upload-data", "--training", "bad.jsonl", cwd=workspace)
    assert bad.returncode == 1
    assert "line 1: 'messages' must be a list of objects" in one_error_line(bad)
    (workspace / "classes.yaml").write_text(
        "functions:\n- type: reward\n  fcmodel:\n    classpath: functions/nope.py:R\n"
        "- type: rollout\n  fcmodel: {classpath: functions.rollout.rollout:Nope}\n"
    )
    no_file = cli(platform, "job", "run", "-c", "classes.yaml", cwd=workspace)
    assert no_file.returncode == 1
    assert one_error_line(no_file).startswith(
        "error: classes.yaml:4: functions[0].fcmodel.classpath: functions[0]: functions/nope.py"
    )
    assert not platform.requests


def test_datasets_as_written_uploaded_once_and_refusals_detailed(platform, workspace):
    data = workspace / "data" / "calc_train.jsonl"
    data.write_text(data.read_text() + "\n")  # a trailing blank line is fine
    twice = cli(
        platform,
        "upload-data",
        "--training",
        str(data),
        "--training",
        "data/calc_train.jsonl",
        "-o",
        "json",
        cwd=workspace,
    )
    assert twice.returncode == 0, twice.stderr
    assert len(json.loads(twice.stdout)["training_file_ids"]) == 1
    assert "given twice as training data: uploaded once" in twice.stderr

    shutil.copy(data, workspace / "refused.jsonl")
    refused = cli(platform, "upload-data", "--training", "refused.jsonl", cwd=workspace)
    assert refused.returncode == 1
    assert '"code":"InvalidFile","message":"bad encoding"' in one_error_line(refused)

    job = workspace / "rl-job.yaml"
    job.write_text(
        _with_datasets(
            job,
            "- {type: testing, file_name: ./data/calc_validation.jsonl}\n"
            "- {type: validation, data_source_type: download_url, download_url: http://d/x,"
            " mount_storage: {}}\n",
        )
    )
    count = len([r for r in platform.requests if r["path"] == "/api/v1/files"])
    done = cli(platform, "job", "run", "-c", "rl-job.yaml", cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert len([r for r in platform.requests if r["path"] == "/api/v1/files"]) == count + 2
    assert "a testing dataset is not sent with the job, so it is not uploaded" in done.stderr
    body = platform.requests[-1]["json"]
    assert body["validation_datasets"][-1] == {
        "type": "validation", "data_source_type": "download_url", "download_url": "http://d/x"
    }  # fmt: skip


def test_modules_of_the_workspace_do_not_shadow_the_clients_own(platform, workspace):
    for shadow in ("yaml.py", "httpx.py", "orjson.py"):
        (workspace / shadow).write_text(f"raise ImportError('the workspace {shadow} was used')\n")
    done = cli(platform, "job", "run", "-c", "rl-job.yaml", "-o", "yaml", cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert "job_id: ft-" in done.stdout


def test_tables_escape_control_characters_and_the_request_timeout_is_honoured(platform, workspace):
    opd = _opd_job(platform, workspace)
    evil = "evil\x1b[2J\nname"
    submitted = cli(platform, "job", "run", "-c", str(opd), "--job-name", evil)
    assert submitted.returncode == 0, submitted.stderr
    assert "job_name    evil\\x1b[2J\\nname" in submitted.stdout
    listed = cli(platform, "job", "list")
    assert "\x1b" not in listed.stdout and "evil\\x1b[2J\\nname" in listed.stdout
    assert len(listed.stdout.splitlines()) == 3  # header, one job, the page line

    platform.slow[FT] = 5.0
    slow = cli(platform, "job", "cancel", "ft-1", "--request-timeout", "0.5")
    assert slow.returncode == 1 and "(ReadTimeout)" in one_error_line(slow)
    slow = cli(platform, "job", "cancel", "ft-1", env={"HTTP_REQUEST_TIMEOUT": "0.5"})
    assert slow.returncode == 1 and "(ReadTimeout)" in one_error_line(slow)


def test_a_request_that_cannot_be_built_is_not_sent_nor_retried():
    from runtime.platform import jobs
    from runtime.platform.http import Platform, RequestNotSent

    notes: list[str] = []
    client = Platform("ftp://example/api/v1", "sk-x", notify=notes.append)
    with client, pytest.raises(RequestNotSent, match=r"not sent.*UnsupportedProtocol"):
        jobs.submit(client, {"job_name": "x"})
    assert not notes  # no retry
