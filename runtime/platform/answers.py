"""The platform's answers, as the contract describes them (docs/platform-api.md).

``Platform.call`` validates every answer against one of these models, so a malformed
answer (``{"output": "not-an-object"}``, ``{"output": {"url": 12345}}``) is one error
naming the call and the field, never a crash further on. Each model describes the useful
part of its answer: ``output``, else ``data``, else the whole body (``envelope`` names
where it is expected). Fields the client does not read are kept, unchecked unless the
contract gives their type.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

__all__ = [
    "REGISTERED",
    "Answer",
    "FilesUploaded",
    "InstanceDeleted",
    "InstanceInfo",
    "InstanceLogs",
    "InstanceStarted",
    "Job",
    "JobDone",
    "JobLogs",
    "JobPage",
    "Layer",
    "LayerStatus",
    "UploadUrl",
    "problems",
]

Text = Annotated[str, Field(min_length=1)]


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")
    # where the model's fields are: "output" or "data" (either is read, as the contract
    # allows), or None for the whole body
    envelope: ClassVar[str | None] = "output"

    def sent(self) -> dict[str, Any]:
        """The fields the platform sent (to print them)."""
        return self.model_dump(exclude_unset=True)


class UploadUrl(Answer):  # §2.4
    url: Text


class Layer(Answer):  # §2.6: a missing code is accepted
    layer_code: str = ""


class LayerStatus(Answer):  # §2.8
    status: str


class RolloutRegistered(Answer):  # §2.7
    rollout_id: Text


class RewardRegistered(Answer):
    reward_id: Text


class GroupRewardRegistered(Answer):
    group_reward_id: Text


REGISTERED: dict[str, type[Answer]] = {
    "rollout": RolloutRegistered,
    "reward": RewardRegistered,
    "group_reward": GroupRewardRegistered,
}


class InstanceStarted(Answer):  # §2.8, camelCase on the wire
    instance_id: Text = Field(validation_alias=AliasChoices("instanceId", "instance_id"))
    trigger_url: str | None = None
    trigger_token: str | None = None


class InstanceInfo(Answer):  # §3.1: -1 failed, 0 initialised, 1 deploying, 2 active
    status: int
    trigger_url: str | None = None
    trigger_token: str | None = None


class InstanceLogs(Answer):  # §3.3, either of its two shapes
    entries: list[Any] = Field(
        default_factory=list, validation_alias=AliasChoices("log_entries", "logEntries")
    )
    total: int | None = Field(None, validation_alias=AliasChoices("total_count", "totalCount"))


class InstanceDeleted(Answer):  # §3.4: a top-level code, the rest under data
    envelope = None
    code: int | str | None = None
    message: str | None = None
    request_id: str | None = None
    data: dict[str, Any] | None = None


class UploadedFile(Answer):
    file_id: Text
    name: str | None = None


class FilesUploaded(Answer):  # §4.2
    envelope = "data"
    uploaded_files: list[UploadedFile] = []
    failed_uploads: list[Any] = []


class Job(Answer):  # §7.1 (also the answer to a submit, §5.6)
    job_id: Text
    job_name: str | None = None
    status: str
    model: str | None = None
    base_model: str | None = None
    training_file_ids: list[str] | None = None
    validation_file_ids: list[str] | None = None
    hyper_parameters: dict[str, Any] | None = None
    training_type: str | None = None
    create_time: str | None = None
    end_time: str | None = None
    usage: int | dict[str, Any] | None = None


class JobPage(Answer):  # §7.3
    jobs: list[Job] = []
    page_no: int | None = None
    page_size: int | None = None
    total: int | None = None


class JobDone(Answer):  # §7.4, §7.5: cancel, delete
    status: str | None = None


def _lines(value: Any) -> Any:
    return value.splitlines() if isinstance(value, str) else value


class JobLogs(Answer):  # §7.6: a list of lines (a single text is accepted too)
    logs: Annotated[list[str], BeforeValidator(_lines)] = []


def problems(error: ValidationError, where: str = "", *, shown: int = 3) -> str:
    """The first ``shown`` problems of ``error``, each as ``path: message`` (never the value,
    which may be long or secret), under the path ``where``."""
    found = [
        f"{'.'.join(str(p) for p in (where, *e['loc']) if p != '') or '(top)'}: {e['msg']}"
        for e in error.errors(include_url=False)
    ]
    more = f" (and {len(found) - shown} more)" if len(found) > shown else ""
    return "; ".join(found[:shown]) + more
