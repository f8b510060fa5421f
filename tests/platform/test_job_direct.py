"""``job run`` without a job file (the job made of options) and ``job submit`` of functions
registered and files uploaded before. The real CLI against the stand-in platform."""

from __future__ import annotations

import json

from helpers import FT, cli, one_error_line


def test_a_job_made_of_options_then_one_of_registered_ids(platform, workspace):
    runtimes = {"functions.reward.reward:DemoRewardProcessor": {"cpu": 1.5, "env": {"X": True}}}
    ran = cli(
        platform, "job", "run", "--model", "qwen3.5-9b",
        "--rollout-classpaths", "functions.rollout.rollout:DemoRolloutProcessor",
        "--reward-classpaths", "functions.reward.reward:DemoRewardProcessor",
        "functions.reward.safety:SafetyProcessor",
        "--reward-weights", "1.0", "0.2", "--runtimes", json.dumps(runtimes),
        "--training-files", "data/calc_train.jsonl", "--hyper-parameters", '{"n_epochs": 2}',
        "--job-name", "direct", "-o", "json", cwd=workspace,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    shown = json.loads(ran.stdout)
    assert shown["status"] == "PENDING" and shown["job_name"] == "direct"
    body = platform.jobs[shown["job_id"]].body
    assert body["model"] == "qwen3.5-9b" and body["hyper_parameters"] == {"n_epochs": 2}
    answer, safety = body["rewards"]
    assert (answer["weight"], answer["cpu"], answer["env"]) == (1.0, 1.5, {"X": "true"})
    assert safety["weight"] == 0.2 and "cpu" not in safety  # each its own runtime
    assert "cpu" not in body["rollout"]
    (file_id,) = shown["file_ids"].values()
    assert body["training_datasets"] == [
        {"type": "training", "data_source_type": "file_id", "file_name": "data/calc_train.jsonl",
         "file_id": file_id}
    ]  # fmt: skip

    # the same functions and file, submitted again by id, nothing registered or uploaded
    rollout_id = body["rollout"]["rollout_id"]
    before = len(platform.requests)
    submitted = cli(
        platform, "job", "submit", "--model", "qwen3.5-9b", "--rollout-id", rollout_id,
        "--reward-ids", f"answer={answer['reward_id']}", safety["reward_id"],
        "--reward-weights", "1", "0.5", "--training-file-ids", file_id,
        "--runtimes", json.dumps({"answer": {"cpu": 2}}), "-o", "json", cwd=workspace,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert [r["path"] for r in platform.requests[before:]] == [FT]
    again = platform.jobs[json.loads(submitted.stdout)["job_id"]].body
    assert again["rollout"]["rollout_id"] == rollout_id
    first, second = again["rewards"]
    assert (first["name"], first["weight"], first["cpu"]) == ("answer", 1.0, 2)
    assert second["reward_id"] == safety["reward_id"] and second["weight"] == 0.5
    assert again["training_datasets"] == [
        {"type": "training", "data_source_type": "file_id", "file_id": file_id}
    ]


def test_options_that_make_no_job_are_usage_errors(platform, workspace):
    nothing = cli(platform, "job", "submit", "--model", "m", cwd=workspace)
    assert nothing.returncode == 2
    assert "job submit needs -c YAML, or a job made of options" in one_error_line(nothing)
    weights = cli(
        platform, "job", "submit", "--rollout-id", "ro-1", "--reward-ids", "rw-1",
        "--reward-weights", "1", "2", "--training-file-ids", "file-1", cwd=workspace,
    )  # fmt: skip
    assert weights.returncode == 2
    assert "--reward-weights gives 2 weight(s) for 1 reward(s)" in one_error_line(weights)
    assert platform.requests == []  # nothing was sent
