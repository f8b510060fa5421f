"""Training jobs: the submit body built from a job file, and the job endpoints.

Each component's settings travel with that component: its own id, name, weight, timeout,
metric weights and runtime (the SDK pairs them by position in separate lists, so they
shift when some components lack one). Group rewards go in ``rewards`` under
``reward_id`` as the platform reads them, marked ``"type": "group_reward"`` so that the
platform can tell them from rewards.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

from runtime.platform import answers
from runtime.platform.config import JobFile
from runtime.platform.functions import Component, ComponentError, resolve
from runtime.platform.http import Platform, PlatformError, RequestNotSent

__all__ = [
    "TERMINAL",
    "FollowError",
    "WaitTimeout",
    "components_of",
    "events",
    "follow",
    "job_logs",
    "submit",
    "submit_body",
]

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELED", "UNKNOWN")


def components_of(job: JobFile) -> list[Component]:
    """The job file's functions, resolved against the file's directory."""
    components = []
    for index, spec in enumerate(job.config.functions):
        label = f"functions[{index}]" + (f" ({spec.name})" if spec.name else "")
        zipdir = (job.base_dir / spec.fcmodel.zipdir).resolve()
        if spec.entity_id:
            layer = spec.runtime.layer_code if spec.runtime else None
            component = Component(
                spec.type, label, zipdir, spec=spec, entity_id=spec.entity_id, layer_code=layer
            )
        else:
            key = "classpath" if spec.fcmodel.classpath else "classname"
            where = job.where("functions", index, "fcmodel", key)
            try:
                component = resolve(
                    spec.type,
                    spec.fcmodel.classpath,
                    zipdir,
                    label=label,
                    filepath=spec.fcmodel.filepath,
                    classname=spec.fcmodel.classname,
                )
            except ComponentError as exc:
                raise ComponentError(f"{where}: {exc}") from None
            component.where = where
            component.spec = spec
            component.requirements_path = spec.fcmodel.requirements_path
            component.extra_files = tuple(
                (job.base_dir / extra).resolve() for extra in spec.fcmodel.extra_files
            )
            component.layer_code = spec.runtime.layer_code if spec.runtime else None
        components.append(component)
    return components


def _item(component: Component) -> dict[str, Any]:
    spec = component.spec
    assert spec is not None and component.entity_id
    key = "rollout_id" if component.kind == "rollout" else "reward_id"
    item: dict[str, Any] = {
        key: component.entity_id,
        "name": spec.name or f"{component.kind.replace('_', '-')}-{uuid.uuid4().hex[:8]}",
    }
    if component.kind == "group_reward":
        item["type"] = "group_reward"
    if spec.weight is not None:
        item["weight"] = spec.weight
    if spec.timeout is not None:
        item["timeout"] = spec.timeout
    if component.kind != "rollout":
        # the YAML's weights win over the class's registry
        weights = spec.reward_metric_weight or component.weights
        if weights:
            item["reward_metric_weight"] = weights
    runtime = component.runtime_body()
    env = runtime.pop("env", None)
    item.update(runtime)
    if env:
        item["env"] = {
            k: ("true" if v else "false") if isinstance(v, bool) else v for k, v in env.items()
        }
    return item


def submit_body(
    job: JobFile,
    components: list[Component],
    file_ids: dict[int, str],
    *,
    job_name: str | None = None,
) -> dict[str, Any]:
    """``POST /fine-tunes`` body; ``file_ids`` maps dataset index to its uploaded file id."""
    config = job.config
    datasets: dict[str, list[dict[str, Any]]] = {"training": [], "validation": []}
    for index, dataset in enumerate(config.datasets):
        if dataset.type not in datasets:
            continue  # "testing" datasets are never submitted
        entry = _pruned(dataset.model_dump(mode="json", exclude_none=True))
        if index in file_ids:
            entry["file_id"] = file_ids[index]
        datasets[dataset.type].append(entry)
    rollouts = [_item(c) for c in components if c.kind == "rollout"]
    rewards = [_item(c) for c in components if c.kind == "reward"]
    rewards += [_item(c) for c in components if c.kind == "group_reward"]
    hyper = config.training.hyper_parameters
    body: dict[str, Any] = {
        "model": config.model.name,
        "training_datasets": datasets["training"],
        "validation_datasets": datasets["validation"],
        "rollout": rollouts[0] if rollouts else None,
        "rewards": rewards,
        "hyper_parameters": _pruned(hyper.model_dump(exclude_none=True)) if hyper else None,
        "resource_config": _pruned(config.training.resources),
        "training_type": "pg_opd" if config.teacher_model else config.training.type,
        "teacher_model": config.teacher_model,
        "job_name": job_name or f"{config.name}-{uuid.uuid4().hex[:8]}",
    }
    return {k: v for k, v in body.items() if v not in (None, "", [], {})}


def _pruned(value: Any) -> Any:
    """``value`` without nulls and empty objects at any depth (``mount_storage: {}`` is
    not sent)."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in kept.items() if v != {}}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def submit(platform: Platform, body: dict[str, Any]) -> dict[str, Any]:
    check = f"python -m runtime job list for a job named {body.get('job_name')}"
    return platform.call(
        "submitting the job",
        "POST",
        platform.url("jobs"),
        answer=answers.Job,
        json=body,
        creates=check,
    ).sent()


def get(platform: Platform, job_id: str) -> dict[str, Any]:
    url = platform.url("jobs", job_id)
    return platform.call(f"getting job {job_id}", "GET", url, answer=answers.Job).sent()


def list_jobs(platform: Platform, page: int, size: int) -> dict[str, Any]:
    out = platform.call(
        "listing jobs",
        "GET",
        platform.url("jobs"),
        answer=answers.JobPage,
        params={"page_no": page, "page_size": size},
    )
    return {
        "page_no": page if out.page_no is None else out.page_no,
        "page_size": size if out.page_size is None else out.page_size,
        "total": len(out.jobs) if out.total is None else out.total,
        "jobs": [job.sent() for job in out.jobs],
    }


def cancel(platform: Platform, job_id: str) -> dict[str, Any]:
    url = platform.url("jobs", job_id, "cancel")
    out = platform.call(f"canceling job {job_id}", "POST", url, answer=answers.JobDone)
    return {"job_id": job_id, **out.sent()}


def delete(platform: Platform, job_id: str) -> dict[str, Any]:
    url = platform.url("jobs", job_id)
    out = platform.call(f"deleting job {job_id}", "DELETE", url, answer=answers.JobDone)
    return {"job_id": job_id, **out.sent()}


def job_logs(platform: Platform, job_id: str, offset: int, lines: int) -> list[str]:
    return platform.call(
        f"reading the logs of job {job_id}",
        "GET",
        platform.url("jobs", job_id, "logs"),
        answer=answers.JobLogs,
        params={"offset": offset, "line": lines},
    ).logs


class WaitTimeout(TimeoutError):
    """The job did not reach a final state in the time given."""


class FollowError(PlatformError):
    """Following a job failed (the job's own state is unknown), after retries."""


_GIVE_UP = 600.0  # without a deadline, how long a run of failed queries is retried


def _transient(exc: PlatformError) -> bool:
    """A failed query worth asking again: no answer, a 5xx (not a refusal or a 404)."""
    if isinstance(exc, RequestNotSent):
        return False
    return exc.status is None or exc.status >= 500


def follow(
    platform: Platform,
    job_id: str,
    *,
    on_status: Callable[[str], None],
    on_line: Callable[[str], None],
    interval: float,
    timeout: float | None,
    offset: int = 1,
    page: int = 1000,
    on_retry: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Poll a job to a final state, reporting status changes and new log lines (``events``
    with callbacks); the job as last seen."""
    stream = events(platform, job_id, interval=interval, timeout=timeout, offset=offset, page=page)
    while True:
        try:
            kind, text = next(stream)
        except StopIteration as done:
            job: dict[str, Any] = done.value
            return job
        if kind == "status":
            on_status(text)
        elif kind == "line":
            on_line(text)
        elif on_retry is not None:
            on_retry(text)


def events(
    platform: Platform,
    job_id: str,
    *,
    interval: float,
    timeout: float | None,
    offset: int = 1,
    page: int = 1000,
    logs: bool = True,
    stop: threading.Event | None = None,
) -> Generator[tuple[str, str], None, dict[str, Any]]:
    """Poll a job to a final state, yielding ``("status", STATUS)`` on each change, ``("line",
    LINE)`` for each new log line (unless not ``logs``) and ``("retry", WHY)`` before a
    failed query is asked again; returns the job as last seen. The queries are GETs, safe
    to repeat: a transient failure is retried until the deadline, or for 600 s in a row
    without one. ``timeout`` is a total deadline: the requests in flight and their retries
    end with it. ``stop``, once set, ends the polling at its next pause (returning the job
    as last seen): a caller that gave up (a cancelled coroutine) leaves nothing polling."""
    deadline = None if timeout is None else time.monotonic() + timeout
    job: dict[str, Any] = {}
    last = None
    failing_since: float | None = None
    failed: PlatformError | None = None  # the failure of the poll before, while failing
    with platform.time_limit(timeout):
        while True:
            try:
                job = get(platform, job_id)
                status = str(job["status"])
                if status != last:
                    yield "status", status
                    last = status
                lines = job_logs(platform, job_id, offset, page) if logs else []
            except PlatformError as exc:
                now = time.monotonic()
                if (
                    last is not None
                    and failing_since is None
                    and _transient(exc)
                    and _out_of_time(now, deadline)
                ):
                    # the deadline cut a poll short: the job was last seen running, not lost
                    raise WaitTimeout(f"job {job_id} is still {last} after {timeout:g} s") from None
                if failing_since is not None and _out_of_time(now, deadline) and failed:
                    exc = failed  # the deadline cut this poll short: the last answer tells more
                failing_since, failed = failing_since or now, exc
                limit = deadline if deadline is not None else failing_since + _GIVE_UP
                if _transient(exc) and now + interval <= limit:
                    yield "retry", f"{exc}; retrying in {interval:g} s"
                    if _pause(interval, limit, stop):
                        if stop is not None and stop.is_set():
                            return job
                        continue
                raise FollowError(
                    exc.what,
                    exc.message,
                    status=exc.status,
                    code=exc.code,
                    request_id=exc.request_id,
                ) from None
            failing_since, failed = None, None
            while lines:  # every new log line, page after page
                for line in lines:
                    yield "line", line
                offset += len(lines)
                if len(lines) < page:
                    break
                lines = job_logs(platform, job_id, offset, page)
            if status in TERMINAL:
                return job
            if not _pause(interval, deadline, stop):
                raise WaitTimeout(f"job {job_id} is still {status} after {timeout:g} s")
            if stop is not None and stop.is_set():
                return job


def _out_of_time(now: float, deadline: float | None) -> bool:
    return deadline is not None and now >= deadline - 0.001


def _pause(interval: float, limit: float | None, stop: threading.Event | None = None) -> bool:
    """Sleep ``interval`` (less once ``stop`` is set) unless that ends past ``limit``;
    whether time is left after it (a loaded machine may sleep longer than asked)."""
    if limit is not None and time.monotonic() + interval > limit:
        return False
    if stop is None:
        time.sleep(interval)
    else:
        stop.wait(interval)
    return limit is None or time.monotonic() < limit
