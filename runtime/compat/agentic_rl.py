"""The DashScope SDK's Tuning API (``dashscope.finetune.agentic_rl``) on this project's
platform client (``runtime.platform.client``), for Tuning scripts run where the SDK is not
installed (``python -m runtime.compat script.py``; docs/sdk-compatibility.md).

``AgenticRL`` has the SDK's methods, signatures and return shapes: six id lists from
``register_functions``, two from ``upload_datasets``, ``FineTune``-like objects (attribute
and item access, ``status_code``, ``output.job_id``...) from the job calls; one the
platform refuses has its ``status_code``, ``code`` and ``message``, with ``output`` None.
None of the SDK client's bugs (docs/platform-api.md §12) come along: the key given is the
key sent on every call (B1); ``init(job_name=...)`` works (B3); each component's settings
stay with it (B5); ``upload_datasets(validation_files=...)`` alone works, and a single path
is one file (B6); nothing that creates is retried blind (B7); a single component is a
list of one (B21); ``submit_job`` refuses unregistered functions rather than drop them
(B17).

One piece of process-wide state, as in the SDK: the key given to ``AgenticRL(api_key=)``
is the default of the class methods (``AgenticRL.get``, ``AgenticRL.list``...) called
without ``api_key``. An instance's own calls (``rl.get(...)`` too) use its own key.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from processors_base import models
from processors_base.models import FunctionType
from runtime.compat.alias import tuning
from runtime.compat.alias.common import ERRORS as _ERRORS
from runtime.compat.alias.common import (
    DatasetsType,
    DataSourceType,
    TrainingType,
)
from runtime.compat.alias.unavailable import NotProvidedError
from runtime.platform.client import Job, PlatformClient, PlatformError
from runtime.platform.config import FunctionSpec, JobConfig, JobFile, load_job_file

__all__ = [
    "AgenticRL",
    "AgenticRLFunctionComponent",
    "DataSourceType",
    "Dataset",
    "DatasetsType",
    "FineTune",
    "FineTuneCancel",
    "FineTuneDelete",
    "FineTuneList",
    "FunctionComponentModel",
    "FunctionComponentRuntime",
    "FunctionType",
    "GroupRewardFunctionComponent",
    "GroupRewardInput",
    "RewardFunctionComponent",
    "RewardInput",
    "RolloutFunctionComponent",
    "RolloutInput",
    "TrainingDataset",
    "TrainingType",
    "ValidationDataset",
]

AgenticRLFunctionComponent = tuning.AgenticRLFunctionComponent
RolloutFunctionComponent = tuning.RolloutFunctionComponent
RewardFunctionComponent = tuning.RewardFunctionComponent
GroupRewardFunctionComponent = tuning.GroupRewardFunctionComponent
FunctionComponentModel = tuning.FunctionComponentModel
FunctionComponentRuntime = tuning.FunctionComponentRuntime
Dataset = tuning.Dataset
TrainingDataset = tuning.TrainingDataset
ValidationDataset = tuning.ValidationDataset
RolloutInput = models.RolloutInput
RewardInput = models.RewardInput
GroupRewardInput = models.GroupRewardInput

_SUBMIT = "submitting the job"  # what the client's submit errors name
_logger = logging.getLogger("dashscope.finetune.reinforcement")
_default_key: str | None = None  # the SDK's module-wide key: see the module's docstring


def _error(name: str) -> Any:
    return _ERRORS[name]


# ---- the SDK's response objects ------------------------------------------------------


class _Record:
    """An object of the SDK's responses: fields as attributes and as items; prints as the
    dict of its fields."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getitem__(self, key: str) -> Any:
        try:
            return self.__dict__[key]
        except KeyError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and hasattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def plain(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in self.__dict__.items()}

    def __str__(self) -> str:
        return str(self.plain())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.plain()!r})"


def _plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.plain()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class FineTuneOutput(_Record):
    """A job: ``job_id``, ``job_name``, ``status``, ``model``... as the platform sent them."""


class FineTune(_Record):
    """``status_code``, ``request_id``, ``code``, ``message``, ``usage``, and ``output``
    (a ``FineTuneOutput``; None when the platform refused the call)."""


class FineTuneList(_Record):
    """``output``: ``page_no``, ``page_size``, ``total`` and ``jobs`` (``FineTuneOutput``s)."""


class FineTuneCancel(_Record):
    """``output.status``."""


class FineTuneDelete(_Record):
    """``output.status``."""


def _ok(kind: type[_Record], output: _Record, usage: Any = None) -> Any:
    return kind(status_code=200, request_id="", code="", message="", output=output, usage=usage)


def _refused(kind: type[_Record], exc: PlatformError) -> Any:
    """The SDK's answer to a refused job call: its status, code and message; output None."""
    return kind(
        status_code=exc.status,
        request_id=exc.request_id or "",
        code=str(exc.code or ""),
        message=exc.message,
        output=None,
        usage=None,
    )


def _job_output(job: Job | dict[str, Any]) -> FineTuneOutput:
    fields = job.model_dump(exclude_unset=True) if isinstance(job, Job) else dict(job)
    return FineTuneOutput(**fields)


def _answered(kind: type[_Record], call: Callable[[], _Record]) -> Any:
    """``call()``'s answer; the platform's refusal (an HTTP status) as an answer, as the
    SDK returns it; no answer at all (a connection, an unclear outcome) raised."""
    try:
        return _ok(kind, call())
    except PlatformError as exc:
        if exc.status is None:
            raise
        return _refused(kind, exc)


def _client(api_key: str | None = None, workspace: str | None = None) -> PlatformClient:
    try:
        return PlatformClient(api_key or _default_key, workspace=workspace)
    except PlatformError as exc:
        raise _error("ValueErrorWithCode")(
            f"Invalid API key configuration: {exc.message}", error_code=3001
        ) from None


def _listed(value: Any) -> list[Any]:
    """A list of what was given: one item (a component, a path) is a list of one."""
    if value is None:
        return []
    if isinstance(value, (str, Path, FunctionSpec, tuning.Dataset)):
        return [value]
    return list(value)


# ---- AgenticRL -----------------------------------------------------------------------


class _JobCall:
    """A job call the SDK defines as a class method (``AgenticRL.get(job_id)``: the key
    given, else the module-wide one); called through an instance (``rl.get(job_id)``),
    that instance's key unless ``api_key`` is given, so that two instances never mix."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = method
        self._signature = inspect.signature(method)
        self.__doc__ = method.__doc__

    def __get__(self, instance: AgenticRL | None, owner: type[AgenticRL]) -> Any:
        method, signature = self._method, self._signature
        if instance is None or instance._api_key is None:
            return functools.wraps(method)(functools.partial(method, owner))

        @functools.wraps(method)
        def bound(*args: Any, **kwargs: Any) -> Any:
            arguments = signature.bind(owner, *args, **kwargs)
            if arguments.arguments.get("api_key") is None:
                arguments.arguments["api_key"] = instance._api_key
            return method(*arguments.args, **arguments.kwargs)

        return bound


class AgenticRL:
    """The SDK's Tuning workflow: ``init`` a job config (a YAML file, keyword overrides),
    ``register_functions``, ``upload_datasets``, ``submit_job`` (or ``run`` for the three),
    and the job calls (``get``, ``list``, ``cancel``, ``delete``, ``logs``)."""

    SUB_PATH: ClassVar[str] = "fine-tunes"

    def __init__(self, api_key: str | None = None) -> None:
        global _default_key
        self._client = _client(api_key)
        self._api_key = api_key  # its job calls' key (see _JobCall)
        if api_key:
            _default_key = api_key
        self._job = JobFile(Path.cwd() / "(arguments)", JobConfig())

    @property
    def tuning(self) -> JobConfig:
        """The job config (the SDK's ``TuningModel``): the YAML's keys, as models."""
        return self._job.config

    def init(self, config_path: str | None = None, **kwargs: Any) -> AgenticRL:
        """The job config from a YAML file (relative paths in it are relative to the file),
        each keyword replacing a top-level key (``job_name`` replaces ``name``)."""
        if config_path:
            self._job = load_job_file(config_path)
        if "job_name" in kwargs:
            kwargs["name"] = kwargs.pop("job_name")
        if kwargs:
            if "functions" in kwargs:
                kwargs["functions"] = _listed(kwargs["functions"])
            data = {**dict(self._job.config), **kwargs}
            self._job.config = JobConfig.model_validate(data)
        return self

    async def register_functions(
        self,
        functions: Any = None,
        lazy_load: bool | None = True,
    ) -> tuple[list[str], list[str], list[str], list[str], list[str], list[str]]:
        """Register the config's functions (or ``functions``, which replace them) that
        have no ``entity_id``; the entity ids of each type, then the instance ids (empty
        when ``lazy_load``)."""
        if functions:
            self.tuning.functions = _listed(functions)
        try:
            ids = await _async(
                # instances polled every second while they start (the SDK has no setting)
                lambda: self._client.register_functions(
                    self._job, lazy=lazy_load is not False, poll_interval=1.0
                )
            )
        except Exception as exc:
            raise _error("RegistrationError")(
                f"Function registration failed: {exc}", error_code=3002
            ) from exc
        return (
            ids.rollout_entity_ids,
            ids.reward_entity_ids,
            ids.group_reward_entity_ids,
            ids.rollout_instance_ids,
            ids.reward_instance_ids,
            ids.group_reward_instance_ids,
        )

    async def upload_datasets(
        self,
        datasets: list[Any] | None = None,
        training_files: list[str] | str | None = None,
        validation_files: list[str] | str | None = None,
    ) -> tuple[list[str], list[str]]:
        """Upload the config's datasets (or ``datasets``; or the files given, which replace
        those of their kind: training files the training datasets, validation files the
        validation ones) that have a local file and no ``file_id``; their file ids,
        training then validation. Every file is checked before any is uploaded."""
        if datasets:
            self.tuning.datasets = _listed(datasets)
        given = {"training": _listed(training_files), "validation": _listed(validation_files)}
        replaced = {kind for kind, names in given.items() if names}
        if replaced:
            self.tuning.datasets = [d for d in self.tuning.datasets if d.type not in replaced] + [
                tuning.Dataset.model_validate({"type": kind, "file_name": str(Path(f).resolve())})
                for kind, names in given.items()
                for f in names
            ]
        try:
            return await _async(self._upload)
        except Exception as exc:
            raise _error("DatasetsError")(
                f"Datasets upload failed: {exc}", error_code=3003
            ) from exc

    def _upload(self) -> tuple[list[str], list[str]]:
        from runtime.platform.datasets import check_jsonl

        pending = [
            (dataset, (self._job.base_dir / str(dataset.file_name)).resolve())
            for dataset in self.tuning.datasets
            if dataset.needs_upload and dataset.type != "testing"
        ]
        for _, path in pending:
            check_jsonl(path)
        uploaded: dict[str, list[str]] = {"training": [], "validation": []}
        for dataset, path in pending:
            ids = self._client.upload_datasets(**{dataset.type: [path]})
            dataset.file_id = getattr(ids, f"{dataset.type}_file_ids")[0]
            uploaded[dataset.type].append(dataset.file_id)
        return uploaded["training"], uploaded["validation"]

    def _override(
        self,
        model: str | None,
        datasets: list[Any] | None,
        functions: Any,
        hyper_parameters: dict[str, Any] | None,
        resources: dict[str, Any] | None,
        job_name: str | None,
    ) -> None:
        config = self.tuning
        if job_name:
            config.name = job_name
        if model:
            config.model.name = model
        if functions:
            config.functions = _listed(functions)
        if datasets:
            config.datasets = _listed(datasets)
        if hyper_parameters:
            from runtime.platform.config import HyperParameters

            config.training.hyper_parameters = HyperParameters.model_validate(hyper_parameters)
        if resources:
            config.training.resources = dict(resources)

    def submit_job(
        self,
        model: str | None = None,
        datasets: list[Any] | None = None,
        functions: Any = None,
        hyper_parameters: dict[str, Any] | None = None,
        resources: dict[str, Any] | None = None,
        job_name: str | None = None,
        teacher_model: str | None = None,
        **kwargs: Any,
    ) -> FineTune:
        """Submit the job with the functions registered and the datasets uploaded before
        (the arguments replace the config's); named ``name-XXXXXXXX``. ``api_key`` and
        ``workspace`` apply to this call only."""
        self._override(model, datasets, functions, hyper_parameters, resources, job_name)
        client = self._client.with_options(
            api_key=kwargs.get("api_key"), workspace=kwargs.get("workspace")
        )
        try:
            answer: FineTune = _answered(
                FineTune,
                lambda: _job_output(client.submit(self._job, teacher_model=teacher_model)),
            )
        except Exception as exc:
            raise _error("RuntimeErrorWithCode")(
                f"Job submission failed: {exc}", error_code=3005
            ) from exc
        return answer

    async def run(
        self,
        model: str | None = None,
        training_datasets: list[Any] | None = None,
        validation_datasets: list[Any] | None = None,
        functions: Any = None,
        hyper_parameters: dict[str, Any] | None = None,
        resources: dict[str, Any] | None = None,
        job_name: str | None = None,
        teacher_model: str | None = None,
        **kwargs: Any,
    ) -> FineTune:
        """Register the functions (lazily), upload the datasets, submit the job: the
        arguments replace the config's; everything local is checked before anything is
        sent."""
        datasets = _listed(training_datasets) + _listed(validation_datasets)
        self._override(model, datasets, functions, hyper_parameters, resources, job_name)
        client = self._client.with_options(
            api_key=kwargs.get("api_key"), workspace=kwargs.get("workspace")
        )
        try:
            done = await _async(lambda: client.run(self._job, teacher_model=teacher_model))
        except Exception as exc:
            if isinstance(exc, PlatformError) and exc.status is not None and _SUBMIT in exc.what:
                return _refused(FineTune, exc)  # refused at the submit: as submit_job answers
            raise _error("RuntimeErrorWithCode")(
                f"RL tuning workflow failed: {exc}", error_code=3006
            ) from exc
        assert done.job is not None
        return _ok(FineTune, _job_output(done.job))

    # ---- the job calls (class methods, as in the SDK) -------------------------------

    @_JobCall
    def get(
        cls, job_id: str, api_key: str | None = None, workspace: str | None = None, **kwargs: Any
    ) -> FineTune:
        client = _client(api_key, workspace)
        return _answered(FineTune, lambda: _job_output(client.get(job_id)))

    @_JobCall
    def list(
        cls,
        page_no: int = 1,
        page_size: int = 10,
        api_key: str | None = None,
        workspace: str | None = None,
        **kwargs: Any,
    ) -> FineTuneList:
        client = _client(api_key, workspace)

        def page() -> _Record:
            found = client.list_page(page_no, page_size)
            return _Record(
                page_no=found.page_no,
                page_size=found.page_size,
                total=found.total,
                jobs=[_job_output(job) for job in found.jobs],
            )

        return _answered(FineTuneList, page)

    @_JobCall
    def cancel(
        cls, job_id: str, api_key: str | None = None, workspace: str | None = None, **kwargs: Any
    ) -> FineTuneCancel:
        client = _client(api_key, workspace)
        return _answered(FineTuneCancel, lambda: _Record(status=client.cancel(job_id).status))

    @_JobCall
    def delete(
        cls, job_id: str, api_key: str | None = None, workspace: str | None = None, **kwargs: Any
    ) -> FineTuneDelete:
        client = _client(api_key, workspace)
        return _answered(FineTuneDelete, lambda: _Record(status=client.delete(job_id).status))

    @_JobCall
    def logs(
        cls,
        job_id: str,
        offset: int = 1,
        lines: int = 1000,
        api_key: str | None = None,
        workspace: str | None = None,
        **kwargs: Any,
    ) -> FineTune:
        client = _client(api_key, workspace)
        return _answered(FineTune, lambda: _Record(logs=client.logs_page(job_id, offset, lines)))

    @_JobCall
    async def test_functions(
        cls,
        instance_id: str,
        functype: FunctionType | str | None = None,
        input_data: dict[str, Any] | None = None,
        api_key: str | None = None,
        pull_logs: bool = False,
        log_page_size: int = 100,
        start_time: int | None = None,
        end_time: int | None = None,
        *,
        type: FunctionType | str | None = None,  # the name the SDK's documentation uses
    ) -> Any:
        """Send ``input_data`` to a started instance; its output, as the output model of
        the type. ``pull_logs``: the instance's log lines are logged after it."""
        kind = functype if functype is not None else type
        outputs: dict[str, Any] = {
            "rollout": models.RolloutOutput,
            "reward": models.RewardOutput,
            "group_reward": models.GroupRewardOutput,
        }
        try:
            client = _client(api_key)
            answer = await _async(
                lambda: client.test_function(instance_id, str(kind), dict(input_data or {}))
            )
            output = answer.output
            if not isinstance(output, dict) or (
                answer.http_status >= 400 and not isinstance(output.get("status"), str)
            ):
                raise PlatformError(
                    f"calling instance {instance_id}",
                    f"HTTP {answer.http_status}: {output!r}"[:300],
                    status=answer.http_status,
                )
            result = outputs[str(getattr(kind, "value", kind))].model_validate(output)
        except Exception as exc:
            raise _error("ValidationError")(
                f"Function test failed: {exc}", error_code=3008
            ) from exc
        if pull_logs:
            try:
                lines = await _async(lambda: client.instance_logs(instance_id))
            except PlatformError as exc:
                _logger.warning("the logs of instance %s could not be read: %s", instance_id, exc)
            else:
                for line in lines:
                    _logger.info("[%s] %s", instance_id, line)
        return result

    @classmethod
    async def query_function_instance_logs(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotProvidedError(_INSTANCE_CALLS)

    @classmethod
    async def query_all_function_instance_logs(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotProvidedError(_INSTANCE_CALLS)

    @classmethod
    async def delete_function_instance(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotProvidedError(_INSTANCE_CALLS)


_INSTANCE_CALLS = (
    "the SDK's instance log and delete calls are not served by agentic-rl-runtime's "
    "compatibility layer: use runtime.platform.client.PlatformClient.instance_logs and "
    "delete_instance, or python -m runtime instance logs|delete"
)


async def _async(call: Callable[[], Any]) -> Any:
    """``call()`` in a worker thread: the client blocks, the script's event loop must not."""
    import anyio

    return await anyio.to_thread.run_sync(call)
