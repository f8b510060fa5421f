"""The platform's Python API (``runtime.platform.client``), in process against the stand-in
platform: every method, the async twins, typed results and errors, two keys at once."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from helpers import RawServer, http, send, wait_for

from runtime.platform.client import (
    AsyncPlatformClient,
    ConfigError,
    FunctionTest,
    Job,
    JobEvent,
    PlatformClient,
    PlatformError,
    RegisteredFunctions,
    UploadedFiles,
    WaitTimeout,
    job_file,
)


def _client(platform, **settings) -> PlatformClient:
    return PlatformClient(platform.api_key, base_url=platform.base_url, **settings)


def test_register_upload_submit_and_follow_a_job(platform, workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    notes: list[str] = []
    client = _client(platform, notify=notes.append)
    ids = client.register(
        rollout=["functions.rollout.rollout:DemoRolloutProcessor"],
        reward=["functions.reward.reward:DemoRewardProcessor"],
    )
    assert isinstance(ids, RegisteredFunctions)
    assert ids.rollout_entity_ids[0].startswith("ro-") and ids.reward_entity_ids[0].startswith(
        "rw-"
    )
    assert ids.group_reward_entity_ids == ids.reward_instance_ids == []  # lazy: none started
    assert any(note.startswith("registered functions.reward.reward") for note in notes)

    files = client.upload_datasets("data/calc_train.jsonl", ["data/calc_validation.jsonl"])
    assert isinstance(files, UploadedFiles) and set(platform.files) == {
        *files.training_file_ids, *files.validation_file_ids
    }  # fmt: skip

    # submit: a job file whose functions and datasets exist on the platform already
    job = job_file("rl-job.yaml")
    for spec, entity in zip(
        job.config.functions, [*ids.rollout_entity_ids, *ids.reward_entity_ids * 2], strict=True
    ):
        spec.entity_id = entity
    for dataset, file_id in zip(
        job.config.datasets, files.training_file_ids + files.validation_file_ids, strict=True
    ):
        dataset.file_name, dataset.file_id = None, file_id
    submitted = client.submit(job, job_name="exact-name", hyper_parameters={"n_epochs": 3})
    assert isinstance(submitted, Job) and submitted.status == "PENDING"
    body = platform.requests[-1]["json"]
    assert body["job_name"] == "exact-name" and body["hyper_parameters"] == {"n_epochs": 3}
    assert body["rollout"]["rollout_id"] == ids.rollout_entity_ids[0]

    # follow it: a callback per status change and log line, the final job returned
    seen: list[str] = []
    final = client.wait(
        submitted.job_id,
        on_status=seen.append,
        on_line=lambda line: seen.append(f"| {line}"),
        interval=0.01,
    )
    assert final.status == "SUCCEEDED" and seen[0] == "RUNNING"
    assert seen[-2:] == ["SUCCEEDED", "| job succeeded"]
    assert "| step 2 loss=0.40 reward=0.35" in seen
    assert list(client.logs(submitted.job_id, page_size=2)) == platform.jobs[final.job_id].logs
    assert list(client.logs(submitted.job_id, offset=3)) == platform.jobs[final.job_id].logs[2:]
    assert client.get(final.job_id).status == "SUCCEEDED"
    assert client.delete(final.job_id).status == "success"
    assert final.job_id not in platform.jobs


def test_run_from_a_job_file_with_overrides_and_watch_it(platform, workspace):
    client = _client(platform)
    run = client.run(workspace / "rl-job.yaml", model="qwen3-8b", job_name="run-1")
    assert run.job_id and run.job and run.job.model == "qwen3-8b" and run.status == "PENDING"
    assert set(run.entity_ids) == {
        "functions[0] (calc-rollout)", "functions[1] (answer-match)", "functions[2] (safety)"
    }  # fmt: skip
    assert list(run.file_ids) == ["./data/calc_train.jsonl", "./data/calc_validation.jsonl"]
    assert platform.jobs[run.job_id].body["job_name"] == "run-1"
    # an iterator of status changes, ending at the final one
    events = list(client.watch(run.job_id, interval=0.01))
    assert events == [
        JobEvent(kind="status", text="RUNNING"), JobEvent(kind="status", text="SUCCEEDED")
    ]  # fmt: skip
    with pytest.raises(WaitTimeout):  # a job that never ends, within the time given
        platform.job_outcome = "RUNNING"
        second = client.run(workspace / "rl-job.yaml")
        client.wait(str(second.job_id), interval=0.05, timeout=0.3)
    assert client.cancel(str(second.job_id)).status == "success"
    with pytest.raises(ConfigError, match=r"pg_opd .* needs a teacher model"):
        job = job_file(workspace / "rl-job.yaml")
        job.config.training.type = "pg_opd"
        client.run(job)


def test_list_iterates_every_page_and_errors_are_typed(platform, workspace):
    client = _client(platform)
    for n in range(5):
        client.run(workspace / "rl-job.yaml", job_name=f"job-{n}")
    names = [job.job_name for job in client.list_jobs(page_size=2)]
    assert names == [f"job-{n}" for n in range(5)]
    assert [(r["query"]["page_no"], r["query"]["page_size"]) for r in platform.requests[-3:]] == [
        ("1", "2"), ("2", "2"), ("3", "2")
    ]  # fmt: skip
    page = client.list_page(2, 3)
    assert (page.page_no, page.total, len(page.jobs)) == (2, 5, 2)
    with pytest.raises(PlatformError) as refused:
        client.get("ft-nope")
    assert (refused.value.status, refused.value.code) == (404, "NotFound")
    assert refused.value.request_id  # the platform's, to quote to its support


def test_two_clients_with_two_keys_never_mix_and_no_message_holds_a_key(platform):
    platform.echo_key = True  # a careless platform that repeats a wrong key back
    good = AsyncPlatformClient(platform.api_key, base_url=platform.base_url)
    wrong_key = "sk-wrong-0123456789abcdef"
    bad = AsyncPlatformClient(wrong_key, base_url=platform.base_url)

    async def both() -> list[object]:
        calls = [good.list_page(), bad.list_page(), good.list_page(), bad.list_page()]
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(both())
    assert [type(a).__name__ for a in answers] == ["JobPage", "PlatformError"] * 2
    sent = {r["authorization"] for r in platform.requests}
    assert sent == {f"Bearer {platform.api_key}", f"Bearer {wrong_key}"}
    for error in answers[1::2]:
        assert "sk-wrong" not in str(error) and "c2std3Jvbm" not in str(error)
    assert "sk-" not in repr(good) and "sk-" not in repr(bad.sync)
    with pytest.raises(PlatformError, match="no API key"):
        PlatformClient("", base_url=platform.base_url)


def test_async_twins_and_a_started_instance(platform, workspace):
    client = AsyncPlatformClient(platform.api_key, base_url=platform.base_url)
    request = json.loads((workspace / "requests" / "reward.json").read_text())

    async def session() -> tuple[object, ...]:
        ids = await client.register(
            workspace,
            reward=["functions.reward.reward:DemoRewardProcessor"],
            lazy=False,
            poll_interval=0.1,
            timeout=120,
        )
        (instance,) = ids.reward_instance_ids
        tested = await client.test_function(instance, "reward", request)
        logs = await client.instance_logs(instance)
        deleted = await client.delete_instance(instance)
        run = await client.run(workspace / "rl-job.yaml")
        jobs = [job.job_id async for job in client.list_jobs()]
        final = await client.wait(str(run.job_id), interval=0.01)
        lines = [line async for line in client.logs(str(run.job_id))]
        return tested, logs, deleted, run.job_id, jobs, final, lines

    tested, logs, deleted, job_id, jobs, final, lines = asyncio.run(session())
    assert isinstance(tested, FunctionTest) and not tested.failed
    assert tested.output["reward"]["reward_score"] == 1.0
    assert isinstance(logs, list) and deleted["status"] == "deleted"
    assert jobs == [job_id] and isinstance(final, Job) and final.status == "SUCCEEDED"
    assert lines == platform.jobs[str(job_id)].logs
    with pytest.raises(ValueError, match="func_type is 'rollout' but the type is 'reward'"):
        asyncio.run(client.test_function("rw-ins-1", "reward", {"func_type": "rollout"}))
    assert not any(r["path"].startswith("/fc/") and r.get("json") == {} for r in platform.requests)


# ---- what an outside review found ------------------------------------------------------

KEY = "sk-review0123456789abcdef"


def _echoing(statuses: list[int]) -> Any:
    """A platform that puts the bearer's key in an error's code and request id (and its
    message): ``statuses`` in turn (an error each), then the job SUCCEEDED."""

    async def handle(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        status = statuses.pop(0) if statuses else 200
        if status == 200:
            body = {"request_id": "r", "output": {"job_id": "ft-1", "status": "SUCCEEDED"}}
        else:
            body = {"request_id": f"rid-{KEY}", "code": f"Bad{KEY}", "message": f"no {KEY}"}
        await send(writer, http(status, json.dumps(body).encode()))

    return handle


def test_no_field_of_an_error_nor_a_retry_line_holds_the_key():
    with RawServer(_echoing([400])) as server:
        client = PlatformClient(KEY, base_url=server.base_url)
        with pytest.raises(PlatformError) as caught:
            client.get("ft-1")
        error = caught.value
        for text in (str(error), repr(error), error.code, error.request_id, error.message):
            assert KEY not in str(text)
        assert error.status == 400 and "***" in error.code  # the code, its key blanked

        server.handle = _echoing([500, 500])
        retries: list[str] = []
        final = client.wait("ft-1", on_retry=retries.append, interval=0.1, timeout=60)
        events = list(client.watch("ft-1", interval=0.1, timeout=60))
    assert final.status == "SUCCEEDED" and len(retries) == 2
    assert all(KEY not in line and "***" in line for line in retries)
    assert [e.kind for e in events] == ["status"]  # the echoing errors were used up above
    assert not any(KEY in e.text for e in events)


def test_a_cancelled_wait_or_watch_stops_polling():
    asked: list[str] = []

    async def running(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(target)
        body = {"request_id": "r", "output": {"job_id": "ft-1", "status": "RUNNING"}}
        await send(writer, http(200, json.dumps(body).encode()))

    from runtime.platform import jobs
    from runtime.platform.http import Platform

    with RawServer(running) as server:
        # the mechanism: once stop is set, the polling ends at its next pause, unasked
        stop = threading.Event()
        with Platform(server.base_url, KEY) as session:
            stream = jobs.events(session, "ft-1", interval=60, timeout=None, logs=False, stop=stop)
            assert next(stream) == ("status", "RUNNING")
            stop.set()
            with pytest.raises(StopIteration):
                next(stream)
        assert len(asked) == 1

        client = AsyncPlatformClient(KEY, base_url=server.base_url)

        async def follow() -> None:
            async for _ in client.watch("ft-1", interval=60):
                pass

        for gives_up in (client.wait("ft-1", interval=60), follow()):
            with pytest.raises(asyncio.TimeoutError):  # not "generator already executing"
                asyncio.run(asyncio.wait_for(gives_up, 1.0))
        # the threads that polled end (each stopped at its pause, 60 s long): nothing left
        wait_for(
            lambda: not [t for t in threading.enumerate() if t.name.startswith("platform-client")],
            "the watch's thread to end",
        )


def test_pages_without_a_total_or_smaller_than_asked_are_all_read():
    jobs_ = [{"job_id": f"ft-{n}", "status": "SUCCEEDED"} for n in range(45)]
    asked: list[str] = []

    async def capped(method: str, target: str, writer: asyncio.StreamWriter) -> None:
        asked.append(target)
        query = dict(p.split("=") for p in target.partition("?")[2].split("&"))
        page, size = int(query["page_no"]), min(int(query["page_size"]), 20)  # at most 20
        found = jobs_[(page - 1) * size : page * size]
        body = {"output": {"jobs": found, "page_no": page, "page_size": size}}  # no total
        await send(writer, http(200, json.dumps(body).encode()))

    with RawServer(capped) as server:
        client = PlatformClient(KEY, base_url=server.base_url)
        assert [j.job_id for j in client.list_jobs(page_size=50)] == [j["job_id"] for j in jobs_]
        assert len(asked) == 3
        for bad in (0, -1):
            with pytest.raises(ValueError, match="page_size must be a whole number"):
                next(iter(client.list_jobs(page_size=bad)))
            with pytest.raises(ValueError, match="page_size must be a whole number"):
                next(iter(client.logs("ft-1", page_size=bad)))
        with pytest.raises(ValueError, match="interval must be a number of seconds above 0"):
            client.wait("ft-1", interval=-1)
    assert len(asked) == 3  # a bad setting sends nothing


def test_one_class_path_as_a_string_is_one_class(platform, workspace):
    one = "functions.reward.reward:DemoRewardProcessor"
    ids = _client(platform).register(workspace, reward=one)
    assert len(ids.reward_entity_ids) == 1  # not one per letter
