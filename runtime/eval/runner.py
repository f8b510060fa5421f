"""The run: K rollouts per data line, each trajectory scored by every reward, each group of
K by every group reward, all over HTTP to the served functions, with inputs built as the
platform builds them. Progress on stderr; an early stop when too many calls fail.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson

from runtime.eval.files import terminal, writable
from runtime.eval.plan import FunctionUnderTest, Plan, Sample

__all__ = ["LLM_NAME", "Call", "Results", "Trajectory", "run"]

LLM_NAME = "llm"  # the function name of the chat completions when the job has no rollout
EARLY_STOP_AFTER = 20  # calls of a function finished before its failure rate may stop the run
_EXIT_WAIT = 2.0  # seconds a connection error waits to see whether the server is exiting
_CHAT_PARAMS = frozenset(
    (
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "stop",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "tool_choice",
    )
)


@dataclass
class Call:
    function: str
    ok: bool
    latency: float
    error_code: str | None = None
    error: str | None = None
    sample: str | None = None  # the data line it was for (Sample.id)


@dataclass
class Trajectory:
    sample: Sample
    index: int  # k, of the K rollouts of the sample
    status: str = "pending"  # success, failed, or pending when the run stopped first
    messages: list[dict[str, Any]] | None = None
    agent_output: dict[str, Any] | None = None
    error_code: str | None = None
    error: str | None = None
    latency: dict[str, float] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: dict[str, dict[str, str | None]] = field(default_factory=dict)
    invalid_text: bool = False  # the LLM's answer had text UTF-8 cannot carry: replaced


@dataclass
class Results:
    trajectories: list[Trajectory]
    calls: list[Call]
    stopped: str | None
    elapsed: float
    started_at: float = 0.0  # seconds since the epoch


# name -> why its server is gone ("exited with code 137; its log ends: ..."), or None
Exited = Callable[[str], "str | None"]


class _Stop(Exception):
    pass


class _NotACompletion(Exception):
    pass


class _Progress:
    """A rich progress bar per stage on stderr: done/total, failures, elapsed, remaining."""

    def __init__(self, plan: Plan) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description:<22}", markup=False),  # names may hold [brackets]
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed[/red]"),
            TextColumn("{task.fields[skipped]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        n, k = len(plan.samples), plan.rollouts
        self._tasks: dict[str, Any] = {}
        self._failed: Counter[str] = Counter()
        self._skipped: Counter[str] = Counter()
        stages = [("rollouts" if plan.rollout else "chat completions", n * k)]
        stages += [(f"reward {f.name}", n * k) for f in plan.rewards]
        stages += [(f"group {f.name}", n) for f in plan.group_rewards]
        for stage, total in stages:
            self._tasks[stage] = self._bar.add_task(
                terminal(stage), total=total, failed=0, skipped=""
            )

    def __enter__(self) -> _Progress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def done(self, stage: str, failed: bool) -> None:
        self._failed[stage] += failed
        self._bar.update(self._tasks[stage], advance=1, failed=self._failed[stage])

    def skip(self, stage: str, count: int) -> None:
        self._skipped[stage] += count
        self._bar.update(
            self._tasks[stage], advance=count, skipped=f"{self._skipped[stage]} skipped"
        )


def _compact(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


class _Runner:
    def __init__(
        self, plan: Plan, urls: dict[str, str], progress: _Progress, exited: Exited | None
    ) -> None:
        self.plan = plan
        self.urls = urls
        self.exited = exited
        self.progress = progress
        self.calls: list[Call] = []
        self.stopped: str | None = None
        self.limiter = anyio.CapacityLimiter(plan.concurrency)
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=plan.concurrency * 2),
            headers={"content-type": "application/json"},
        )
        self.llm: Any = None
        n, k = len(plan.samples), plan.rollouts
        self.planned = {f.name: n if f.kind == "group_reward" else n * k for f in plan.functions}
        self.planned[LLM_NAME] = n * k

    # ---- bookkeeping ------------------------------------------------------------------

    def _record(self, call: Call, stage: str) -> None:
        """Count the call; stop the run when its function fails too often (each function on
        its own calls, so that a reward that always fails stops the run even while the
        rollouts all succeed)."""
        if call.error is not None:
            call.error = self.plan.scrub.text(call.error)
        self.calls.append(call)
        self.progress.done(stage, not call.ok)
        if call.error_code == "SERVER_EXITED":
            self.stopped = f"stopped: {call.function}'s server {call.error}"
            raise _Stop
        calls = [c for c in self.calls if c.function == call.function]
        failed = [c for c in calls if not c.ok]
        # after its first 20 calls, or all of them when it has fewer: a short run whose
        # calls all fail is stopped too, never a silent exit 0
        after = min(EARLY_STOP_AFTER, self.planned.get(call.function, EARLY_STOP_AFTER))
        if len(calls) < after or len(failed) / len(calls) <= self.plan.max_failure_rate:
            return
        (code, count), *_ = Counter(c.error_code for c in failed).most_common(1)
        example = next(c.error for c in failed if c.error_code == code) or ""
        self.stopped = (
            f"stopped early: {call.function} failed {len(failed)} of its first {len(calls)} "
            f"calls ({len(failed) / len(calls):.0%}, over --max-failure-rate "
            f"{self.plan.max_failure_rate:g}), most often {code} ({count}x): {example[:300]}"
        )
        raise _Stop

    def _metadata(self, sample: Sample, rollout: str) -> dict[str, str]:
        sample_id = f"eval-{self.plan.eval_id}-{sample.line}"
        return {
            "job_id": f"eval-{self.plan.eval_id}",
            "sample_id": sample_id,
            "rollout_id": f"{sample_id}-{rollout}",
            "attempt_id": "0",
        }

    def _sampling(self, index: int) -> dict[str, Any]:
        params = dict(self.plan.sampling_params)
        if self.plan.seed is not None:
            params["seed"] = self.plan.seed + index  # reproducible, yet K different samples
        return params

    async def _post(self, function: FunctionUnderTest, body: dict[str, Any]) -> tuple[Any, Call]:
        """One call; its output when it succeeded, and the call's record either way."""
        async with self.limiter:
            started = time.perf_counter()
            try:
                response = await self.client.post(
                    self.urls[function.name] + "/api/v1",
                    content=orjson.dumps(body),
                    timeout=function.timeout + 30,  # the server answers 504 at its deadline
                )
            except httpx.TimeoutException:
                latency = time.perf_counter() - started
                return None, Call(function.name, False, latency, "CLIENT_TIMEOUT", "no answer")
            except Exception as exc:  # any failure is this call's, not the run's
                latency = time.perf_counter() - started
                return None, await self._transport_error(function, body, latency, exc)
            latency = time.perf_counter() - started
        try:
            output = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            text = response.text[:200]
            return None, Call(function.name, False, latency, f"HTTP_{response.status_code}", text)
        if not isinstance(output, dict):
            return None, Call(function.name, False, latency, "INVALID_OUTPUT", "not an object")
        if response.status_code != 200 or output.get("status") == "failed":
            code = output.get("error_code") or f"HTTP_{response.status_code}"
            message = output.get("error") or output.get("detail")
            return output, Call(function.name, False, latency, str(code), str(message))
        return output, Call(function.name, True, latency)

    async def _transport_error(
        self, function: FunctionUnderTest, body: dict[str, Any], latency: float, exc: Exception
    ) -> Call:
        """No answer: the server died, refused a body too large (413, then it closes the
        connection before the body is sent, so the client sees only a reset), or else."""
        gone = await self._gone(function.name)
        if gone:
            return Call(function.name, False, latency, "SERVER_EXITED", gone)
        size = len(orjson.dumps(body))
        limit = _max_body(function)
        if size > limit:
            message = (
                f"HTTP 413: request body is larger than {limit} bytes ({size} bytes; the "
                "server's --max-body, MAX_BODY_BYTES)"
            )
            return Call(function.name, False, latency, "BODY_TOO_LARGE", message)
        detail = f"{type(exc).__name__}: {exc}"
        return Call(function.name, False, latency, "CONNECTION_ERROR", detail)

    async def _gone(self, name: str) -> str | None:
        """Why the function's server is gone, if it is: a dying process closes its sockets
        a moment before it can be reaped, so a connection error waits for it a little."""
        if self.exited is None:
            return None
        deadline = time.monotonic() + _EXIT_WAIT
        while (why := self.exited(name)) is None and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        return why

    # ---- stages -----------------------------------------------------------------------

    async def _rollout(self, trajectory: Trajectory) -> None:
        sample, rollout, plan = trajectory.sample, self.plan.rollout, self.plan
        record = sample.record
        assert plan.llm is not None
        if rollout is None:
            await self._complete(trajectory)
            return
        body = _compact(
            {
                "func_type": "rollout",
                "messages": record["messages"],
                "tools": record.get("tools"),
                "ground_truth": sample.ground_truth,
                "rollout_extra": record.get("rollout_extra"),
                "sampling_params": self._sampling(trajectory.index),
                "model_resource": {
                    "model_name": plan.llm.model,
                    "base_url": plan.llm.base_url,
                    "api_key": plan.llm.api_key,
                },
                "request_metadata": self._metadata(sample, str(trajectory.index)),
            }
        )
        output, call = await self._post(rollout, body)
        trajectory.latency[rollout.name] = call.latency
        agent = (output or {}).get("agent_output") if isinstance(output, dict) else None
        if isinstance(agent, dict):
            trajectory.agent_output = agent
            trajectory.messages = agent.get("messages")
        if call.ok and not isinstance(agent, dict):
            call.ok, call.error_code, call.error = False, "NO_AGENT_OUTPUT", "agent_output: null"
        trajectory.status = "success" if call.ok else "failed"
        trajectory.error_code, trajectory.error = call.error_code, call.error
        call.sample = sample.id
        self._record(call, "rollouts")

    async def _complete(self, trajectory: Trajectory) -> None:
        """No rollout (OPD, the platform generates): one chat completion is the trajectory."""
        from openai import AsyncOpenAI, OpenAIError

        plan = self.plan
        assert plan.llm is not None
        if self.llm is None:
            self.llm = AsyncOpenAI(
                base_url=plan.llm.base_url, api_key=plan.llm.api_key, max_retries=0
            )
        record = trajectory.sample.record
        params = self._sampling(trajectory.index)
        known = {k: v for k, v in params.items() if k in _CHAT_PARAMS}
        extra = {k: v for k, v in params.items() if k not in _CHAT_PARAMS}
        tools = {"tools": record["tools"]} if record.get("tools") else {}
        async with self.limiter:
            started = time.perf_counter()
            try:
                # all of it within the timeout: openai's (httpx's) is per read, which an
                # endpoint sending a byte a second never trips
                with anyio.fail_after(plan.llm.timeout):
                    response = await self.llm.chat.completions.create(
                        model=plan.llm.model,
                        messages=record["messages"],
                        extra_body=extra or None,
                        timeout=plan.llm.timeout,
                        **tools,
                        **known,
                    )
                if isinstance(response, str):  # a 200 that is not JSON: a web page, ...
                    raise _NotACompletion(f"not a chat completion: {response[:200]!r}")
                answer = response.choices[0].message.model_dump(exclude_none=True)
                # a lone surrogate (half an emoji) can be neither sent nor written: U+FFFD
                message = writable(answer)
                trajectory.invalid_text = message != answer
                call = Call(LLM_NAME, True, time.perf_counter() - started)
            except Exception as exc:  # a bad answer fails this call, not the run
                code = getattr(exc, "code", None) if isinstance(exc, OpenAIError) else None
                if isinstance(exc, _NotACompletion):
                    code = "INVALID_RESPONSE"
                detail = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, TimeoutError):  # fail_after's
                    code = "CLIENT_TIMEOUT"
                    detail = f"no complete answer within {plan.llm.timeout:g} s (--llm-timeout)"
                latency = time.perf_counter() - started
                call = Call(LLM_NAME, False, latency, str(code or type(exc).__name__), detail)
        trajectory.latency[LLM_NAME] = call.latency
        if call.ok:
            trajectory.messages = [*record["messages"], message]
            trajectory.agent_output = {"messages": trajectory.messages}
        trajectory.status = "success" if call.ok else "failed"
        trajectory.error_code, trajectory.error = call.error_code, call.error
        call.sample = trajectory.sample.id
        self._record(call, "chat completions")

    async def _reward(self, function: FunctionUnderTest, trajectory: Trajectory) -> None:
        body = {
            "func_type": "reward",
            "agent_output": trajectory.agent_output,
            "ground_truth": trajectory.sample.ground_truth,
            "request_metadata": self._metadata(trajectory.sample, str(trajectory.index)),
        }
        output, call = await self._post(function, _compact(body))
        reward = (output or {}).get("reward") if isinstance(output, dict) else None
        score = reward.get("reward_score") if isinstance(reward, dict) else None
        if call.ok and not isinstance(score, (int, float)):
            call.ok, call.error_code, call.error = False, "INVALID_OUTPUT", "no reward_score"
        trajectory.latency[function.name] = call.latency
        if call.ok:
            trajectory.scores[function.name] = float(score)  # type: ignore[arg-type]
            trajectory.metrics[function.name] = _metrics(reward)
        else:
            trajectory.errors[function.name] = {"code": call.error_code, "message": call.error}
        call.sample = trajectory.sample.id
        self._record(call, f"reward {function.name}")

    async def _group(self, function: FunctionUnderTest, group: list[Trajectory]) -> None:
        scored = [t for t in group if t.status == "success"]
        if not scored:
            self.progress.skip(f"group {function.name}", 1)
            return
        body = {
            "func_type": "group_reward",
            "agent_outputs": [t.agent_output for t in scored],
            "ground_truth": scored[0].sample.ground_truth,
            "request_metadata": self._metadata(scored[0].sample, "group"),
        }
        output, call = await self._post(function, _compact(body))
        reward = (output or {}).get("reward") if isinstance(output, dict) else None
        rewards = reward.get("rewards") if isinstance(reward, dict) else None
        if call.ok and (not isinstance(rewards, list) or len(rewards) != len(scored)):
            got = len(rewards) if isinstance(rewards, list) else "no"
            call.ok, call.error_code = False, "INVALID_OUTPUT"
            call.error = f"{got} rewards for {len(scored)} agent_outputs"
        for position, trajectory in enumerate(scored):
            trajectory.latency[function.name] = call.latency
            item = rewards[position] if call.ok and rewards else None
            score = item.get("reward_score") if isinstance(item, dict) else None
            if isinstance(score, (int, float)) and math.isfinite(score):
                trajectory.scores[function.name] = float(score)
                trajectory.metrics[function.name] = _metrics(item)
            else:
                trajectory.errors[function.name] = {
                    "code": call.error_code or "INVALID_OUTPUT",
                    "message": call.error or f"rewards[{position}] has no reward_score",
                }
        call.sample = scored[0].sample.id
        self._record(call, f"group {function.name}")

    async def _guarded(self, function: str, stage: str, work: Any, *args: Any) -> None:
        """A bug of eval's own in one call fails that call, never the run."""
        try:
            await work(*args)
        except _Stop:
            raise
        except Exception as exc:
            self._record(
                Call(function, False, 0.0, "EVAL_ERROR", f"{type(exc).__name__}: {exc}"), stage
            )

    async def _chain(self, trajectory: Trajectory) -> None:
        rollout = self.plan.rollout
        name = rollout.name if rollout else LLM_NAME
        stage = "rollouts" if rollout else "chat completions"
        await self._guarded(name, stage, self._rollout, trajectory)
        if trajectory.status == "pending":  # eval's own error, recorded as the call's
            trajectory.status, trajectory.error_code = "failed", "EVAL_ERROR"
        if trajectory.status != "success":
            for function in self.plan.rewards:
                self.progress.skip(f"reward {function.name}", 1)
            return
        async with anyio.create_task_group() as group:
            for function in self.plan.rewards:
                stage = f"reward {function.name}"
                group.start_soon(
                    self._guarded, function.name, stage, self._reward, function, trajectory
                )

    async def _sample(self, group: list[Trajectory]) -> None:
        async with anyio.create_task_group() as chains:
            for trajectory in group:
                chains.start_soon(self._chain, trajectory)
        async with anyio.create_task_group() as groups:
            for function in self.plan.group_rewards:
                stage = f"group {function.name}"
                groups.start_soon(self._guarded, function.name, stage, self._group, function, group)

    async def run(self, trajectories: list[Trajectory]) -> None:
        by_sample: dict[int, list[Trajectory]] = {}
        for trajectory in trajectories:
            by_sample.setdefault(id(trajectory.sample), []).append(trajectory)
        try:
            async with self.client, anyio.create_task_group() as samples:
                for group in by_sample.values():
                    samples.start_soon(self._sample, group)
        except BaseException as exc:  # an early stop comes wrapped in an exception group
            if not all(isinstance(e, _Stop) for e in _leaves(exc)):
                raise
        finally:
            if self.llm is not None:
                await self.llm.close()


def _metrics(reward: Any) -> dict[str, Any]:
    found = reward.get("reward_metrics") if isinstance(reward, dict) else None
    return dict(found) if isinstance(found, dict) else {}


def _max_body(function: FunctionUnderTest) -> int:
    """The served function's request body limit, as its server reads it."""
    from runtime.config import Settings

    value = function.env.get("MAX_BODY_BYTES") or os.environ.get("MAX_BODY_BYTES")
    try:
        return int(value) if value else int(Settings.max_body)
    except ValueError:
        return int(Settings.max_body)


def _leaves(group: BaseException) -> list[BaseException]:
    nested = getattr(group, "exceptions", None)
    if nested is None:
        return [group]
    return [leaf for e in nested for leaf in _leaves(e)]


def run(plan: Plan, urls: dict[str, str], exited: Exited | None = None) -> Results:
    """Run the plan against the served functions (name -> base URL); ``exited`` says why a
    function's server is gone, when it is."""
    trajectories = [Trajectory(s, k) for s in plan.samples for k in range(plan.rollouts)]
    started_at, started = time.time(), time.monotonic()
    with _Progress(plan) as progress:
        runner = _Runner(plan, urls, progress, exited)
        anyio.run(runner.run, trajectories)
    elapsed = time.monotonic() - started
    return Results(trajectories, runner.calls, runner.stopped, elapsed, started_at)
