"""The reward protocols of open-source RL trainers, served next to ``/api/v1``.

Each adapter maps a trainer's request to the function's ``RewardInput``, runs it through
the app's own admission, slots, deadline, isolation and tracing (``FunctionApp.admit`` and
``FunctionApp.run_admitted``), and answers in the trainer's shape:

- OpenRLHF (``--reward.remote_url``): ``POST {prefix}/openrlhf/get_reward``,
  ``{"query": [...], "prompts": [...], "labels": [...]}`` in (one sample, or a batch whose
  samples run concurrently), ``{"rewards": [...], "scores": [...], "extra_logs": {...}}`` out.
- slime (``--rm-type remote_rm``): ``POST {prefix}/slime/reward``,
  ``{"prompt", "response", "label"}`` in; a bare float out, or with ``?reward_key=NAME`` in
  the URL a dict ``{NAME: reward, <metrics>..., "failed": bool}`` for slime's ``--reward-key``.
- NeMo Gym resources server: ``POST {prefix}/nemo-gym/seed_session`` and
  ``POST {prefix}/nemo-gym/verify``; verify answers the row it got with ``reward`` and
  ``reward_components`` added.

The trainers retry a failed call a few times and then crash a run of days, so by default a
processor that raises or passes its deadline answers reward 0.0 with HTTP 200 and a mark
(``extra_logs["reward_failed"]``, ``failed``, ``reward_components["reward_failed"]``,
Gym's ``failure_reason``); it is logged and counted in ``/metrics``. ``--trainer-errors
error`` answers 500/504 instead. A full queue is still a 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from prometheus_client import Counter
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime import errors
from runtime.app import _ClientGone
from runtime.function import ProcessorFailure, RequestError

if TYPE_CHECKING:
    from runtime.app import FunctionApp

__all__ = ["PROTOCOL_PATHS", "TrainerRoutes"]

log = logging.getLogger("runtime.requests")

# protocol -> its paths under --trainer-prefix
PROTOCOL_PATHS = {
    "openrlhf": ("/openrlhf/get_reward",),
    "slime": ("/slime/reward",),
    "nemo-gym": ("/nemo-gym/seed_session", "/nemo-gym/verify"),
}
FAILED_MARK = "reward_failed"
_RETRY_AFTER = {"Retry-After": "1"}


@dataclass
class Scored:
    """One sample's outcome, failed or not, ready for any trainer's shape."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    code: str = ""  # error code when failed
    message: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.code)


class _Reject(Exception):
    """Answer this error response instead (bad request, overload, --trainer-errors error)."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.response = Response(
            errors.error_body(code, message, detail),
            status,
            headers=_RETRY_AFTER if status == 503 else None,
            media_type="application/json",
        )
        self.status = status


class TrainerRoutes:
    def __init__(self, app: FunctionApp) -> None:
        self.app = app
        settings = app.settings
        self._fail_open = settings.trainer_errors == "reward"
        self._deadline = min(settings.timeout, settings.trainer_timeout)
        self._ground_truth_field = settings.ground_truth_field
        self._is_reward = app.function.func_type.value == "reward"
        # Metric names seen so far: a failed sample reports them as 0.0, so every answer
        # has the same keys (OpenRLHF and verl stack them across samples).
        self._metric_names: dict[str, None] = {}
        owned = None if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else app.metrics.registry
        self._requests = Counter(
            "rl_function_trainer_requests",
            "Requests on the trainer protocols by protocol and status code.",
            ["protocol", "status"],
            registry=owned,
        )
        self._failures = Counter(
            "rl_function_trainer_reward_failures",
            "Samples of the trainer protocols whose processor failed or passed its deadline "
            "(answered reward 0.0 and marked, or an error with --trainer-errors error).",
            ["protocol", "error_code"],
            registry=owned,
        )
        prefix = settings.trainer_prefix
        self.routes = [
            Route(prefix + "/openrlhf/get_reward", self._openrlhf, methods=["POST"]),
            Route(prefix + "/slime/reward", self._slime, methods=["POST"]),
            Route(prefix + "/nemo-gym/seed_session", self._gym_seed, methods=["POST"]),
            Route(prefix + "/nemo-gym/verify", self._gym_verify, methods=["POST"]),
        ]

    # --- the protocols -------------------------------------------------------------

    async def _openrlhf(self, request: Request) -> Response:
        async def handle(body: Any, admitted: int) -> Any:
            queries = body.get("query")
            if isinstance(queries, str):  # a hand-written single request
                queries = [queries]
            if not isinstance(queries, list) or not queries:
                raise _Reject(422, errors.INVALID_INPUT, "query must be a non-empty list")
            prompts = _column(body, "prompts", len(queries))
            labels = _column(body, "labels", len(queries))
            inputs = []
            for query, prompt, label in zip(queries, prompts, labels, strict=True):
                if not isinstance(query, str) or not isinstance(prompt, (str, type(None))):
                    raise _Reject(422, errors.INVALID_INPUT, "query and prompts hold strings")
                messages = [*_prompt_messages(prompt), _assistant(_strip_prompt(query, prompt))]
                extra = {"trainer": "openrlhf", "query": query}
                inputs.append(self._input(messages, label, extra))
            scored = await self._score(request, "openrlhf", inputs, admitted)
            names = self._names(scored)
            return {
                "rewards": [s.reward for s in scored],
                "scores": [s.metrics.get("score", s.reward) for s in scored],
                "extra_logs": {
                    **{name: [s.metrics.get(name, 0.0) for s in scored] for name in names},
                    FAILED_MARK: [1.0 if s.failed else 0.0 for s in scored],
                },
            }

        return await self._serve(request, "openrlhf", handle)

    async def _slime(self, request: Request) -> Response:
        reward_key = request.query_params.get("reward_key")

        async def handle(body: Any, admitted: int) -> Any:
            prompt, response = body.get("prompt"), body.get("response")
            if not isinstance(response, str):
                raise _Reject(422, errors.INVALID_INPUT, "response must be a string")
            if not isinstance(prompt, (str, list, type(None))):
                raise _Reject(422, errors.INVALID_INPUT, "prompt must be a string or messages")
            messages = [*_prompt_messages(prompt), _assistant(response)]
            extra = {"trainer": "slime"}
            (scored,) = await self._score(
                request, "slime", [self._input(messages, body.get("label"), extra)], admitted
            )
            if not reward_key:
                return scored.reward  # slime without --reward-key reads a number
            metrics = {name: scored.metrics.get(name, 0.0) for name in self._names([scored])}
            return {**metrics, reward_key: scored.reward, "failed": scored.failed}

        return await self._serve(request, "slime", handle)

    async def _gym_seed(self, request: Request) -> Response:
        # Sessions carry no state here: a reward function scores what /verify sends.
        async def handle(body: Any, admitted: int) -> Any:
            return {}

        return await self._serve(request, "nemo-gym", handle, score=False)

    async def _gym_verify(self, request: Request) -> Response:
        async def handle(body: Any, admitted: int) -> Any:
            params, response = body.get("responses_create_params"), body.get("response")
            if not isinstance(params, dict) or not isinstance(response, dict):
                raise _Reject(
                    422,
                    errors.INVALID_INPUT,
                    "responses_create_params and response must be objects",
                )
            messages = _responses_input(params.get("input")) + _responses_output(
                response.get("output")
            )
            columns = {
                k: v for k, v in body.items() if k not in ("responses_create_params", "response")
            }
            extra = {"trainer": "nemo-gym", "tools": params.get("tools"), "row": columns}
            ground_truth = body.get(self._ground_truth_field)
            (scored,) = await self._score(
                request, "nemo-gym", [self._input(messages, ground_truth, extra)], admitted
            )
            components = {name: scored.metrics.get(name, 0.0) for name in self._names([scored])}
            answer = {**body, "reward": scored.reward}
            answer["reward_components"] = {
                **components,
                FAILED_MARK: 1.0 if scored.failed else 0.0,
            }
            if scored.failed:
                answer["failure_reason"] = f"{scored.code}: {scored.message}"
            return answer

        return await self._serve(request, "nemo-gym", handle)

    # --- shared machinery ----------------------------------------------------------

    async def _serve(
        self, request: Request, protocol: str, handle: Any, score: bool = True
    ) -> Response:
        started = perf_counter()
        status, admitted = 200, 0
        try:
            if score and not self._is_reward:
                raise _Reject(
                    404,
                    errors.NOT_FOUND,
                    f"the trainer protocols serve reward processors; this function is a "
                    f"{self.app.function.func_type.value}",
                )
            refusal = self.app.admit()
            if refusal is not None:
                if refusal[0] == errors.OVERLOADED:
                    self.app.metrics.rejected.inc()
                raise _Reject(503, *refusal)
            admitted = 1
            try:
                raw = await self.app._read_body(request.scope, request.receive)
            except RequestError as exc:
                raise _Reject(exc.status, exc.code, str(exc)) from None
            body = _parse(raw)
            answer = await handle(body, admitted)
            return Response(orjson.dumps(answer), 200, media_type="application/json")
        except _Reject as exc:
            status = exc.status
            return exc.response
        except _ClientGone:
            status = 499
            return Response(b"", 499)
        except Exception:  # a bug of ours: still a JSON answer, never a traceback
            status = 500
            logging.getLogger("runtime").exception("internal error on %s", request.url.path)
            body = errors.error_body(errors.INTERNAL_ERROR, "internal error of the runtime")
            return Response(body, 500, media_type="application/json")
        finally:
            if admitted:
                self.app.admission.leave()
            self._requests.labels(protocol, str(status)).inc()
            elapsed = perf_counter() - started
            if status != 200 and status != 499:
                log.warning("POST %s %d %.1fms", request.url.path, status, elapsed * 1000)

    def _input(self, messages: list[dict[str, Any]], ground_truth: Any, extra: dict) -> Any:
        data = {
            "func_type": "reward",
            "ground_truth": ground_truth,
            "agent_output": {"messages": messages, "rollout_extra": extra},
        }
        try:
            return self.app.function.input_model.model_validate(data)
        except ValidationError as exc:
            raise _Reject(
                422, errors.INVALID_INPUT, f"cannot build the reward input: {exc}"
            ) from None

    async def _score(
        self, request: Request, protocol: str, inputs: list[Any], admitted: int
    ) -> list[Scored]:
        """Run every input through its own admission and slot, concurrently, in the deadline."""
        more = len(inputs) - admitted
        if more > 0:
            refusal = self.app.admit(more)
            if refusal is not None:
                if refusal[0] == errors.OVERLOADED:
                    self.app.metrics.rejected.inc()
                raise _Reject(503, *refusal)
        try:
            results: list[Scored] = [Scored(0.0)] * len(inputs)
            deadline = anyio.current_time() + self._deadline

            async def one(index: int) -> None:
                results[index] = await self._one(request.scope, inputs[index], deadline)

            async with anyio.create_task_group() as group:
                for index in range(len(inputs)):
                    group.start_soon(one, index)
        finally:
            for _ in range(max(more, 0)):
                self.app.admission.leave()
        for scored in results:
            if scored.failed:
                self._failed(request, protocol, scored)
        return results

    async def _one(self, scope: dict[str, Any], input_data: Any, deadline: float) -> Scored:
        function = self.app.function
        try:
            with anyio.fail_after(deadline - anyio.current_time()):
                result = await self.app.run_admitted(scope, input_data)
            output = (
                result if isinstance(result, function.output_model) else function._coerce(result)
            )
        except TimeoutError:
            return Scored(
                0.0,
                code=errors.DEADLINE_EXCEEDED,
                message=f"the reward did not finish within its {self._deadline:g}s deadline "
                "(--trainer-timeout, --timeout)",
            )
        except ProcessorFailure as exc:
            return Scored(0.0, code=exc.code, message=str(exc))
        reward = output.reward
        score = float(reward.reward_score)
        if not math.isfinite(score):
            return Scored(0.0, code=errors.INVALID_OUTPUT, message=f"reward_score is {score}")
        metrics = {k: float(v) for k, v in (reward.reward_metrics or {}).items()}
        for name in metrics:
            self._metric_names.setdefault(name, None)
        status = getattr(output.status, "value", output.status)
        if status == "failed":  # the processor said so itself: keep its score, mark it
            code = str(output.error_code or errors.PROCESSOR_ERROR)
            return Scored(score, metrics, code, str(output.error or "the processor failed"))
        return Scored(score, metrics)

    def _failed(self, request: Request, protocol: str, scored: Scored) -> None:
        self._failures.labels(protocol, scored.code).inc()
        message = scored.message if len(scored.message) <= 500 else scored.message[:500] + "..."
        if not self._fail_open:
            log.error("POST %s %s: %s", request.url.path, scored.code, message)
            status = 504 if scored.code == errors.DEADLINE_EXCEEDED else 500
            raise _Reject(status, scored.code, scored.message)
        log.warning(
            "POST %s reward failed, answered %g and marked it: %s: %s",
            request.url.path,
            scored.reward,
            scored.code,
            message,
        )

    def _names(self, scored: list[Scored]) -> list[str]:
        names = dict(self._metric_names)
        for s in scored:
            names.update(dict.fromkeys(s.metrics))
        names.pop(FAILED_MARK, None)
        return list(names)


# --- mapping helpers -------------------------------------------------------------------


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise _Reject(400, errors.INVALID_JSON, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _Reject(400, errors.NOT_AN_OBJECT, "request body must be a JSON object")
    return body


def _column(body: dict[str, Any], name: str, length: int) -> list[Any]:
    values = body.get(name)
    if values is None:  # OpenRLHF before 0.5 sent the query alone
        return [None] * length
    if not isinstance(values, list) or len(values) != length:
        raise _Reject(422, errors.INVALID_INPUT, f"{name} must be a list as long as query")
    return values


def _strip_prompt(query: str, prompt: str | None) -> str:
    """The response: the templated query minus its prompt (special tokens are kept)."""
    if not prompt:
        return query
    if query.startswith(prompt):
        return query[len(prompt) :]
    at = query.find(prompt)  # a BOS token or a system preamble before the prompt
    return query[at + len(prompt) :] if at >= 0 else query


def _prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    if prompt is None or prompt == "":
        return []
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in prompt]


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def _text(content: Any) -> Any:
    """Responses API content parts (input_text, output_text...) joined into one string."""
    if isinstance(content, list):
        parts = [p.get("text") or p.get("refusal") or "" for p in content if isinstance(p, dict)]
        return "".join(parts)
    return content


def _responses_input(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items or ():
        if isinstance(item, dict):
            messages.extend(_responses_item(item))
    return messages


def _responses_output(items: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for item in items or ():
        if isinstance(item, dict):
            messages.extend(_responses_item(item))
    return messages


def _responses_item(item: dict[str, Any]) -> list[dict[str, Any]]:
    """One Responses API item as chat messages; reasoning items are left out."""
    kind = item.get("type", "message")
    if kind == "message":
        return [{"role": item.get("role", "assistant"), "content": _text(item.get("content"))}]
    if kind == "function_call":
        call = {
            "id": item.get("call_id") or item.get("id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments")},
        }
        return [{"role": "assistant", "content": None, "tool_calls": [call]}]
    if kind == "function_call_output":
        return [
            {"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")}
        ]
    return []
