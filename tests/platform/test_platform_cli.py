"""The platform commands, run as the real CLI (a subprocess) against the stand-in platform
(tests/platform_standin.py), whose instances run the uploaded zips' start.sh for real."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import pty
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path

import pytest
from conftest import SAMPLES, SPEC_EXAMPLES, free_port
from helpers import FT, RawServer, cli, http, one_error_line, wait_for

from runtime.platform import jobs
from runtime.platform.http import Platform, PlatformError, UnclearOutcome


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(root.rglob("*"))
    }


def test_job_run_wait_registers_uploads_submits_and_follows_to_success(platform, workspace):
    before = snapshot(workspace)
    done = cli(
        platform, "job", "run", "-c", "rl-job.yaml", "--wait", "--poll-interval", "0.05",
        "-o", "json", cwd=workspace,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["status"] == "SUCCEEDED" and shown["job_id"].startswith("ft-")
    assert shown["job_name"].startswith("calc-agent-")
    job = shown["job_id"]
    for line in (f"job {job}: RUNNING", "  | step 1 loss=0.50", f"job {job}: SUCCEEDED"):
        assert line in done.stderr
    assert platform.api_key not in done.stdout + done.stderr
    assert "\x1b" not in done.stderr  # not a terminal: plain lines
    assert snapshot(workspace) == before  # nothing written into the workspace

    # one layer for three functions with the same requirements; one zip each
    paths = platform.paths()
    registering = [
        f"POST {FT}/create/faas/layer",
        *[f"POST {FT}/generate/faas/upload/url", "PUT", f"POST {FT}/create/rollout"],
        *[f"POST {FT}/generate/faas/upload/url", "PUT", f"POST {FT}/create/reward"],
        *[f"POST {FT}/generate/faas/upload/url", "PUT", f"POST {FT}/create/reward"],
        "POST /api/v1/files",
        "POST /api/v1/files",
        f"POST {FT}",
    ]
    assert [p if not p.startswith("PUT") else "PUT" for p in paths[: len(registering)]] == (
        registering
    )
    assert set(paths[len(registering) :]) == {f"GET {FT}/{job}", f"GET {FT}/{job}/logs"}
    for request in platform.requests:  # the key on every platform call, never to storage
        expected = None if request["method"] == "PUT" else f"Bearer {platform.api_key}"
        assert request["authorization"] == expected, request["path"]

    zips = [zipfile.ZipFile(io.BytesIO(data)) for data in platform.uploads.values()]
    scripts = sorted(
        line
        for z in zips
        for line in z.read("start.sh").decode().splitlines()
        if "PROCESSOR_CLASS=" in line
    )
    assert scripts == [
        "export PROCESSOR_CLASS=functions.reward.reward:DemoRewardProcessor",
        "export PROCESSOR_CLASS=functions.reward.safety:SafetyProcessor",
        "export PROCESSOR_CLASS=functions.rollout.rollout:DemoRolloutProcessor",
    ]
    contents = [{n: z.read(n) for n in z.namelist() if n != "start.sh"} for z in zips]
    assert contents[0] == contents[1] == contents[2]  # the same apart from start.sh
    assert "rl-job.yaml" in contents[0] and not any(n.startswith("data/") for n in contents[0])

    body = platform.requests[len(registering) - 1]["json"]
    layer = "layer-0001"
    entity = shown["entity_ids"]
    files = shown["file_ids"]
    assert body == {
        "model": "qwen3.5-9b",
        "training_datasets": [
            {
                "type": "training",
                "data_source_type": "file_id",
                "file_name": "./data/calc_train.jsonl",
                "file_id": files["./data/calc_train.jsonl"],
            }
        ],
        "validation_datasets": [
            {
                "type": "validation",
                "data_source_type": "file_id",
                "file_name": "./data/calc_validation.jsonl",
                "file_id": files["./data/calc_validation.jsonl"],
            }
        ],
        "rollout": {
            "rollout_id": entity["functions[0] (calc-rollout)"],
            "name": "calc-rollout",
            "timeout": 600,
            "layer_code": layer,
            "cpu": 2.0,
            "memory_size": 4096,
            "disk_size": 512,
            "concurrency": 30,
            "capacity": 30,
            "max_capacity": 60,
            "min_capacity": 30,
            "memory_scale_threshold": 0.6,
            "concurrency_scale_threshold": 0.6,
        },
        "rewards": [
            {
                "reward_id": entity["functions[1] (answer-match)"],
                "name": "answer-match",
                "weight": 1.0,
                "timeout": 120,
                "layer_code": layer,
                "cpu": 1.0,
                "memory_size": 2048,
                "concurrency": 64,
                "env": {"ENABLE_TRAJECTORY": "true"},
            },
            {
                "reward_id": entity["functions[2] (safety)"],
                "name": "safety",
                "weight": 0.2,
                "timeout": 120,
                # from the class's @sub_reward_func registry, without the aggregate
                "reward_metric_weight": {"no_unsafe_content": 0.7, "concise": 0.3},
                "layer_code": layer,
            },
        ],
        "hyper_parameters": {
            "algorithm": "gspo",
            "batch_size": 64,
            "eval_steps": 1,
            "kl_loss_coef": 0.002,
            "learning_rate": 2e-6,
            "lr_scheduler_type": "linear",
            "max_length": 8192,
            "n_epochs": 1,
            "n_rollouts": 8,
            "ppo_mini_batch_size": 8,
            "save_steps": 100,
            "save_strategy": "steps",
            "save_total_limit": 1,
        },
        "resource_config": {
            "charge_type": "mtu_postpaid", "mtu_spec_code": "MTU4", "mtu_capacity": 24
        },
        "training_type": "reinforcement",
        "job_name": shown["job_name"],
    }  # fmt: skip
    layer_body = platform.requests[0]["json"]
    assert "openai>=1.40" in layer_body["requirements_content"]
    assert "pydantic==" in layer_body["requirements_content"]


def test_register_starts_instances_that_serve_the_uploaded_zip(platform, workspace):
    done = cli(
        platform, "register", "--reward", "functions.reward.reward:DemoRewardProcessor",
        "--group-reward", "functions/reward/group_reward.py:DemoGroupRewardProcessor",
        "--no-lazy-load", "--poll-interval", "0.1", "--timeout", "120", "-o", "json", cwd=workspace,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ids = json.loads(done.stdout)
    assert list(ids) == [
        "rollout_entity_ids", "reward_entity_ids", "group_reward_entity_ids",
        "rollout_instance_ids", "reward_instance_ids", "group_reward_instance_ids",
    ]  # fmt: skip
    assert ids["reward_entity_ids"][0].startswith("rw-")
    assert ids["group_reward_entity_ids"][0].startswith("grw-")
    (reward,) = ids["reward_instance_ids"]
    (group,) = ids["group_reward_instance_ids"]
    loads = [r for r in platform.requests if "/online/faas/jobId-" in r["path"]]
    assert [r["json"] for r in loads] == [{"layer_code": "layer-0001"}] * 2
    assert "waiting for 2 instance(s) to be active: done" in done.stderr

    # the sample reward's real score, computed by `python -m runtime serve` from the zip
    scored = cli(
        platform, "test-function", reward, "--type", "reward", "--input",
        "requests/reward.json", "-o", "json", cwd=workspace,
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["reward"] == {
        "reward_score": 1.0,
        "reward_metrics": {"answer_found": 1.0},
    }
    wrong = cli(
        platform, "test-function", reward, "--type", "reward", "--input",
        '{"agent_output": {"messages": [{"role": "assistant", "content": "41"}]}, '
        '"ground_truth": "42", "my_field": {"kept": true}}', "-o", "json",
    )  # fmt: skip
    assert wrong.returncode == 0 and json.loads(wrong.stdout)["reward"]["reward_score"] == 0.0
    sent = [r for r in platform.requests if r["path"].startswith("/fc/")]
    assert sent[-1]["json"]["my_field"] == {"kept": True}  # unknown fields travel
    assert all(r["authorization"] != f"Bearer {platform.api_key}" for r in sent)
    grouped = cli(
        platform, "test-function", group, "-t", "group_reward", "-i", "requests/group_reward.json",
        cwd=workspace,
    )  # fmt: skip
    assert grouped.returncode == 0, grouped.stderr
    assert grouped.stdout.splitlines()[1].startswith("status")

    logs = cli(platform, "instance", "logs", reward)
    assert logs.returncode == 0 and "DemoRewardProcessor serving reward" in logs.stdout
    deleted = cli(platform, "instance", "delete", reward, "-o", "json")
    assert deleted.returncode == 0 and json.loads(deleted.stdout)["status"] == "deleted"
    assert reward not in platform.instances


def test_test_function_takes_the_sdk_example_input_and_fails_on_a_failed_output(platform, tmp_path):
    ws = tmp_path / "fails"
    (ws / "fns").mkdir(parents=True)
    (ws / "fns" / "__init__.py").write_text("")
    (ws / "fns" / "bad.py").write_text(
        "from processors_base import AbstractRewardProcessor\n\n\n"
        "class Broken(AbstractRewardProcessor):\n"
        "    def process(self, input_data):\n"
        "        raise ValueError('no score for ' + str(input_data.ground_truth))\n"
    )
    done = cli(
        platform, "register", str(ws), "--reward", "fns.bad:Broken", "--no-lazy-load",
        "--poll-interval", "0.1", "--timeout", "120", "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (instance,) = json.loads(done.stdout)["reward_instance_ids"]
    failed = cli(
        platform, "test-function", instance, "--type", "reward", "--input",
        str(SPEC_EXAMPLES / "resources" / "reward_input.json"), "-o", "json",
    )  # fmt: skip
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["status"] == "failed"
    assert "no score for 0.5" in one_error_line(failed)


def test_every_error_is_one_line_and_local_errors_send_nothing(platform, workspace):
    wrong = cli(platform, "job", "get", "ft-1", "--api-key", "sk-wrong-key-123")
    assert wrong.returncode == 1
    line = one_error_line(wrong)
    assert line.startswith("error: getting job ft-1 failed: HTTP 401 InvalidApiKey: Invalid")
    assert "(request id " in line
    assert "sk-wrong-key-123" not in wrong.stdout + wrong.stderr
    assert platform.requests[-1]["authorization"] == "Bearer sk-wrong-key-123"  # the key given

    missing = cli(platform, "job", "get", "ft-404")
    assert missing.returncode == 1
    assert "HTTP 404 NotFound: job not found" in one_error_line(missing)
    # function calls answer HTTP 200 with the failure in a status object or a code
    no_instance = cli(platform, "test-function", "rw-ins-0", "-t", "reward", "-i", "{}")
    assert no_instance.returncode == 2  # invalid input: checked before anything is sent
    no_instance = cli(
        platform, "test-function", "rw-ins-0", "-t", "reward", "-i", '{"agent_output": {}}'
    )
    assert no_instance.returncode == 1
    assert one_error_line(no_instance) == (
        "error: querying instance rw-ins-0 failed: HTTP 404: no such instance"
    )
    not_deleted = cli(platform, "instance", "delete", "rw-ins-0")
    assert not_deleted.returncode == 1
    assert one_error_line(not_deleted) == (
        "error: deleting instance rw-ins-0 failed: 404: no such instance"
    )

    count = len(platform.requests)
    no_key = cli(platform, "job", "list", key="")
    assert no_key.returncode == 2 and "no API key" in one_error_line(no_key)
    placeholder = cli(
        platform, "job", "list", env={"DASHSCOPE_HTTP_BASE_URL": "http://x/{workspace_id}"}
    )
    assert placeholder.returncode == 1
    assert "{workspace_id} placeholder: pass --workspace-id" in one_error_line(placeholder)
    bad_format = cli(platform, "job", "list", "-o", "xml")
    assert bad_format.returncode == 2
    bad_class = cli(platform, "register", "--reward", "functions.reward.reward:Nope", cwd=workspace)
    assert bad_class.returncode == 1
    line = one_error_line(bad_class)
    assert "has no attribute 'Nope'" in line
    assert line.endswith("(imported from the package, checked locally, nothing uploaded)")
    (workspace / "data" / "calc_train.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}]}\n[1]\n{"prompt": "x"}\n{oops\n'
    )
    bad_data = cli(platform, "job", "run", "-c", "rl-job.yaml", cwd=workspace)
    assert bad_data.returncode == 1
    assert (
        "rl-job.yaml:49: datasets[0].file_name: " in one_error_line(bad_data)
        and "4 bad line(s)" not in bad_data.stderr
        and "3 bad line(s): line 2: not a JSON object; line 3: no 'messages' list; line 4: not JSON"
        in bad_data.stderr
    )
    bad_upload = cli(
        platform, "upload-data", "--training", "data/calc_validation.jsonl",
        "--validation", "data/calc_train.jsonl", cwd=workspace,
    )  # fmt: skip
    assert bad_upload.returncode == 1 and "line 2: not a JSON object" in bad_upload.stderr
    assert len(platform.requests) == count  # none of these sent anything

    (workspace / "data" / "calc_train.jsonl").write_text('{"messages": [{"role": "u"}]}\n')
    refused = cli(
        platform, "job", "run", "-c", str(workspace / "rl-job.yaml"),
        env={"FC_REGISTER_REWARD_API": f"{platform.base_url}/nowhere"},
    )  # fmt: skip
    assert refused.returncode == 1
    assert one_error_line(refused).startswith(
        "error: registering functions[1] (answer-match) failed: HTTP 404"
    )


def test_retries_on_busy_with_progress_and_never_repeats_a_creating_post(platform, workspace):
    platform.busy[f"{FT}/generate/faas/upload/url"] = 2
    done = cli(
        platform, "register", "--reward", "functions.reward.reward:DemoRewardProcessor",
        cwd=workspace,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "platform busy (HTTP 503), retry 1 in 1 s" in done.stderr  # Retry-After: 1
    assert "platform busy (HTTP 503), retry 2 in 1 s" in done.stderr
    paths = platform.paths()
    assert paths.count(f"POST {FT}/generate/faas/upload/url") == 3
    assert paths.count(f"POST {FT}/create/reward") == 1

    platform.slow[FT] = 3.0  # an answer that never comes in time
    client = Platform(platform.base_url, platform.api_key, timeout=0.5)
    with client, pytest.raises(UnclearOutcome, match="not retried, so that nothing is created"):
        jobs.submit(client, {"job_name": "x"})
    # under load the stand-in may read the POST only after the client's timeout fired
    wait_for(lambda: f"POST {FT}" in platform.paths(), "the stand-in to record the POST")
    assert platform.paths().count(f"POST {FT}") == 1


def test_connection_failures_are_retried_within_the_deadline():
    notes: list[str] = []
    closed = f"http://127.0.0.1:{free_port()}/api/v1"
    client = Platform(closed, "sk-x", deadline=1.5, notify=notes.append)
    with client, pytest.raises(PlatformError) as caught:
        jobs.submit(client, {"job_name": "x"})
    assert "cannot connect to 127.0.0.1" in str(caught.value)
    assert "gave up after 1.5 s of retries" in str(caught.value)
    assert notes and notes[0].startswith("cannot connect to 127.0.0.1")
    assert ", retry 1 in " in notes[0]


def test_job_management_and_opd_with_an_exact_job_name(platform, workspace):
    uploaded = cli(
        platform, "upload-data", "--training", "data/calc_train.jsonl", "-o", "json",
        cwd=workspace,
    )  # fmt: skip
    assert uploaded.returncode == 0, uploaded.stderr
    (file_id,) = json.loads(uploaded.stdout)["training_file_ids"]
    opd = workspace / "opd.yaml"
    opd.write_text(
        f"teacher_model: qwen3.5-397b-a17b\ndatasets:\n- {{type: training, file_id: {file_id}}}\n"
    )
    submitted = cli(
        platform, "job", "run", "-c", str(opd), "--job-name", "my-distillation", "-o", "yaml"
    )
    assert submitted.returncode == 0, submitted.stderr
    assert "status: PENDING" in submitted.stdout
    assert platform.requests[-1]["json"] == {
        "training_datasets": [
            {"type": "training", "data_source_type": "file_id", "file_id": file_id}
        ],
        "training_type": "pg_opd",
        "teacher_model": "qwen3.5-397b-a17b",
        "job_name": "my-distillation",
    }
    (job_id,) = platform.jobs

    listed = cli(platform, "job", "list", "--workspace-id", "ws-9")
    assert listed.returncode == 0
    assert platform.requests[-1]["workspace"] == "ws-9"
    assert listed.stdout.splitlines()[0].split() == [
        "JOB_ID", "JOB_NAME", "STATUS", "MODEL", "CREATE_TIME"
    ]  # fmt: skip
    assert job_id in listed.stdout and "my-distillation" in listed.stdout
    assert "GET /api/v1/fine-tunes" in platform.paths()
    assert platform.requests[-1]["query"] == {"page_no": "1", "page_size": "10"}
    got = cli(platform, "job", "get", job_id, "-o", "json")
    assert json.loads(got.stdout)["status"] == "RUNNING"
    logs = cli(platform, "job", "logs", job_id, "--offset", "2", "--lines", "5")
    assert logs.stdout.splitlines() == ["step 1 loss=0.50 reward=0.10"]
    assert platform.requests[-1]["query"] == {"offset": "2", "line": "5"}
    refused = cli(platform, "job", "delete", job_id)
    assert refused.returncode == 1
    assert "HTTP 400 InvalidOperation: cannot delete a RUNNING job" in one_error_line(refused)
    followed = cli(platform, "job", "logs", job_id, "--follow", "--poll-interval", "0.05")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines()[-1] == "job succeeded"
    assert cli(platform, "job", "cancel", job_id).returncode == 0
    assert platform.jobs[job_id].status == "CANCELED"
    assert platform.requests[-1]["size"] == 0  # cancel has no body
    assert cli(platform, "job", "delete", job_id).returncode == 0
    assert job_id not in platform.jobs


def test_job_wait_exits_non_zero_when_the_job_fails(platform, workspace):
    platform.job_outcome = "FAILED"
    done = cli(
        platform, "job", "run", "-c", "rl-job.yaml", "--wait", "--poll-interval", "0.05",
        cwd=workspace,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout.splitlines()[1].split() == ["status", "FAILED"]
    (job_id,) = platform.jobs
    again = cli(platform, "job", "wait", job_id, "-o", "json")
    assert again.returncode == 1 and json.loads(again.stdout)["status"] == "FAILED"


EXAMPLE_CLASSES = {
    "functions/rollout/rollout.py": (
        "from processors_base import AbstractRolloutProcessor, RolloutOutput\n\n\n"
        "class CalcXRolloutProcessor(AbstractRolloutProcessor):\n"
        "    async def process(self, input_data):\n"
        "        return RolloutOutput()\n"
    ),
    "functions/reward/reward.py": (
        "from processors_base import AbstractRewardProcessor, Reward, RewardOutput\n\n\n"
        "class DemoRewardProcessor(AbstractRewardProcessor):\n"
        "    async def process(self, input_data):\n"
        "        return RewardOutput(reward=Reward(reward_score=1.0))\n"
    ),
}


def test_the_sdk_example_job_replays_the_spec_captured_request_shapes(platform, tmp_path):
    """The SDK's own job.yaml and opd-job.yaml, run as they are: the requests have the
    shapes the spec captured from the SDK (§2.4-2.7, §4.2, §5.5), apart from the documented
    differences (one layer for both functions, learning_rate a number)."""
    ws = tmp_path / "example"
    shutil.copytree(SPEC_EXAMPLES, ws)
    for name, source in EXAMPLE_CLASSES.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(source)
    (ws / "requirements.txt").write_text("")
    done = cli(platform, "job", "run", "-c", "job.yaml", "-o", "json", cwd=ws)
    assert done.returncode == 0, done.stderr
    by_path: dict[str, list[dict]] = {}
    for request in platform.requests:
        by_path.setdefault(request["path"].rsplit("/oss/", 1)[0], []).append(request)
    (layer,) = by_path[f"{FT}/create/faas/layer"]
    assert set(layer["json"]) == {"layer_name", "requirements_content"}
    assert layer["json"]["layer_name"].startswith("fc_layer-")
    for request in by_path[f"{FT}/generate/faas/upload/url"]:
        assert set(request["json"]) == {"unique_key"}
    (rollout,) = by_path[f"{FT}/create/rollout"]
    assert rollout["json"]["name"] == "functions/rollout/rollout.py"
    assert rollout["json"]["func"] == "CalcXRolloutProcessor"
    assert rollout["json"]["unique_key"].startswith("rollout-")
    assert "Signature=" in rollout["json"]["code_url"]
    files = by_path["/api/v1/files"]
    assert [f["content_type"].split(";")[0] for f in files] == ["multipart/form-data"] * 2
    (submit,) = by_path[FT]
    body = submit["json"]
    runtime = {
        "layer_code": "layer-0001", "cpu": 2.0, "memory_size": 4096, "disk_size": 512,
        "concurrency": 30, "capacity": 30, "max_capacity": 60, "min_capacity": 30,
        "memory_scale_threshold": 0.6, "concurrency_scale_threshold": 0.6,
    }  # fmt: skip
    ids = json.loads(done.stdout)
    assert body["rollout"] == {
        "rollout_id": ids["entity_ids"]["functions[0] (rollout-1)"],
        "name": "rollout-1",
        "timeout": 600,
        **runtime,
    }
    assert body["rewards"] == [
        {
            "reward_id": ids["entity_ids"]["functions[1] (rewards-1)"],
            "name": "rewards-1",
            "weight": 1.0,
            "timeout": 120,
            "reward_metric_weight": {"reward_metric_weightA": 0.3, "reward_metric_weightB": 0.7},
            **runtime,
        }
    ]
    assert body["training_datasets"] == [
        {
            "type": "training",
            "data_source_type": "file_id",
            "file_name": "./data/calc_train_min.jsonl",
            "file_id": ids["file_ids"]["./data/calc_train_min.jsonl"],
        }
    ]
    assert body["hyper_parameters"]["learning_rate"] == 2e-6  # the spec captured "2e-6"
    assert body["resource_config"] == {
        "charge_type": "mtu_postpaid", "mtu_spec_code": "MTU4", "mtu_capacity": 24
    }  # fmt: skip
    assert body["training_type"] == "reinforcement" and body["model"] == "qwen3.5-9b"
    assert body["job_name"].startswith("agentic-rl-from-yaml-") and len(body["job_name"]) == 29
    assert set(body) == {
        "model", "training_datasets", "validation_datasets", "rollout", "rewards",
        "hyper_parameters", "resource_config", "training_type", "job_name",
    }  # fmt: skip

    opd = cli(platform, "job", "run", "-c", "opd-job.yaml", "-o", "json", cwd=ws)
    assert opd.returncode == 0, opd.stderr
    body = platform.requests[-1]["json"]
    assert body["training_type"] == "pg_opd" and body["teacher_model"] == "qwen3.5-397b-a17b"
    assert body["job_name"].startswith("opd-from-yaml-") and "resource_config" not in body
    assert body["hyper_parameters"]["lr_scheduler_type"] == "cosine"


def test_progress_on_a_terminal_uses_rich(platform, workspace):
    main, secondary = pty.openpty()
    env = {**os.environ, "DASHSCOPE_API_KEY": platform.api_key, "TERM": "xterm"}
    env["DASHSCOPE_HTTP_BASE_URL"] = platform.base_url
    with subprocess.Popen(
        [sys.executable, "-m", "runtime", "register", "--reward",
         "functions.reward.reward:DemoRewardProcessor", "-o", "json"],
        cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=secondary,
    ) as process:  # fmt: skip
        os.close(secondary)
        shown = json.loads(process.stdout.read())
        assert process.wait(300) == 0
    screen = b""
    with contextlib.suppress(OSError):  # EIO once the terminal's other end is closed
        while chunk := os.read(main, 65536):
            screen += chunk
    os.close(main)
    assert shown["reward_entity_ids"][0].startswith("rw-")
    assert b"\x1b[?25l" in screen  # rich hides the cursor for its spinner
    assert b"registered functions.reward.reward:DemoRewardProcessor" in screen


# ---- what is printed, and local mistakes ----


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


def test_a_request_that_cannot_be_built_is_not_sent_nor_retried():
    from runtime.platform import jobs
    from runtime.platform.http import Platform, RequestNotSent

    notes: list[str] = []
    client = Platform("ftp://example/api/v1", "sk-x", notify=notes.append)
    with client, pytest.raises(RequestNotSent, match=r"not sent.*UnsupportedProtocol"):
        jobs.submit(client, {"job_name": "x"})
    assert not notes  # no retry


# ---- numbers and ids on the command line, extra files ----

BAD_NUMBERS = [
    ("job", "wait", "ft-1", "--poll-interval", "-1"),
    ("job", "wait", "ft-1", "--poll-interval", "nan"),
    ("job", "wait", "ft-1", "--poll-interval", "1e300"),
    ("job", "wait", "ft-1", "--poll-interval", "0"),
    ("job", "wait", "ft-1", "--timeout", "-1"),
    ("job", "wait", "ft-1", "--timeout", "nan"),
    ("job", "run", "-c", "job.yaml", "--wait", "--poll-interval", "-1"),
    ("job", "logs", "ft-1", "--follow", "--poll-interval", "-1"),
    ("job", "logs", "ft-1", "--lines", "0"),
    ("job", "logs", "ft-1", "--offset", "0"),
    ("job", "list", "--size", "0"),
    ("job", "list", "--page", "-3"),
    ("job", "get", "ft-1", "--request-timeout", "0"),
    ("register", "--reward", "fns:X", "--timeout", "inf"),
]


@pytest.mark.parametrize("args", BAD_NUMBERS, ids=[" ".join(a[:2] + a[-2:]) for a in BAD_NUMBERS])
def test_a_number_that_means_nothing_is_a_usage_error(tmp_path: Path, args) -> None:
    """``--poll-interval -1`` (or nan, or 1e300) ended in a traceback from time.sleep, after
    a request; ``0`` asks the platform in a loop without a pause; ``--timeout -1`` said the
    job's state was unknown (exit 3); ``--request-timeout 0`` was taken for 600; sizes and
    pages of 0 or less were sent as they were."""
    (tmp_path / "job.yaml").write_text("teacher_model: t\ndatasets:\n- {file_id: file-1}\n")
    asked: list[str] = []

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(f"{method} {target}")
        writer.write(http(404, b'{"message": "no"}'))

    with RawServer(handle) as server:
        done = cli(server, *args, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert not asked
    assert args[-2] in done.stderr.splitlines()[-1], done.stderr


@pytest.mark.parametrize(
    ("args", "sent"),
    [
        (("job", "delete", "../files/file-1"), f"DELETE {FT}/..%2Ffiles%2Ffile-1"),
        (("job", "cancel", "ft-1/../ft-2"), f"POST {FT}/ft-1%2F..%2Fft-2/cancel"),
        (("job", "get", "ft-1?page_no=9"), f"GET {FT}/ft-1%3Fpage_no%3D9"),
        (("instance", "delete", "ins-1#x"), f"POST {FT}/delete/faas/ins-1%23x"),
        (("job", "delete", ".."), None),
        (("instance", "logs", "."), None),
    ],
)
def test_an_id_is_one_segment_of_the_url_never_a_path(args, sent) -> None:
    """``job delete ../files/file-1`` sent ``DELETE /api/v1/files/file-1`` (another
    resource, deleted with the user's key), ``job cancel ft-1/../ft-2`` cancelled ft-2 and
    ``job get 'ft-1?page_no=9'`` sent a query: an id copied from anywhere (a job list of a
    hostile platform, a script) must name what it names."""
    asked: list[str] = []

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(f"{method} {target}")
        writer.write(http(404, b'{"message": "no"}'))

    with RawServer(handle) as server:
        done = cli(server, *args, timeout=60)
    assert "Traceback" not in done.stderr
    if sent is None:
        assert done.returncode == 2, done.stderr
        assert not asked
        assert f"{args[-1]!r} is not an id" in one_error_line(done)
    else:
        assert done.returncode == 1, done.stderr  # the 404
        assert asked == [sent]


def test_an_extra_file_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    """``fcmodel.extra_files`` naming a file that is not there (a typo) was skipped
    silently: the function shipped without it, to fail on the platform."""
    import shutil

    workspace = Path(
        shutil.copytree(SAMPLES, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    )
    (workspace / "job.yaml").write_text(
        "teacher_model: t\n"
        "functions:\n"
        "- type: reward\n"
        "  fcmodel:\n"
        "    classpath: functions.reward.reward:DemoRewardProcessor\n"
        "    extra_files: [./configs/setings.yaml]\n"
        "datasets:\n- {file_id: file-1}\n"
    )
    asked: list[str] = []

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(f"{method} {target}")
        writer.write(http(404, b'{"message": "no"}'))

    with RawServer(handle) as server:
        done = cli(server, "job", "run", "-c", "job.yaml", cwd=workspace, timeout=120)
    assert done.returncode == 2, done.stderr
    assert not asked
    line = one_error_line(done)
    assert "configs/setings.yaml" in line and "extra_files" in line, line
