"""What an eval run does: the job's functions, the data lines, the LLM and the limits.

Read from the same job file ``job run`` reads, with the same validation, so that what is
tried here is what would be submitted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from runtime.eval.secrets import Scrubber
from runtime.platform.config import JobFile, load_job_file
from runtime.platform.functions import Component, resolve
from runtime.platform.http import nested_deeper

__all__ = ["DEFAULT_SAMPLING", "LLM", "FunctionUnderTest", "Plan", "PlanError", "Sample", "make"]

# The server's own default deadline (``--timeout``), for functions without a timeout.
DEFAULT_TIMEOUT = 600.0
# Sampling parameters when the job file has none (hyper_parameters.sampling_params).
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 1.0}
# Levels of nesting in a data line: eval's walks of a line recurse, and orjson writes 254.
MAX_DEPTH = 100


class PlanError(Exception):
    """Exit 2: the command line, the job file or the data is wrong; nothing was started."""


class StartError(Exception):
    """Exit 1: a function cannot be started (not importable, not runnable locally)."""


@dataclass(frozen=True)
class LLM:
    base_url: str  # as given, userinfo included: shown only through without_userinfo
    model: str
    api_key: str
    timeout: float = 60.0  # the probe's and each chat completion's, --llm-timeout


@dataclass
class FunctionUnderTest:
    name: str
    kind: str  # rollout, reward, group_reward
    component: Component
    timeout: float
    weight: float
    concurrency: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    sub_rewards: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sample:
    file: str
    line: int  # 1-based, in ``file``
    record: dict[str, Any]
    ground_truth: Any

    @property
    def id(self) -> str:
        """How eval names the line: ``calc_train.jsonl:3`` (``--compare`` pairs on it)."""
        return f"{Path(self.file).name}:{self.line}"


@dataclass
class Plan:
    job: JobFile
    functions: list[FunctionUnderTest]
    data: list[Path]
    samples: list[Sample]
    rollouts: int
    concurrency: int
    sampling_params: dict[str, Any]
    llm: LLM | None
    seed: int | None
    max_failure_rate: float
    ground_truth_key: str | None = None
    scrub: Scrubber = field(default_factory=lambda: Scrubber(None, None, []))
    eval_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def rollout(self) -> FunctionUnderTest | None:
        return next((f for f in self.functions if f.kind == "rollout"), None)

    @property
    def rewards(self) -> list[FunctionUnderTest]:
        return [f for f in self.functions if f.kind == "reward"]

    @property
    def group_rewards(self) -> list[FunctionUnderTest]:
        return [f for f in self.functions if f.kind == "group_reward"]


def _ground_truth(record: dict[str, Any], key: str | None) -> Any:
    """``ground_truth``, else ``rollout_extra.solution``; or the dotted ``key`` given."""
    if key is None:
        if "ground_truth" in record:
            return record["ground_truth"]
        extra = record.get("rollout_extra")
        return extra.get("solution") if isinstance(extra, dict) else None
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def read_samples(paths: list[Path], count: int, key: str | None) -> list[Sample]:
    """The first ``count`` lines across ``paths``; a bad line is a PlanError naming it."""
    samples: list[Sample] = []
    for path in paths:
        try:
            handle = path.open("rb")
        except OSError as exc:
            raise PlanError(f"cannot read the data {path}: {exc.strerror or exc}") from None
        with handle:
            for number, raw in enumerate(handle, 1):
                if len(samples) >= count:
                    return samples
                if not raw.strip():
                    continue
                try:
                    record = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise PlanError(f"{path}:{number}: not JSON ({exc})") from None
                if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
                    raise PlanError(f"{path}:{number}: not a JSON object with a 'messages' list")
                if nested_deeper(record, MAX_DEPTH):
                    raise PlanError(f"{path}:{number}: nested more than {MAX_DEPTH} levels deep")
                samples.append(Sample(str(path), number, record, _ground_truth(record, key)))
    if not samples:
        raise PlanError(f"no data lines in {', '.join(str(p) for p in paths)}")
    return samples


def _data_paths(job: JobFile, split: str, data: str | None) -> list[Path]:
    if data:
        return [Path(data)]
    paths = []
    for index, dataset in enumerate(job.config.datasets):
        if dataset.type != split:
            continue
        if not dataset.file_name:
            raise PlanError(
                f"{job.where('datasets', index)}: the {split} dataset has no local file_name "
                f"({dataset.data_source_type}); pass the file with --data FILE.jsonl"
            )
        paths.append((job.base_dir / dataset.file_name).resolve())
    if not paths:
        raise PlanError(
            f"{job.path}: no {split} dataset; pass --split or a file with --data FILE.jsonl"
        )
    return paths


def _functions(job: JobFile) -> list[FunctionUnderTest]:
    functions = []
    for index, spec in enumerate(job.config.functions):
        name = spec.name or f"{spec.type.replace('_', '-')}-{index}"
        label = f"functions[{index}] ({name})"
        fcmodel = spec.fcmodel
        if not (fcmodel.classpath or (fcmodel.filepath and fcmodel.classname)):
            raise StartError(
                f"{label}: only an entity_id ({spec.entity_id}), no fcmodel.classpath: eval "
                "runs functions from their code, locally; add the classpath"
            )
        try:
            component = resolve(
                spec.type,
                fcmodel.classpath,
                (job.base_dir / fcmodel.zipdir).resolve(),
                label=label,
                filepath=fcmodel.filepath,
                classname=fcmodel.classname,
            )
        except Exception as exc:  # ComponentError: a file that is not there
            raise StartError(str(exc)) from None
        component.spec = spec
        component.requirements_path = fcmodel.requirements_path
        component.extra_files = tuple((job.base_dir / e).resolve() for e in fcmodel.extra_files)
        runtime = spec.runtime
        env = {
            k: ("true" if v else "false") if isinstance(v, bool) else str(v)
            for k, v in ((runtime.env or {}) if runtime else {}).items()
        }
        functions.append(
            FunctionUnderTest(
                name=name,
                kind=spec.type,
                component=component,
                timeout=float(spec.timeout) if spec.timeout else DEFAULT_TIMEOUT,
                weight=1.0 if spec.weight is None else float(spec.weight),
                concurrency=runtime.concurrency if runtime else None,
                env=env,
                sub_rewards=list(spec.reward_metric_weight or {}),
            )
        )
    return functions


def _check_url(url: str) -> None:
    """A PlanError unless ``url`` is an http(s) URL with a host (a line break pasted with
    it, ``http://[::1/v1``: httpx refuses it with a traceback, only once eval runs)."""
    import httpx

    from runtime.eval.secrets import without_userinfo

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise PlanError(
            f"--llm-base-url (or LLM_BASE_URL) {without_userinfo(url)!r} is not an http(s) URL "
            "with a host (an OpenAI-compatible endpoint such as http://127.0.0.1:8001/v1)"
        )


def make(
    config: str,
    *,
    split: str = "training",
    data: str | None = None,
    samples: int = 32,
    rollouts: int | None = None,
    concurrency: int = 16,
    llm_base_url: str | None = None,
    llm_model: str | None = None,
    llm_api_key: str = "EMPTY",
    llm_timeout: float = 60.0,
    ground_truth_key: str | None = None,
    seed: int | None = None,
    max_failure_rate: float = 0.5,
) -> Plan:
    """The plan of a run; PlanError (usage) or StartError (a function) when it cannot run."""
    from runtime.platform.config import ConfigError

    try:
        job = load_job_file(config)
        job.check()
    except ConfigError as exc:
        raise PlanError(str(exc)) from None
    hyper = job.config.training.hyper_parameters
    sampling = getattr(hyper, "sampling_params", None) if hyper else None
    if sampling is not None and not isinstance(sampling, dict):
        raise PlanError(
            f"{job.where('training', 'hyper_parameters', 'sampling_params')}: expected a mapping"
        )
    functions = _functions(job)
    has_rollout = any(f.kind == "rollout" for f in functions)
    if not llm_base_url:
        raise PlanError(
            "no LLM: pass --llm-base-url (env LLM_BASE_URL), an OpenAI-compatible endpoint "
            "such as a local vLLM server; "
            + (
                "the rollout gets it as model_resource"
                if has_rollout
                else "without a rollout, each trajectory is one chat completion from it"
            )
        )
    _check_url(llm_base_url)
    if not all(33 <= ord(c) <= 126 for c in llm_api_key):  # never shown: it is the key
        raise PlanError(
            "the LLM key (--llm-api-key, LLM_API_KEY) has a character that cannot go in an "
            "HTTP header (a space, a line break or a non-ASCII character): check how it was "
            "copied"
        )
    model = llm_model or job.config.model.name
    if not model:
        raise PlanError("no LLM model: pass --llm-model (env LLM_MODEL) or set model.name")
    paths = _data_paths(job, split, data)
    lines = read_samples(paths, samples, ground_truth_key)
    return Plan(
        job=job,
        functions=functions,
        data=paths,
        samples=lines,
        rollouts=rollouts or (hyper.n_rollouts if hyper and hyper.n_rollouts else 4),
        concurrency=concurrency,
        sampling_params=dict(sampling) if sampling else dict(DEFAULT_SAMPLING),
        llm=LLM(llm_base_url, model, llm_api_key, llm_timeout),
        seed=seed,
        max_failure_rate=max_failure_rate,
        ground_truth_key=ground_truth_key,
        scrub=Scrubber(
            llm_api_key, llm_base_url, [(f"{Path(s.file).name}:{s.line}", s.record) for s in lines]
        ),
    )
