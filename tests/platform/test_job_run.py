"""``job run`` and the job commands: the checks made before anything is sent, the datasets
uploaded, the ids printed when a step fails, what the tables print. The real CLI (a
subprocess) against the stand-in platform."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import FT, cli, one_error_line, opd_job


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
    opd = opd_job(platform, workspace)
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
