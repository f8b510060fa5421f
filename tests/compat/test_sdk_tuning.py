"""The SDK's Tuning API (``dashscope.finetune.agentic_rl``) served where the SDK is absent:
a script written for the SDK's documentation, run unchanged (``python -m runtime.compat``)
against the stand-in platform; what it prints and what the platform was sent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FT

SCRIPT = Path(__file__).with_name("sdk_tuning_script.py")


def test_an_sdk_tuning_script_registers_uploads_and_submits_through_our_client(platform, workspace):
    shutil.copy(SCRIPT, workspace / SCRIPT.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASHSCOPE_", "FC_"))}
    # the key only as the script gives it: AgenticRL(api_key=...), no DASHSCOPE_API_KEY
    env.update(DASHSCOPE_HTTP_BASE_URL=platform.base_url, TUNING_KEY=platform.api_key)
    done = subprocess.run(
        [sys.executable, "-m", "runtime.compat", SCRIPT.name],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "instance True",
        "tested TaskStatus.SUCCESS 1.0",  # as the SDK prints its status enum
        "ids [1, 1, 0, 0, 0, 0] True",
        "files 1 1 True",
        "submitted 200 PENDING custom_job-",
        "get RUNNING",
        "list 1 True",
        "logs ['job started']",
        "cancel success",
        "delete success",
        "missing 404 NotFound None",  # as the SDK: output None
        "run 200 PENDING in-one-go",
    ]
    # the key given is the key sent, on every call (the SDK's B1 sent none on most)
    assert {r["authorization"] for r in platform.requests if r["path"].startswith("/api")} == {
        f"Bearer {platform.api_key}"
    }
    first, second = [
        r["json"] for r in platform.requests if r["method"] == "POST" and r["path"] == FT
    ]
    assert first["job_name"].startswith("custom_job-") and len(first["job_name"]) == 19
    assert first["hyper_parameters"] == {"n_epochs": 2}  # replaced whole, as in the SDK
    # each component with its own settings; the reward registered once, reused after
    assert first["rollout"]["name"] == "calc-rollout" and "cpu" not in first["rollout"]
    (reward,) = first["rewards"]
    assert reward["name"] == "answer-match" and reward["cpu"] == 1.0 and reward["weight"] == 1.0
    assert second["rewards"][0]["reward_id"] == reward["reward_id"]
    assert second["rollout"]["rollout_id"] == first["rollout"]["rollout_id"]
    created = [r["path"] for r in platform.requests if r["path"].startswith(f"{FT}/create/")]
    # the reward, then the rollout (and one layer each time): nothing registered twice
    assert [p for p in created if "faas" not in p] == [
        f"{FT}/create/reward",
        f"{FT}/create/rollout",
    ]
    assert [d["file_id"] in platform.files for d in second["training_datasets"]] == [True]
    assert second["job_name"].startswith("in-one-go-")


def test_two_instances_keep_their_keys_and_an_upload_replaces_only_its_kind(
    platform, workspace, monkeypatch
):
    import anyio

    from runtime.compat import agentic_rl

    monkeypatch.setattr(agentic_rl, "_default_key", None)  # the module-wide key, restored
    monkeypatch.setenv("DASHSCOPE_HTTP_BASE_URL", platform.base_url)
    monkeypatch.chdir(workspace)
    ours = agentic_rl.AgenticRL(api_key=platform.api_key)
    other = agentic_rl.AgenticRL(api_key="sk-other-0123456789abcdef")  # made last
    assert ours.list().status_code == 200  # its own key, not the last instance's
    refused = other.list()  # the stand-in knows only its own key
    assert refused.status_code == 401 and refused.output is None  # as the SDK answers
    assert refused["output"] is None and "output" in refused
    with pytest.raises(KeyError):
        refused["no such field"]

    rl = ours.init("rl-job.yaml")
    anyio.run(lambda: rl.upload_datasets(training_files=["data/calc_train.jsonl"]))
    anyio.run(lambda: rl.upload_datasets(validation_files=["data/calc_validation.jsonl"]))
    kinds = sorted((d.type, d.file_id in platform.files) for d in rl.tuning.datasets)
    assert kinds == [("training", True), ("validation", True)]  # the training set kept
