"""The platform's Python API: what ``python -m runtime register|upload-data|job ...`` do, as
methods (the commands are built on it, docs/platform.md#the-python-api).

``PlatformClient`` holds its settings (key, base URL, workspace, timeouts) and nothing
else: every call opens its own session with exactly that key, so two clients with two
keys in one process never mix, and a client can be used from several threads.
``AsyncPlatformClient`` has the same methods as coroutines (each runs its blocking twin
in a worker thread; the event loop is never blocked).

Errors: ``PlatformError`` (``.status``, ``.code``, ``.request_id``) for what the platform
refused or could not be asked, with its subclasses ``UnclearOutcome`` (a creating request
whose answer was lost: check before repeating), ``RequestNotSent`` and ``FollowError``;
local problems are ``ConfigError`` (a job file), ``ComponentError`` (a class),
``DatasetError`` (a JSONL file), ``WorkspaceFileError``; ``WaitTimeout`` when a wait runs
out. No message carries the client's key. A creating call that fails part-way leaves
what it created on the error's ``partial`` attribute (the same result type, filled so
far), so that nothing is orphaned without its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import anyio
import httpx
from pydantic import BaseModel, ConfigDict

from processors_base.redaction import redact
from runtime.platform import jobs as _jobs
from runtime.platform.answers import Job
from runtime.platform.config import (
    ConfigError,
    JobConfig,
    JobFile,
    JobFileError,
    Runtime,
    load_job_file,
)
from runtime.platform.datasets import DatasetError, check_jsonl, upload
from runtime.platform.functions import (
    Component,
    ComponentError,
    delete_instance,
    instance_logs,
    invoke,
    register,
    resolve,
)
from runtime.platform.http import (
    DEFAULT_BASE_URL,
    FileStamp,
    Platform,
    PlatformError,
    RequestNotSent,
    UnclearOutcome,
)
from runtime.platform.jobs import TERMINAL, FollowError, WaitTimeout
from runtime.platform.packaging import WorkspaceFileError
from runtime.platform.progress import Reporter, size_text

__all__ = [
    "TERMINAL",
    "AsyncPlatformClient",
    "ComponentError",
    "ConfigError",
    "DatasetError",
    "FollowError",
    "FunctionTest",
    "Job",
    "JobAction",
    "JobEvent",
    "JobPage",
    "JobRun",
    "PlatformClient",
    "PlatformError",
    "RegisteredFunctions",
    "RequestNotSent",
    "UnclearOutcome",
    "UploadedFiles",
    "WaitTimeout",
    "WorkspaceFileError",
    "job_file",
]

Kind = Literal["rollout", "reward", "group_reward"]
KINDS: tuple[Kind, ...] = ("rollout", "reward", "group_reward")
P = ParamSpec("P")
R = TypeVar("R")


# ---- results --------------------------------------------------------------------------


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegisteredFunctions(_Result):
    """The ids a registration made (or reused), per type, in the order given; instance ids
    only when not lazy."""

    rollout_entity_ids: list[str] = []
    reward_entity_ids: list[str] = []
    group_reward_entity_ids: list[str] = []
    rollout_instance_ids: list[str] = []
    reward_instance_ids: list[str] = []
    group_reward_instance_ids: list[str] = []


class UploadedFiles(_Result):
    training_file_ids: list[str] = []
    validation_file_ids: list[str] = []


class JobRun(_Result):
    """What ``run`` did: the job (None when it failed before the submit), and the ids it
    created, named as the job file names them."""

    job_id: str | None = None
    job_name: str | None = None
    status: str | None = None
    entity_ids: dict[str, str] = {}
    file_ids: dict[str, str] = {}
    job: Job | None = None  # the platform's answer to the submit


class JobPage(_Result):
    page_no: int
    page_size: int
    total: int
    jobs: list[Job]


class JobAction(_Result):
    """The answer to a cancel or a delete."""

    model_config = ConfigDict(extra="allow")
    job_id: str
    status: str | None = None


class JobEvent(_Result):
    """One thing seen while following a job: a new ``status``, a log ``line``, or a
    ``retry`` of a failed query (``text`` says why)."""

    kind: Literal["status", "line", "retry"]
    text: str


class FunctionTest(_Result):
    """An instance's answer to one input: its HTTP status and JSON output."""

    http_status: int
    output: Any

    @property
    def failed(self) -> bool:
        status = self.output.get("status") if isinstance(self.output, dict) else None
        return self.http_status >= 400 or status == "failed" or not isinstance(self.output, dict)


# ---- helpers --------------------------------------------------------------------------


class _Notes(Reporter):
    """Progress lines to a callback (or nowhere): the API prints nothing of its own."""

    def __init__(self, notify: Callable[[str], None] | None) -> None:
        super().__init__(sys.stderr, tty=False)
        self._notify = notify

    def note(self, text: str) -> None:
        if self._notify is not None:
            self._notify(text)


def _at_least_one(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")


def _follow_settings(interval: float, timeout: float | None) -> None:
    if not isinstance(interval, (int, float)) or not interval > 0:
        raise ValueError(f"interval must be a number of seconds above 0, not {interval!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"timeout must be a number of seconds above 0 or None, not {timeout!r}")


def _attach(exc: BaseException, partial: BaseModel) -> None:
    """What was created before ``exc``, on it (``exc.partial``)."""
    with contextlib.suppress(AttributeError):  # an exception type with __slots__
        exc.partial = partial  # type: ignore[attr-defined]


def job_file(config: str | Path | JobConfig | JobFile, *, base_dir: str | Path = ".") -> JobFile:
    """A job file from a path (checked, every problem naming its line), a ``JobConfig``
    (relative paths resolved against ``base_dir``) or a ``JobFile`` as it is."""
    if isinstance(config, JobFile):
        return config
    if isinstance(config, JobConfig):
        return JobFile(Path(base_dir).resolve() / "(arguments)", config)
    if not Path(config).is_file():
        raise JobFileError(f"{config}: no such job file (nothing was sent)")
    return load_job_file(config)


def _header_safe(key: str) -> bool:
    return all(33 <= ord(c) <= 126 for c in key)


# ---- the client -----------------------------------------------------------------------


class PlatformClient:
    """The platform's API, configured as the commands are: the key (default
    ``DASHSCOPE_API_KEY``), the base URL (``DASHSCOPE_HTTP_BASE_URL``, else the public
    one), the workspace (``DASHSCOPE_WORKSPACE_ID``), the timeout of one request
    (``HTTP_REQUEST_TIMEOUT``, else 600 s) and how long busy or unreachable calls are
    retried (``retry_deadline``). ``notify`` receives progress lines (retries, steps);
    ``progress`` (a ``runtime.platform.progress.Reporter``) shows them as the commands do."""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        workspace: str | None = None,
        request_timeout: float | None = None,
        retry_deadline: float = 120.0,
        notify: Callable[[str], None] | None = None,
        progress: Reporter | None = None,
        user_agent: str | None = None,
    ) -> None:
        key = (api_key if api_key is not None else os.environ.get("DASHSCOPE_API_KEY", "")).strip()
        if not key:
            raise PlatformError(
                "configuration", "no API key: pass api_key or set DASHSCOPE_API_KEY"
            )
        if not _header_safe(key):
            raise PlatformError(
                "configuration",
                "the API key has a character that cannot go in an HTTP header (a space, a "
                "line break or a non-ASCII character)",
            )
        base = base_url or os.environ.get("DASHSCOPE_HTTP_BASE_URL") or DEFAULT_BASE_URL
        try:
            parsed: httpx.URL | None = httpx.URL(base)
        except (httpx.InvalidURL, TypeError, ValueError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise PlatformError("configuration", f"{base!r} is not an http(s) URL with a host")
        if request_timeout is None:
            text = os.environ.get("HTTP_REQUEST_TIMEOUT", "600")
            try:
                request_timeout = float(text)
            except ValueError:
                request_timeout = float("nan")
        if not 0 < request_timeout < float("inf"):
            raise PlatformError(
                "configuration", "the request timeout must be a positive number of seconds"
            )
        self._key = key
        self.base_url = base
        self.workspace = workspace or os.environ.get("DASHSCOPE_WORKSPACE_ID") or None
        self.request_timeout = float(request_timeout)
        self.retry_deadline = retry_deadline
        self._progress = progress
        self._notify = notify or (progress.note if progress is not None else None)
        self._user_agent = user_agent or "agentic-rl-runtime"

    def __repr__(self) -> str:  # never the key
        return f"PlatformClient(base_url={self.base_url!r}, workspace={self.workspace!r})"

    def with_options(self, **changes: Any) -> PlatformClient:
        """A client like this one with some settings changed (``api_key=``, ``workspace=``...)."""
        settings: dict[str, Any] = {
            "api_key": self._key,
            "base_url": self.base_url,
            "workspace": self.workspace,
            "request_timeout": self.request_timeout,
            "retry_deadline": self.retry_deadline,
            "notify": self._notify,
            "progress": self._progress,
            "user_agent": self._user_agent,
        }
        settings.update({k: v for k, v in changes.items() if v is not None})
        return PlatformClient(**settings)

    def _reporter(self) -> Reporter:
        return self._progress or _Notes(self._notify)

    def _session(self) -> Platform:
        return Platform(
            self.base_url,
            self._key,
            deadline=self.retry_deadline,
            timeout=self.request_timeout,
            notify=self._notify,
            user_agent=self._user_agent,
            workspace=self.workspace,
        )

    def _scrub(self, text: str) -> str:
        """``text`` with this client's key blanked (the platform may echo it anywhere)."""
        return redact(text, (self._key,))

    def _scrubbed(self, exc: PlatformError) -> PlatformError:
        """``exc`` with this client's key blanked from every field the platform filled."""
        exc.message = self._scrub(exc.message)
        exc.what = self._scrub(exc.what)
        if isinstance(exc.code, str):
            exc.code = self._scrub(exc.code)
        if exc.request_id is not None:
            exc.request_id = self._scrub(str(exc.request_id))
        exc.args = (exc.message,)
        return exc

    def _call(self, fn: Callable[[Platform], R]) -> R:
        def call() -> R:
            with self._session() as platform:
                return fn(platform)

        try:
            with _runner() as run:
                return run(call)
        except PlatformError as exc:
            raise self._scrubbed(exc) from exc.__cause__

    # ---- functions ---------------------------------------------------------------------

    def register(
        self,
        workspace: str | Path = ".",
        *,
        rollout: str | Sequence[str] = (),
        reward: str | Sequence[str] = (),
        group_reward: str | Sequence[str] = (),
        lazy: bool = True,
        server: str = "runtime",
        poll_interval: float = 5.0,
        timeout: float = 900.0,
    ) -> RegisteredFunctions:
        """Check, package, upload and register the classes (``pkg.mod:Cls``, ``pkg.mod.Cls``
        or ``path/file.py:Cls``; one, or a list) of ``workspace``; unless ``lazy``, start an
        instance of each and wait (up to ``timeout`` s) until it is active."""
        root = Path(workspace)
        components = [
            resolve(kind, classpath, root)
            for kind, given in zip(KINDS, (rollout, reward, group_reward), strict=True)
            for classpath in ([given] if isinstance(given, str) else given)  # not its letters
        ]
        if not components:
            raise ComponentError("nothing to register: give a rollout, reward or group_reward")
        return self._register(components, lazy, server, poll_interval, timeout)

    def register_functions(
        self,
        job: str | Path | JobConfig | JobFile,
        *,
        lazy: bool = True,
        server: str = "runtime",
        poll_interval: float = 5.0,
        timeout: float = 900.0,
    ) -> RegisteredFunctions:
        """Register the functions of a job file that have no ``entity_id``; each one's
        entity id (and dependency layer) is written back into the job's config, so that
        ``submit`` sends them."""
        found = job_file(job)
        components = _jobs.components_of(found)
        try:
            return self._register(components, lazy, server, poll_interval, timeout)
        finally:
            _write_back(components)

    def _register(
        self,
        components: list[Component],
        lazy: bool,
        server: str,
        poll_interval: float,
        timeout: float,
    ) -> RegisteredFunctions:
        def created() -> RegisteredFunctions:
            fields: dict[str, list[str]] = {}
            for suffix, attr in (("entity_ids", "entity_id"), ("instance_ids", "instance_id")):
                for kind in KINDS:
                    fields[f"{kind}_{suffix}"] = [
                        getattr(c, attr) for c in components if c.kind == kind and getattr(c, attr)
                    ]
            return RegisteredFunctions(**fields)

        reporter = self._reporter()
        try:
            self._call(
                lambda platform: register(
                    platform,
                    components,
                    reporter,
                    lazy=lazy,
                    server=server,
                    poll_interval=poll_interval,
                    wait_timeout=timeout,
                )
            )
        except BaseException as exc:
            _attach(exc, created())
            raise
        return created()

    def test_function(
        self, instance_id: str, func_type: Kind | str, payload: dict[str, Any]
    ) -> FunctionTest:
        """Send one input to a started instance (validated locally first: a ValueError
        names the bad fields, and nothing is sent); its answer as it came."""
        from pydantic import ValidationError

        from processors_base import models
        from runtime.platform.answers import problems

        kind = str(getattr(func_type, "value", func_type)).lower()
        inputs: dict[str, type[BaseModel]] = {
            "rollout": models.RolloutInput,
            "reward": models.RewardInput,
            "group_reward": models.GroupRewardInput,
        }
        if kind not in inputs:
            raise ValueError(
                f"{func_type!r} is not a function type (rollout, reward, group_reward)"
            )
        body = dict(payload)
        given = body.setdefault("func_type", kind)
        if given != kind:
            raise ValueError(
                f"the input's func_type is {given!r} but the type is {kind!r}: the instance "
                "would be sent an input of the wrong type (nothing was sent)"
            )
        try:
            inputs[kind].model_validate(body)
        except ValidationError as exc:
            raise ValueError(f"the input is not a valid {kind} input: {problems(exc)}") from None
        status, output = self._call(lambda platform: invoke(platform, instance_id, body))
        return FunctionTest(http_status=status, output=output)

    def instance_logs(self, instance_id: str) -> list[str]:
        """Every log message of a function instance."""
        return self._call(lambda platform: instance_logs(platform, instance_id))

    def delete_instance(self, instance_id: str) -> dict[str, Any]:
        return self._call(lambda platform: delete_instance(platform, instance_id))

    # ---- datasets ----------------------------------------------------------------------

    def upload_datasets(
        self,
        training: Sequence[str | Path] | str | Path = (),
        validation: Sequence[str | Path] | str | Path = (),
    ) -> UploadedFiles:
        """Check every JSONL file (nothing is uploaded when one is bad), then upload them;
        their file ids. A file given twice as the same kind is uploaded once."""
        files: list[tuple[str, Path]] = []
        for kind, given in (("training", training), ("validation", validation)):
            for name in [given] if isinstance(given, (str, Path)) else given:
                path = Path(name)
                if not path.is_file():
                    raise DatasetError(f"{name}: no such file (nothing was sent)")
                if any(k == kind and p.samefile(path) for k, p in files):
                    continue
                files.append((kind, path))
        checked = [check_jsonl(path) for _, path in files]  # each sent exactly as checked
        result = UploadedFiles()
        reporter = self._reporter()

        def send(platform: Platform) -> None:
            for (kind, path), stamp in zip(files, checked, strict=True):
                size = stamp[0]
                with reporter.transfer(f"uploading {path} ({size_text(size)})", size) as sent:
                    ids = getattr(result, f"{kind}_file_ids")
                    ids.append(upload(platform, path, progress=sent, checked=stamp))

        try:
            self._call(send)
        except BaseException as exc:
            _attach(exc, result)
            raise
        return result

    # ---- jobs --------------------------------------------------------------------------

    def submit(
        self,
        job: str | Path | JobConfig | JobFile,
        *,
        job_name: str | None = None,
        model: str | None = None,
        teacher_model: str | None = None,
        hyper_parameters: dict[str, Any] | None = None,
        resources: dict[str, Any] | None = None,
    ) -> Job:
        """Submit a job whose functions are registered (each has an ``entity_id``) and
        whose datasets are uploaded (a ``file_id``, a ``download_url`` or an OSS mount);
        the keywords override the job file's settings; ``job_name`` is used exactly."""
        found = _overridden(job_file(job), model, teacher_model, hyper_parameters, resources)
        missing = [i for i, f in enumerate(found.config.functions) if not f.entity_id]
        if missing:
            raise found.error(
                "not registered (no entity_id): register it first, or use run", "functions",
                missing[0],
            )  # fmt: skip
        unsent = [i for i, d in enumerate(found.config.datasets) if d.needs_upload]
        if unsent:
            raise found.error(
                "not uploaded (no file_id): upload it first, or use run", "datasets", unsent[0]
            )
        body = _jobs.submit_body(found, _jobs.components_of(found), {}, job_name=job_name)
        return Job.model_validate(self._call(lambda platform: _jobs.submit(platform, body)))

    def run(
        self,
        job: str | Path | JobConfig | JobFile,
        *,
        job_name: str | None = None,
        model: str | None = None,
        teacher_model: str | None = None,
        hyper_parameters: dict[str, Any] | None = None,
        resources: dict[str, Any] | None = None,
        server: str = "runtime",
    ) -> JobRun:
        """Register the job's functions (except those with an ``entity_id``), upload its
        datasets (except those with a ``file_id``), submit the job. Everything local is
        checked first: a bad dataset or class fails before anything is sent. The
        keywords override the job file's settings; ``job_name`` is used exactly (default:
        the file's ``name`` and 8 random hex digits)."""
        found = _overridden(job_file(job), model, teacher_model, hyper_parameters, resources)
        if job_name is not None and not 1 <= len(job_name) <= 256:
            raise ConfigError(f"the job name must be 1 to 256 characters, not {len(job_name)}")
        reporter = self._reporter()
        datasets: dict[int, Path] = {}
        stamps: dict[int, FileStamp] = {}  # each file as checked: sent exactly so
        for index, dataset in enumerate(found.config.datasets):
            if dataset.needs_upload and dataset.type == "testing":
                reporter.note(
                    f"datasets[{index}] ({dataset.file_name}): a testing dataset is not "
                    "sent with the job, so it is not uploaded"
                )
            elif dataset.needs_upload:
                assert dataset.file_name is not None
                path = (found.base_dir / dataset.file_name).resolve()
                if not path.is_file():
                    where = found.where("datasets", index, "file_name")
                    raise JobFileError(f"{where}: {path}: no such file (nothing was sent)")
                try:
                    stamps[index] = check_jsonl(path)
                except Exception as exc:
                    raise found.error(str(exc), "datasets", index, "file_name") from None
                datasets[index] = path
        components = _jobs.components_of(found)
        file_ids: dict[int, str] = {}
        result = JobRun()

        def created() -> JobRun:
            result.entity_ids = {c.label: c.entity_id for c in components if c.entity_id}
            result.file_ids = {
                str(found.config.datasets[i].file_name): file_id for i, file_id in file_ids.items()
            }
            return result

        def steps(platform: Platform) -> dict[str, Any]:
            register(platform, components, reporter, lazy=True, server=server)
            for index, path in datasets.items():
                size = stamps[index][0]
                with reporter.transfer(f"uploading {path.name} ({size_text(size)})", size) as sent:
                    file_ids[index] = upload(platform, path, progress=sent, checked=stamps[index])
            body = _jobs.submit_body(found, components, file_ids, job_name=job_name)
            submitted = _jobs.submit(platform, body)
            submitted.setdefault("job_name", body["job_name"])
            return submitted

        try:
            submitted = self._call(steps)
        except BaseException as exc:
            _attach(exc, created())
            raise
        finally:
            _write_back(components)
            for index, file_id in file_ids.items():
                found.config.datasets[index].file_id = file_id
        result.job_id = submitted["job_id"]
        result.status = submitted.get("status")
        result.job_name = submitted.get("job_name")
        result.job = Job.model_validate(submitted)
        created()
        reporter.note(f"submitted job {result.job_id} ({result.status})")
        return result

    def get(self, job_id: str) -> Job:
        return Job.model_validate(self._call(lambda platform: _jobs.get(platform, job_id)))

    def list_page(self, page: int = 1, size: int = 10) -> JobPage:
        """One page of jobs (from 1)."""
        return JobPage.model_validate(
            self._call(lambda platform: _jobs.list_jobs(platform, page, size))
        )

    def list_jobs(self, *, page_size: int = 50) -> Iterator[Job]:
        """Every job, page after page (a page is asked for when the previous one is used
        up; the iteration ends at a short or empty page: a total is not always sent)."""
        _at_least_one("page_size", page_size)
        page, previous = 1, None
        while True:
            answer = self.list_page(page, page_size)
            ids = [job.job_id for job in answer.jobs]
            if ids == previous:  # the platform ignored page_no: no page but the first
                return
            yield from answer.jobs
            if len(answer.jobs) < min(page_size, answer.page_size or page_size):
                return  # (a platform may serve fewer a page than asked, and say so)
            page, previous = page + 1, ids

    def cancel(self, job_id: str) -> JobAction:
        return JobAction.model_validate(self._call(lambda platform: _jobs.cancel(platform, job_id)))

    def delete(self, job_id: str) -> JobAction:
        return JobAction.model_validate(self._call(lambda platform: _jobs.delete(platform, job_id)))

    def logs_page(self, job_id: str, offset: int = 1, lines: int = 1000) -> list[str]:
        """Up to ``lines`` log lines from line ``offset`` (from 1)."""
        return self._call(lambda platform: _jobs.job_logs(platform, job_id, offset, lines))

    def logs(self, job_id: str, *, offset: int = 1, page_size: int = 1000) -> Iterator[str]:
        """Every log line of a job from ``offset``, page after page, as far as there are."""
        _at_least_one("page_size", page_size)
        while True:
            lines = self.logs_page(job_id, offset, page_size)
            yield from lines
            if len(lines) < page_size:
                return
            offset += len(lines)

    def watch(
        self,
        job_id: str,
        *,
        interval: float = 10.0,
        timeout: float | None = None,
        logs: bool = False,
        offset: int = 1,
    ) -> Iterator[JobEvent]:
        """Follow a job to a final state: an event per status change (and per new log
        line, with ``logs``, from line ``offset``; and per retried query). Ends after the
        final status; ``WaitTimeout`` when ``timeout`` s pass first; ``FollowError`` when
        the job cannot be asked about (after retries)."""
        _follow_settings(interval, timeout)
        return self._watch(job_id, interval, timeout, logs, offset, None)

    def _watch(
        self,
        job_id: str,
        interval: float,
        timeout: float | None,
        logs: bool,
        offset: int,
        stop: threading.Event | None,
    ) -> Iterator[JobEvent]:
        with _runner() as run:
            platform: Platform = run(self._session)
            stream = _jobs.events(
                platform,
                job_id,
                interval=interval,
                timeout=timeout,
                offset=offset,
                logs=logs,
                stop=stop,
            )
            try:
                while (step := run(lambda: next(stream, None))) is not None:
                    yield JobEvent(kind=step[0], text=self._scrub(step[1]))
            except PlatformError as exc:
                raise self._scrubbed(exc) from None
            finally:
                run(stream.close)
                run(platform.close)

    def wait(
        self,
        job_id: str,
        *,
        on_status: Callable[[str], None] | None = None,
        on_line: Callable[[str], None] | None = None,
        on_retry: Callable[[str], None] | None = None,
        interval: float = 10.0,
        timeout: float | None = None,
        offset: int = 1,
    ) -> Job:
        """Follow a job to a final state, calling ``on_status`` on each change, ``on_line``
        for each new log line (the logs are read only when it is given) and ``on_retry``
        before a failed query is asked again; the job as last seen."""
        _follow_settings(interval, timeout)
        with _runner() as run:
            job: Job = run(
                lambda: self._wait(
                    job_id, on_status, on_line, on_retry, interval, timeout, offset, None
                )
            )
        return job

    def _wait(
        self,
        job_id: str,
        on_status: Callable[[str], None] | None,
        on_line: Callable[[str], None] | None,
        on_retry: Callable[[str], None] | None,
        interval: float,
        timeout: float | None,
        offset: int,
        stop: threading.Event | None,
    ) -> Job:
        with self._session() as platform:
            stream = _jobs.events(
                platform,
                job_id,
                interval=interval,
                timeout=timeout,
                offset=offset,
                logs=on_line is not None,
                stop=stop,
            )
            try:
                while True:
                    try:
                        kind, text = next(stream)
                    except StopIteration as done:
                        return Job.model_validate(done.value)
                    callback = {"status": on_status, "line": on_line, "retry": on_retry}[kind]
                    if callback is not None:
                        callback(self._scrub(text))
            except PlatformError as exc:
                raise self._scrubbed(exc) from None


@contextlib.contextmanager
def _runner() -> Iterator[Callable[[Callable[[], Any]], Any]]:
    """What runs the blocking calls of a session: this thread, or, when it runs an event
    loop (a notebook, a coroutine calling the blocking API), one worker thread for the
    session (its own event loop cannot run inside another)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        yield lambda fn: fn()
        return
    with ThreadPoolExecutor(1, thread_name_prefix="platform-client") as pool:
        yield lambda fn: pool.submit(fn).result()


def _overridden(
    job: JobFile,
    model: str | None,
    teacher_model: str | None,
    hyper_parameters: dict[str, Any] | None,
    resources: dict[str, Any] | None,
) -> JobFile:
    """The job with the keyword overrides applied (each replaces the whole setting), checked."""
    from runtime.platform.config import HyperParameters

    config = job.config
    if model:
        config.model.name = model
    if teacher_model:
        config.teacher_model = teacher_model
    if hyper_parameters:
        config.training.hyper_parameters = HyperParameters.model_validate(hyper_parameters)
    if resources:
        config.training.resources = dict(resources)
    job.check()
    return job


def _write_back(components: list[Component]) -> None:
    """Each registered component's entity id and layer into its spec (as the SDK keeps
    them), so that a later submit of the same config sends them."""
    for c in components:
        spec = c.spec
        if spec is None or not c.entity_id:
            continue
        spec.entity_id = c.entity_id
        if c.instance_id:
            spec.instance_id = c.instance_id
        if c.layer_code:
            spec.runtime = spec.runtime or Runtime()
            spec.runtime.layer_code = c.layer_code


# ---- async -----------------------------------------------------------------------------


def _twin(
    method: Callable[Concatenate[PlatformClient, P], R],
) -> Callable[Concatenate[AsyncPlatformClient, P], Coroutine[Any, Any, R]]:
    """The coroutine twin of a blocking method: the same parameters (typed), run in a
    worker thread."""

    @functools.wraps(method)
    async def twin(self: AsyncPlatformClient, *args: P.args, **kwargs: P.kwargs) -> R:
        call = functools.partial(method, self.sync, *args, **kwargs)
        return await anyio.to_thread.run_sync(call)

    return twin


class AsyncPlatformClient:
    """``PlatformClient``'s methods as coroutines (the iterators as async iterators), each
    run in a worker thread; the same settings (see ``PlatformClient``)."""

    def __init__(self, api_key: str | None = None, **settings: Any) -> None:
        self.sync = PlatformClient(api_key, **settings)

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    register = _twin(PlatformClient.register)
    register_functions = _twin(PlatformClient.register_functions)
    test_function = _twin(PlatformClient.test_function)
    instance_logs = _twin(PlatformClient.instance_logs)
    delete_instance = _twin(PlatformClient.delete_instance)
    upload_datasets = _twin(PlatformClient.upload_datasets)
    submit = _twin(PlatformClient.submit)
    run = _twin(PlatformClient.run)
    get = _twin(PlatformClient.get)
    list_page = _twin(PlatformClient.list_page)
    cancel = _twin(PlatformClient.cancel)
    delete = _twin(PlatformClient.delete)
    logs_page = _twin(PlatformClient.logs_page)

    async def wait(
        self,
        job_id: str,
        *,
        on_status: Callable[[str], None] | None = None,
        on_line: Callable[[str], None] | None = None,
        on_retry: Callable[[str], None] | None = None,
        interval: float = 10.0,
        timeout: float | None = None,
        offset: int = 1,
    ) -> Job:
        """``PlatformClient.wait``; cancelled, it stops polling (at its next pause)."""
        _follow_settings(interval, timeout)
        stop = threading.Event()
        follow = functools.partial(
            self.sync._wait, job_id, on_status, on_line, on_retry, interval, timeout, offset, stop
        )
        try:
            return await anyio.to_thread.run_sync(follow)
        finally:
            stop.set()

    async def list_jobs(self, *, page_size: int = 50) -> AsyncIterator[Job]:
        async for job in _iterate(self.sync.list_jobs(page_size=page_size)):
            yield job

    async def logs(
        self, job_id: str, *, offset: int = 1, page_size: int = 1000
    ) -> AsyncIterator[str]:
        async for line in _iterate(self.sync.logs(job_id, offset=offset, page_size=page_size)):
            yield line

    async def watch(
        self,
        job_id: str,
        *,
        interval: float = 10.0,
        timeout: float | None = None,
        logs: bool = False,
        offset: int = 1,
    ) -> AsyncIterator[JobEvent]:
        _follow_settings(interval, timeout)
        stop = threading.Event()
        events = self.sync._watch(job_id, interval, timeout, logs, offset, stop)
        async for event in _iterate(events, stop):
            yield event


_DONE = object()


async def _iterate(items: Iterator[R], stop: threading.Event | None = None) -> AsyncIterator[R]:
    """A blocking iterator's items, each fetched in the one worker thread of this iteration.
    Ended early (a break, a cancellation that may leave a fetch running), ``stop`` is set
    and the iterator is closed on that thread once the fetch is over (a generator cannot be
    closed while it runs); nothing waits for it here."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="platform-client")
    try:
        while True:
            fetched = pool.submit(next, items, _DONE)
            item = await anyio.to_thread.run_sync(fetched.result)  # any event loop
            if item is _DONE:
                return
            yield item  # type: ignore[misc]
    finally:
        if stop is not None:
            stop.set()
        close = getattr(items, "close", None)
        if close is not None:
            pool.submit(close)
        pool.shutdown(wait=False)
