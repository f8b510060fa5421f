"""Ready-made reward hooks of in-process trainers, each calling a served function.

- verl: ``custom_reward_function`` pointing at ``verl_compute_score`` (async, for verl's
  reward loop), ``verl_compute_score_sync`` (older reward managers) or
  ``verl_compute_score_batch`` (``reward_model.reward_manager=batch``: one call with the
  batch's lists, its samples scored at once over the client's pool). The URL comes from
  ``custom_reward_function.reward_kwargs.url`` or ``$AGENTIC_RL_REWARD_URL``.
- TRL: ``reward_funcs=[trl_reward_func(url)]`` for GRPOTrainer (and the other trainers
  taking ``reward_funcs``).
- AReaL: ``reward_fn=areal_reward_fn`` (URL from ``$AGENTIC_RL_REWARD_URL``, deadline from
  ``$AGENTIC_RL_REWARD_TIMEOUT``, 10 s: below the 15 s AReaL's ``AsyncRewardWrapper`` waits),
  or ``reward_fn=AReaLReward(url, timeout=...)``. AReaL runs reward functions in a process
  pool, so both pickle.

Every hook scores a failed call 0.0 (TRL: ``failed_value``), whatever score the function
gave a result it marked failed, and logs the reason; none of them raises, so a reward
outage degrades the run instead of ending it. Dataset values go through orjson: NaN and
Infinity become null, numpy values plain numbers.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import orjson

from processors_base.client import RewardClient, RewardResult, shared_client

__all__ = [
    "AReaLReward",
    "areal_reward_fn",
    "trl_reward_func",
    "verl_compute_score",
    "verl_compute_score_batch",
    "verl_compute_score_sync",
]

log = logging.getLogger("processors_base.trainer_hooks")

# Dataset columns taken as the ground truth, first found first.
GROUND_TRUTH_COLUMNS = ("ground_truth", "answer", "solution", "expected_answer", "label")
_CLIENT_OPTIONS = (
    "concurrency",
    "timeout",
    "max_retry_wait",
    "headers",
    "failure_threshold",
    "cool_down",
)
TIMEOUT_ENV = "AGENTIC_RL_REWARD_TIMEOUT"
# AReaL's AsyncRewardWrapper gives a reward 15 s: ours must answer 0.0 before that
AREAL_TIMEOUT = 10.0


# --- verl --------------------------------------------------------------------------------


def _verl_client(kwargs: dict[str, Any]) -> RewardClient:
    options = {k: kwargs[k] for k in _CLIENT_OPTIONS if k in kwargs}
    return shared_client(kwargs.get("url"), **options)


def _verl_request(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any
) -> tuple[list[dict[str, Any]], Any, dict[str, Any]]:
    messages = [{"role": "assistant", "content": solution_str}]
    extra = {"trainer": "verl", "data_source": data_source, "extra_info": _jsonable(extra_info)}
    return messages, _jsonable(ground_truth), extra


def _verl_call(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any, kwargs: dict
) -> tuple[RewardClient, list[dict[str, Any]], Any, dict[str, Any]]:
    messages, truth, extra = _verl_request(data_source, solution_str, ground_truth, extra_info)
    return _verl_client(kwargs), messages, truth, extra


def _verl_result(result: RewardResult) -> dict[str, Any]:
    # verl reads "score"; the other keys become reward_extra_info, the same on every sample
    return {**result.metrics, "score": result.score, "reward_failed": float(result.failed)}


async def verl_compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """verl's ``compute_score``, async (verl's reward loop awaits it)."""
    client, messages, truth, extra = _verl_call(
        data_source, solution_str, ground_truth, extra_info, kwargs
    )
    return _verl_result(await client.score_async(messages, truth, extra=extra))


def verl_compute_score_sync(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """verl's ``compute_score``, sync (for reward managers that call it in a thread)."""
    client, messages, truth, extra = _verl_call(
        data_source, solution_str, ground_truth, extra_info, kwargs
    )
    return _verl_result(client.score_sync(messages, truth, extra=extra))


def verl_compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """verl's batch ``compute_score`` (``reward_manager=batch``): one dict per sample, in order.

    The client's pool scores ``concurrency`` samples at a time, the next sent as one ends
    (so each call's deadline runs from when it is sent, not from the batch's start). A
    sample that failed (or whose call ended in an exception) scores 0.0 with
    ``reward_failed`` 1.0; every dict has every metric name of the batch (0.0 where a sample
    has none), as verl appends each key's values into per-key lists of the batch's length.
    Lists of different lengths are a ValueError before anything is sent.
    """
    client = _verl_client(kwargs)
    columns = [list(data_sources), list(solution_strs), list(ground_truths)]
    columns.append([None] * len(columns[1]) if extra_infos is None else list(extra_infos))
    if len({len(column) for column in columns}) > 1:
        raise ValueError(
            "data_sources, solution_strs, ground_truths and extra_infos differ in length: "
            + ", ".join(str(len(column)) for column in columns)
        )
    samples = iter(enumerate(zip(*columns, strict=True)))
    in_flight: dict[concurrent.futures.Future[RewardResult], int] = {}
    results: list[RewardResult] = [RewardResult(0.0)] * len(columns[0])

    def send_next() -> None:
        if (item := next(samples, None)) is not None:
            index, sample = item
            messages, truth, extra = _verl_request(*sample)
            in_flight[client.submit(messages, truth, extra=extra)] = index

    for _ in range(client.concurrency):
        send_next()
    while in_flight:
        done, _ = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            results[in_flight.pop(future)] = _outcome(future)
            send_next()
    names = dict.fromkeys(name for result in results for name in result.metrics)
    return [
        _verl_result(replace(r, metrics={**dict.fromkeys(names, 0.0), **r.metrics}))
        for r in results
    ]


def _outcome(future: concurrent.futures.Future[RewardResult]) -> RewardResult:
    try:
        return future.result()
    except Exception as exc:  # the client answers failures itself: a bug, still not the run's end
        log.exception("reward call failed, scoring 0.0")
        return RewardResult(0.0, failed=True, reason=f"{type(exc).__name__}: {exc}")


# --- TRL ---------------------------------------------------------------------------------


def trl_reward_func(
    url: str | None = None,
    *,
    ground_truth_column: str | None = None,
    failed_value: float | None = 0.0,
    name: str = "remote_reward",
    **client_options: Any,
) -> Callable[..., list[float | None]]:
    """A TRL reward function ``f(prompts, completions, **columns) -> list[float | None]``.

    Prompts and completions may be text or conversations (lists of messages). The ground
    truth is the dataset column ``ground_truth_column`` (default: the first of
    ``ground_truth``, ``answer``, ``solution``, ``expected_answer``, ``label``); the other
    columns reach the function in ``rollout_extra``. A failed call scores ``failed_value``
    (None tells TRL to leave this reward out of the sample's sum).
    """
    shared_client(url, **client_options)  # a missing URL or a bad option: raised here, at once

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list:
        client = shared_client(url, **client_options)  # at each call: a forked child has its own
        column = ground_truth_column or next(
            (c for c in GROUND_TRUTH_COLUMNS if c in columns), None
        )
        skip = {"trainer_state", "completion_ids", "log_extra", "log_metric", column}
        others = {k: v for k, v in columns.items() if k not in skip and isinstance(v, list)}
        futures = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            messages = _messages(prompt, "user") + _messages(completion, "assistant")
            truth = _jsonable(columns[column][i]) if column else None
            extra = {"trainer": "trl", **{k: _jsonable(v[i]) for k, v in others.items()}}
            futures.append(client.submit(messages, truth, extra=extra))  # all at once
        results = [future.result() for future in futures]
        return [failed_value if r.failed else r.score for r in results]

    reward.__name__ = reward.__qualname__ = name  # TRL logs rewards under the function's name
    return reward


# --- AReaL -------------------------------------------------------------------------------


class AReaLReward:
    """AReaL's ``reward_fn``: the served function's score of one completion (0.0 if failed).

    ``url`` defaults to ``$AGENTIC_RL_REWARD_URL``; ``timeout`` (seconds, over queueing,
    retries and the call) to ``$AGENTIC_RL_REWARD_TIMEOUT``, else 10 s, below the 15 s of
    AReaL's ``AsyncRewardWrapper`` so that the 0.0 arrives before AReaL gives up. A plain
    object: it pickles into AReaL's process pool.
    """

    def __init__(self, url: str | None = None, *, timeout: float | None = None) -> None:
        self.url = url
        self.timeout = timeout

    def __call__(
        self,
        prompt: Any,
        completions: Any,
        prompt_ids: Any = None,
        completion_ids: Any = None,
        **kwargs: Any,
    ) -> float:
        timeout = self.timeout
        if timeout is None:
            timeout = _env_seconds(TIMEOUT_ENV, AREAL_TIMEOUT)
        column = next((c for c in GROUND_TRUTH_COLUMNS if c in kwargs), None)
        messages = _messages(prompt, "user") + _messages(completions, "assistant")
        truth = _jsonable(kwargs[column]) if column else None
        others = {k: _jsonable(v) for k, v in kwargs.items() if k != column}
        extra = {"trainer": "areal", **others}
        result = shared_client(self.url).score_sync(messages, truth, extra=extra, timeout=timeout)
        return result.score


def areal_reward_fn(
    prompt: Any,
    completions: Any,
    prompt_ids: Any = None,
    completion_ids: Any = None,
    **kwargs: Any,
) -> float:
    """AReaL's ``reward_fn`` with the URL and deadline from the environment."""
    return AReaLReward()(prompt, completions, prompt_ids, completion_ids, **kwargs)


# --- helpers -----------------------------------------------------------------------------


def _env_seconds(name: str, default: float) -> float:
    """Seconds from the environment variable ``name``, else ``default``; a ValueError that
    names it when it is not a number of seconds above 0."""
    value = os.environ.get(name) or ""
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(f"{name}={value!r} is not a number of seconds above 0")
    return seconds


def _messages(value: Any, role: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, dict):
        return [dict(value)]
    return [dict(m) if isinstance(m, dict) else {"role": role, "content": str(m)} for m in value]


def _jsonable(value: Any) -> Any:
    """Plain JSON values: numpy scalars and arrays as numbers and lists, NaN and Infinity
    as null (JSON has neither), the rest as text."""
    try:
        return orjson.loads(orjson.dumps(value, default=_plain, option=_ORJSON_OPTIONS))
    except TypeError:  # too deep, an int past 64 bits...: its text rather than an exception
        return str(value)


_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # numpy and torch
    return tolist() if callable(tolist) else str(value)
