"""The job file (``rl-job.yaml``, ``opd-job.yaml``): the SDK's YAML schema, as pydantic models.

Closed where the SDK's models are (an unknown key is an error), open where they are open
(``observability``, ``training.resources``, hyper-parameters). Every error names the key
path and the line of the file it comes from. Known hyper-parameters are converted to the
types the platform documents (YAML 1.1 reads ``2e-6`` as a string; the SDK sends it so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    ValidationError,
    model_validator,
)

# PyYAML is imported where a job file is read, not with these models: the SDK's alias
# (runtime.compat) serves them to a function loaded from its workspace, where a yaml.py of
# the workspace's would stand in for PyYAML.
if TYPE_CHECKING:
    import yaml

__all__ = [
    "ConfigError",
    "Dataset",
    "FcModel",
    "FunctionSpec",
    "JobConfig",
    "JobFile",
    "JobFileError",
    "Runtime",
    "load_job_file",
]

FunctionKind = Literal["rollout", "reward", "group_reward"]


class ConfigError(Exception):
    """A job file that cannot be used; the message names the file, line and key path."""


class JobFileError(ConfigError):
    """The file itself is wrong (its YAML, a key, a value): a usage error, nothing sent."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelRef(_Closed):
    name: str | None = None


class FcModel(_Closed):
    zipdir: str = "./"
    classpath: str = ""
    filepath: str = ""
    classname: str = ""
    requirements_path: str | None = "./requirements.txt"
    extra_files: list[str] = Field(default_factory=list)
    oss_id: str | None = None
    oss_signed_url: str | None = None


# a scaling threshold: the share of an instance's memory or concurrency in use
_Share = Annotated[float, Field(gt=0, le=1)]
# a count, a size or seconds: above 0 and within the 32-bit integer the platform's field is
# (a timeout of 401 digits crashed eval, and job run sent it as it was)
_MAX_INT = 2**31 - 1
PositiveInt = Annotated[int, Field(gt=0, le=_MAX_INT)]
NonNegativeInt = Annotated[int, Field(ge=0, le=_MAX_INT)]


class Runtime(_Closed):
    layer_code: str | None = None
    cpu: PositiveFloat | None = None  # vCPUs
    memory_size: PositiveInt | None = None  # MB
    disk_size: PositiveInt | None = None  # MB
    concurrency: PositiveInt | None = None  # requests at once per instance
    capacity: PositiveInt | None = None  # instances
    max_capacity: PositiveInt | None = None
    min_capacity: NonNegativeInt | None = None  # 0: scaled to zero when idle
    memory_scale_threshold: _Share | None = None
    concurrency_scale_threshold: _Share | None = None
    enable_vpc_config: bool | None = None
    security_group_id: str | None = None
    switch_ids: list[str] | None = None
    vpc_id: str | None = None
    vpc_role: str | None = None
    enable_log: bool | None = None
    env: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _bounds_in_order(self) -> Runtime:
        low, high = self.min_capacity, self.max_capacity
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_capacity ({low}) is above max_capacity ({high})")
        return self


class FunctionSpec(_Closed):
    type: FunctionKind = "rollout"
    name: str | None = None
    timeout: PositiveInt | None = None  # seconds
    weight: float | None = None
    reward_metric_weight: dict[str, float] | None = None
    fcmodel: FcModel = Field(default_factory=FcModel)
    runtime: Runtime | None = None
    entity_id: str | None = None
    # state fields of the SDK's model: accepted, never read from a file
    instance_id: str | None = None
    instance_url: str | None = None
    instance_token: str | None = None
    instance_status: int = -1


class MountStorage(_Closed):
    region: str | None = None
    bucket: str | None = None
    file_path: str | None = None


class Dataset(_Closed):
    type: Literal["training", "validation", "testing"] = "training"
    data_source_type: Literal["file_id", "download_url", "oss_mount"] = "file_id"
    file_name: str | None = None
    file_id: str | None = None
    download_url: str | None = None
    mount_storage: MountStorage | None = None

    @property
    def needs_upload(self) -> bool:
        return self.data_source_type == "file_id" and not self.file_id and bool(self.file_name)


class HyperParameters(BaseModel):
    """Open: unknown keys pass with their YAML types; the documented ones get their types."""

    model_config = ConfigDict(extra="allow")

    algorithm: str | None = None
    batch_size: PositiveInt | None = None
    eval_steps: PositiveInt | None = None
    kl_loss_coef: NonNegativeFloat | None = None
    learning_rate: PositiveFloat | None = None
    lr_scheduler_type: str | None = None
    max_length: PositiveInt | None = None  # tokens
    n_epochs: PositiveInt | None = None
    n_rollouts: PositiveInt | None = None  # rollouts per sample
    ppo_mini_batch_size: PositiveInt | None = None
    save_steps: PositiveInt | None = None
    save_strategy: str | None = None
    save_total_limit: PositiveInt | None = None  # checkpoints kept


class Training(_Closed):
    type: Literal["reinforcement", "pg_opd"] = "reinforcement"
    hyper_parameters: HyperParameters | None = None
    resources: dict[str, Any] | None = None


class JobConfig(_Closed):
    name: str = Field("agentic-rl", min_length=1, max_length=256)
    model: ModelRef = Field(default_factory=ModelRef)
    teacher_model: str | None = None
    functions: list[FunctionSpec] = Field(default_factory=list)
    datasets: list[Dataset] = Field(default_factory=list)
    training: Training = Field(default_factory=Training)
    observability: dict[str, Any] = Field(default_factory=dict)


@dataclass
class JobFile:
    """A validated job file, with what is needed to point back into it."""

    path: Path
    config: JobConfig
    lines: dict[tuple[str | int, ...], int] = field(default_factory=dict)

    @property
    def base_dir(self) -> Path:
        """Relative paths (``zipdir``, ``file_name``) resolve against the file's directory."""
        return self.path.parent

    def where(self, *loc: str | int) -> str:
        """``file:line: key.path`` of a location (the nearest enclosing key that has a line)."""
        for end in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return f"{self.path}:{line}: {_dotted(loc) or '(top level)'}"
        return f"{self.path}: {_dotted(loc) or '(top level)'}"

    def error(self, message: str, *loc: str | int) -> ConfigError:
        return ConfigError(f"{self.where(*loc)}: {message}")

    def check(self) -> None:
        """The rules across keys, after command-line overrides are applied."""
        config = self.config
        seen: dict[str, int] = {}
        for index, function in enumerate(config.functions):
            fcmodel = function.fcmodel
            if not function.entity_id and not (
                fcmodel.classpath or (fcmodel.filepath and fcmodel.classname)
            ):
                raise self.error(
                    "needs fcmodel.classpath (or fcmodel.filepath and fcmodel.classname), "
                    "or the entity_id of a registered function",
                    "functions",
                    index,
                )
            if function.name is None:
                continue
            if function.name in seen:
                raise self.error(
                    f"function name {function.name!r} is also used by "
                    f"functions[{seen[function.name]}] (names must be unique)",
                    "functions",
                    index,
                    "name",
                )
            seen[function.name] = index
        rollouts = [i for i, f in enumerate(config.functions) if f.type == "rollout"]
        rewards = [i for i, f in enumerate(config.functions) if f.type != "rollout"]
        if len(rollouts) > 1:
            raise self.error(
                f"{len(rollouts)} rollouts (functions{rollouts}): a job runs one rollout; "
                "keep one (the platform takes a single rollout, so the others would be "
                "registered and never used)",
                "functions",
                rollouts[1],
            )
        if config.teacher_model:
            return  # OPD: rollout and reward are each optional
        if config.training.type == "pg_opd":
            raise self.error(
                "pg_opd (on-policy distillation) needs a teacher model: set teacher_model "
                "or pass --teacher-model",
                "training",
                "type",
            )
        if not rollouts or not rewards:
            missing = "a rollout" if not rollouts else "a reward or group_reward"
            raise self.error(
                f"reinforcement training needs at least one rollout and one reward; "
                f"{missing} is missing (with a teacher model, both are optional)",
                "functions",
            )


def _dotted(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_MAX_BYTES = 1024 * 1024  # a job file is a page of settings, not data
_MAX_VALUES = 100_000  # values the file expands to, aliases counted each time they are used
_NOT_FINITE = "not a finite number (NaN and infinity cannot be sent)"
_MAX_DEPTH = 50  # levels of nesting; a job file needs about 5, and loading it recurses


def _check_depth(text: str) -> None:
    """A ConfigError past ``_MAX_DEPTH`` levels, found by the parser's events (it does not
    recurse; composing the file, and every walk of it after, does)."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > _MAX_DEPTH:
                mark = event.start_mark  # the parser sets it; the stubs allow None
                where = f"line {mark.line + 1}: " if mark is not None else ""
                raise ConfigError(f"{where}nested more than {_MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _expanded(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values ``node`` stands for with every alias expanded (memoised by node, so
    nested aliases cost one visit each); a ConfigError past the cap or on a cycle."""
    import yaml

    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise ConfigError(f"line {node.start_mark.line + 1}: an alias refers to itself")
    open_.add(key)
    total = 1
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    for child in children:
        total += _expanded(child, sizes, open_)
        if total > _MAX_VALUES:
            raise ConfigError(
                f"line {node.start_mark.line + 1}: the file expands to more than "
                f"{_MAX_VALUES} values (aliases nested in aliases?)"
            )
    open_.discard(key)
    sizes[key] = total
    return total


def _lines(node: yaml.Node, prefix: tuple[str | int, ...], out: dict, seen: set[int]) -> None:
    """The line of every key path; an aliased node is walked once (its first use)."""
    import yaml

    out.setdefault(prefix, node.start_mark.line + 1)
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in first and key.value != "<<":
                    raise ConfigError(
                        f"line {line}: {_dotted((*prefix, key.value))} is given twice "
                        f"(first on line {first[key.value]})"
                    )
                first[key.value] = line
                # named, not written in the subscript: mypy reads `out[(*a, b)]` as 3.11's
                # star-in-subscript syntax (it is a tuple display, valid on 3.10)
                path = (*prefix, key.value)
                _lines(value, path, out, seen)
                out[path] = line
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _lines(item, (*prefix, index), out, seen)


def _non_finite(value: Any, loc: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """The path of the first NaN or infinity in ``value`` (JSON cannot carry them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return loc
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _non_finite(item, (*loc, key))
        if found is not None:
            return found
    return None


def load_job_file(path: str | Path) -> JobFile:
    """Read and validate a job file; every problem is a JobFileError naming line and key."""
    try:
        return _read_job_file(Path(path))
    except ConfigError as exc:
        raise JobFileError(str(exc)) from None


def _read_job_file(path: Path) -> JobFile:
    import yaml

    try:
        size = path.stat().st_size
        if size > _MAX_BYTES:
            raise ConfigError(
                f"{path}: {size / 1e6:.1f} MB; a job file is at most {_MAX_BYTES / 1e6:.1f} MB "
                "(datasets go in their own files, named under datasets:)"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the job file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        _check_depth(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines: dict[tuple[str | int, ...], int] = {}
        if node is not None:
            _expanded(node, {}, set())
            _lines(node, (), lines, set())
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}:{str(exc).removeprefix('line ')}") from None
    job = JobFile(path, JobConfig(), lines)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise job.error("the job file must be a mapping of keys (name, functions, ...)")
    try:
        job.config = JobConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise job.error(_reason(first), *first["loc"]) from None
    bad = _non_finite(job.config.model_dump(), ())
    if bad is not None:
        raise job.error(_NOT_FINITE, *bad)
    return job


def _reason(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key" + _allowed(error["loc"])
    value = error.get("input")
    if isinstance(value, float) and not math.isfinite(value):  # before its range is checked
        return _NOT_FINITE
    if error["type"] == "value_error":  # a rule across keys: its own words
        return str(error["ctx"]["error"])
    return str(error["msg"])


def _allowed(loc: tuple[str | int, ...]) -> str:
    model: Any = JobConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            return ""
        model = _model_of(info.annotation)
        if model is None:
            return ""
    return " (allowed: " + ", ".join(model.model_fields) + ")"


def _model_of(annotation: Any) -> Any:
    """The pydantic model inside ``X``, ``X | None`` or ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
