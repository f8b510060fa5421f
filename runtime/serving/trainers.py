"""The reward protocols of open-source RL trainers, served next to ``/api/v1``.

Each adapter maps a trainer's request to the function's ``RewardInput``, runs it through
the app's own admission, slots, deadline, isolation and tracing (``TrainerHost``, the
few things of the app they use: ``admit``, ``read_body``, ``hold_parsed`` and its
``runner``), and answers in the trainer's shape. ``server.build_app`` mounts the routes
on the app; the app never imports this module:

- OpenRLHF (``--reward.remote_url``): ``POST {prefix}/openrlhf/get_reward``,
  ``{"query": [...], "prompts": [...], "labels": [...]}`` in (one sample, or a batch of at
  most ``--trainer-max-samples`` whose samples run concurrently), ``{"rewards": [...],
  "scores": [...], "extra_logs": {...}}`` out.
- slime (``--rm-type remote_rm``): ``POST {prefix}/slime/reward``,
  ``{"prompt", "response", "label"}`` in; a bare float out, or with ``?reward_key=NAME`` in
  the URL a dict ``{NAME: reward, <metrics>..., "reward_failed": bool}`` for slime's
  ``--reward-key``.
- NeMo Gym resources server (Gym 0.7's ``SimpleResourcesServer`` contract): at the root,
  where Gym's client posts, also as ``/ng-rollout/<rollout id>/...`` (Gym's observability
  path form) and ``{prefix}/nemo-gym/...``: ``POST /seed_session`` (an Environment
  Server's ``resources_session_id`` echoed, ``{}`` for an agent's legacy seed; a session
  cookie set either way), ``POST /verify`` (the row it got with ``reward``,
  ``reward_components``, ``mask_sample`` and ``failure_kind`` added), ``POST
  /close_session``, ``POST /aggregate_metrics`` (``runtime.serving.gym_metrics``) and
  ``GET /reverify_mode`` (``stateless``). Sessions carry no state here: a reward function
  scores what /verify sends, so any worker serves any session.

The trainers retry a failed call a few times and then crash a run of days, so by default a
processor that raises or passes its deadline answers reward 0.0 with HTTP 200 and a mark
(``extra_logs["reward_failed"]``, slime's ``reward_failed``, Gym's ``reward_components``,
Gym's ``failure_reason``, and Gym's ``mask_sample`` with a ``failure_kind``: the sample is
left out of training and of the metrics, not trained on as a 0); it is logged and counted
in ``/metrics``. A failed sample is 0.0 in every field a trainer reads as a score
(OpenRLHF's ``scores`` and a ``score`` metric too). ``--trainer-errors error`` answers
500/504 instead. A full queue is still a 503 with ``Retry-After``.

Every answer carries every metric name known so far, 0.0 where a sample has none: the
trainers stack metrics by key. The processor's ``metric_names`` and a decorated
reward's sub-rewards are known before the first request (and listed on ``/health``), so a
worker whose first sample fails answers them too.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import re
import uuid
from array import array
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Annotated, Any, Literal, Protocol, TypeVar, cast

import anyio
import anyio.to_thread
import orjson
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from processors_base.models import RewardOutput
from processors_base.processors import declared_metrics
from processors_base.rewards import RENORMALIZED, registry_of
from runtime import errors
from runtime.config import Settings
from runtime.execution.function import Function, ProcessorFailure, RequestError, invalid_input
from runtime.execution.loading import TargetError
from runtime.logs import RequestLog, bind_request, unbind_request
from runtime.serving.admission import PARSE_COSTS, Admission
from runtime.serving.body import ClientGone
from runtime.serving.deadlines import Reason
from runtime.serving.gym_metrics import GymMetricsError, aggregate_metrics
from runtime.serving.health import Health
from runtime.serving.metrics import Metrics, code_label
from runtime.serving.running import Runner, Running

__all__ = ["PROTOCOL_PATHS", "TrainerHost", "TrainerRoutes"]

log = logging.getLogger("runtime.requests")

# protocol -> its paths under --trainer-prefix
PROTOCOL_PATHS = {
    "openrlhf": ("/openrlhf/get_reward",),
    "slime": ("/slime/reward",),
    "nemo-gym": (
        "/nemo-gym/seed_session",
        "/nemo-gym/verify",
        "/nemo-gym/close_session",
        "/nemo-gym/aggregate_metrics",
        "/nemo-gym/reverify_mode",  # GET
    ),
}
FAILED_MARK = "reward_failed"
SCORE_METRIC = "score"  # OpenRLHF's ``scores`` when given; 0.0 on a failed sample, as the reward
MISMATCH_MARK = "prompt_mismatch"  # OpenRLHF: the prompt was not found in the query
_RESERVED = frozenset((FAILED_MARK, MISMATCH_MARK))  # never taken from a processor's metrics
_UNDECLARED_LOGGED = 100  # undeclared names logged at most, per process
_START_MARGIN = 0.01  # seconds: a sample with less of the deadline left is not started
# A larger OpenRLHF batch, or a larger body on any route, is built and validated in a
# thread, off the event loop (a 10 MiB body: seconds of work, as one sample too)
_INLINE_SAMPLES = 32
_INLINE_BYTES = 64 * 1024
_RETRY_AFTER = {"Retry-After": "1"}
# what a body parsed and mapped costs (runtime.serving.admission.PARSE_COSTS), by protocol; "plain"
# for one that is parsed only (OpenRLHF's samples are held by _hold_samples)
_PARSE_COSTS = {**PARSE_COSTS, "openrlhf": PARSE_COSTS["plain"]}
_T = TypeVar("_T")
_CLOSE = {"Connection": "close"}
# NeMo Gym: the session cookie its Environment Server requires of a seed (it sends it back
# on /verify and /close_session); an opaque handle, as Gym's own servers set one
GYM_SESSION_COOKIE = "nemo_gym_resources_session"
# Gym's failure vocabulary (nemo_gym/failure_kinds.py): a processor's error_code that names
# one (or an environment's own "<server>:<kind>") is the answer's failure_kind as it is
GYM_FAILURE_KINDS = frozenset(
    [
        "transport_unreachable",
        "transport_peer_drop",
        "transport_timeout",
        "transport_local_resource",
        "agent_run_error",
        "agent_request_failed",
        "agent_timeout",
        "agent_command_not_allowed",
        "judge_failed",
        "judge_unparseable",
        "verifier_error",
        "provider_unavailable",
        "provider_quota_exhausted",
        "provider_oom_killed",
        "session_lost",
        "session_expired",
        "session_release_failed",
        "cancelled",
        "kill_shaped",
        "shutdown",
        "persistence_failed",
        "cohort_incomplete",
    ]
)
_GYM_KIND = re.compile(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")
# Gym's /ng-rollout/<id>/... path form: the id's characters (nemo_gym/rollout_correlation.py)
_ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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
        self.code = code
        headers = _RETRY_AFTER if status == 503 else None
        if status in (408, 413):  # as /api/v1: the body is left unread, so is the connection
            headers = _CLOSE
        self.response = Response(
            errors.error_body(code, message, detail),
            status,
            headers=headers,
            media_type="application/json",
        )
        self.status = status

    @classmethod
    def of(cls, error: RequestError) -> _Reject:
        return cls(error.status, error.code, str(error), error.detail)


class TrainerHost(Protocol):
    """What the trainer routes use of the app (``app.FunctionApp``)."""

    function: Function
    settings: Settings
    admission: Admission
    metrics: Metrics
    request_log: RequestLog
    runner: Runner  # runs a sample under its deadline; answers it late, counts it stuck

    @property
    def state(self) -> Health: ...

    def admit(self, count: int = 1) -> tuple[str, str] | None:
        """Admit ``count`` requests, all or none: None, or the (code, message) of a 503."""

    async def read_body(self, scope: MutableMapping[str, Any], receive: Any) -> bytes:
        """The body, within the limits and held in the budget (the caller releases it)."""

    def hold_parsed(self, body: bytes, costs: tuple[int, int, int], floor: int = 0) -> int:
        """Hold what ``body`` will take once parsed; the bytes held (RequestError: no)."""

    def add_health_fields(self, **fields: Any) -> None:
        """Say ``fields`` on /health too."""


class TrainerRoutes:
    def __init__(self, app: TrainerHost) -> None:
        self.app = app
        settings = app.settings
        self._fail_open = settings.trainer_errors == "reward"
        self._deadline = min(settings.timeout, settings.trainer_timeout)
        self._ground_truth_field = settings.ground_truth_field
        self._end_tokens = tuple(t for t in settings.trainer_end_tokens.split(",") if t)
        self._max_samples = settings.trainer_max_samples
        self._sample_bytes = settings.max_body // settings.trainer_max_samples
        # one large batch validated at a time: more threads would only share the GIL, and
        # take more of it from the event loop
        self._validation = anyio.CapacityLimiter(1)
        self._is_reward = app.function.func_type.value == "reward"
        # Metric names: a sample reports every name known so far (0.0 where it has none), so
        # the answers keep one key set (OpenRLHF and verl stack them across samples). The
        # processor's ``metric_names`` and a decorated reward's sub-rewards (and their ".failed")
        # are known up front, listed on /health for the in-process client (TargetError:
        # a malformed declaration, a reserved name).
        declared, explicit = _declared_metrics(app)
        self._metric_names: dict[str, None] = dict.fromkeys(declared)
        if declared:
            app.add_health_fields(metrics=declared)
        # names reported but not declared are logged once each, when any were declared
        self._declared = frozenset(declared) if explicit else None
        self._undeclared_logged: set[str] = set()
        self._mismatch_logged = False
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
        self._mismatches = Counter(
            "rl_function_trainer_prompt_mismatches",
            "OpenRLHF samples whose prompt was not found in the query (scored as the whole "
            "query, marked prompt_mismatch).",
            registry=owned,
        )
        prefix = settings.trainer_prefix
        self.routes = [
            Route(prefix + "/openrlhf/get_reward", self._openrlhf, methods=["POST"]),
            Route(prefix + "/slime/reward", self._slime, methods=["POST"]),
        ]
        gym = {
            "/seed_session": (self._gym_seed, "POST"),
            "/verify": (self._gym_verify, "POST"),
            "/close_session": (self._gym_close, "POST"),
            "/aggregate_metrics": (self._gym_aggregate, "POST"),
            "/reverify_mode": (self._gym_reverify_mode, "GET"),
        }
        # NeMo Gym's client posts to http://HOST:PORT/verify: no prefix can be configured;
        # with observability on, to /ng-rollout/<id>/verify (the id names the rollout)
        for path, (endpoint, method) in gym.items():
            self.routes += [
                Route(prefix + "/nemo-gym" + path, endpoint, methods=[method]),
                Route(path, endpoint, methods=[method]),
                Route("/ng-rollout/{rollout_id}" + path, endpoint, methods=[method]),
            ]

    # --- the protocols -------------------------------------------------------------

    async def _openrlhf(self, request: Request) -> Response:
        async def handle(body: Any) -> Any:
            queries = body.get("query")
            if isinstance(queries, str):  # a hand-written single request
                queries = [queries]
            if not isinstance(queries, list) or not queries:
                raise _Reject(422, errors.INVALID_INPUT, "query must be a non-empty list")
            prompts = _column(body, "prompts", len(queries))
            labels = _column(body, "labels", len(queries))

            def build() -> tuple[list[Any], list[float]]:
                inputs, mismatched = [], []
                for query, prompt, label in zip(queries, prompts, labels, strict=True):
                    if not isinstance(query, str) or not isinstance(prompt, (str, type(None))):
                        raise _Reject(422, errors.INVALID_INPUT, "query and prompts hold strings")
                    response, found = _split_query(query, prompt)
                    if not found:
                        self._prompt_mismatch(request)
                    response = _strip_end_tokens(response, self._end_tokens)
                    messages = [*_prompt_messages(prompt), _assistant(response)]
                    extra = {"trainer": "openrlhf", "query": query}
                    inputs.append(self._input(messages, label, extra))
                    mismatched.append(0.0 if found else 1.0)
                return inputs, mismatched

            inputs, mismatched = await self._build(request, build, len(queries))
            scored = await self._score(request, "openrlhf", inputs)
            names = self._names(scored)
            return {
                "rewards": [s.reward for s in scored],
                "scores": [s.metrics.get(SCORE_METRIC, s.reward) for s in scored],
                "extra_logs": {
                    **{name: [s.metrics.get(name, 0.0) for s in scored] for name in names},
                    FAILED_MARK: [1.0 if s.failed else 0.0 for s in scored],
                    MISMATCH_MARK: mismatched,
                },
            }

        return await self._serve(request, "openrlhf", handle, samples=_batch_size)

    async def _slime(self, request: Request) -> Response:
        reward_key = request.query_params.get("reward_key")

        async def handle(body: Any) -> Any:
            if reward_key == FAILED_MARK:
                raise _Reject(
                    422,
                    errors.INVALID_INPUT,
                    f"reward_key {FAILED_MARK!r} is reserved (the failure flag); name the "
                    "reward otherwise",
                )
            prompt, response = body.get("prompt"), body.get("response")
            if not isinstance(response, str):
                raise _Reject(422, errors.INVALID_INPUT, "response must be a string")
            if not isinstance(prompt, (str, list, type(None))):
                raise _Reject(422, errors.INVALID_INPUT, "prompt must be a string or messages")

            def build() -> Any:
                messages = [*_prompt_messages(prompt), _assistant(response)]
                return self._input(messages, body.get("label"), {"trainer": "slime"})

            (scored,) = await self._score(request, "slime", [await self._build(request, build)])
            if not reward_key:
                return scored.reward  # slime without --reward-key reads a number
            metrics = {name: scored.metrics.get(name, 0.0) for name in self._names([scored])}
            return {**metrics, reward_key: scored.reward, FAILED_MARK: scored.failed}

        return await self._serve(request, "slime", handle)

    async def _gym_seed(self, request: Request) -> Response:
        # Sessions carry no state here: a reward function scores what /verify sends. An
        # Environment Server seeds with its resources_session_id and wants it back, and a
        # session cookie; an agent's legacy seed gets {} (and the cookie too).
        _rollout_path(request)

        async def handle(body: Any) -> Any:
            answer = {}
            if "resources_session_id" in body:
                answer = {"resources_session_id": _session_id(body)}
                if not isinstance(body.get("task_data", {}), dict):
                    raise _Reject(422, errors.INVALID_INPUT, "task_data must be an object")
            response = Response(orjson.dumps(answer), 200, media_type="application/json")
            response.set_cookie(GYM_SESSION_COOKIE, uuid.uuid4().hex, httponly=True)
            return response

        return await self._serve(request, "nemo-gym", handle, score=False)

    async def _gym_close(self, request: Request) -> Response:
        _rollout_path(request)

        async def handle(body: Any) -> Any:
            return {"resources_session_id": _session_id(body)}  # nothing held: closed

        return await self._serve(request, "nemo-gym", handle, score=False)

    async def _gym_aggregate(self, request: Request) -> Response:
        _rollout_path(request)

        async def handle(body: Any) -> Any:
            responses = body.get("verify_responses")
            if not isinstance(responses, list) or not all(isinstance(r, dict) for r in responses):
                raise _Reject(
                    422, errors.INVALID_INPUT, "verify_responses must be a list of objects"
                )

            def compute() -> dict[str, Any]:
                try:
                    return aggregate_metrics(responses)
                except GymMetricsError as exc:
                    raise _Reject(422, errors.INVALID_INPUT, str(exc)) from None

            return await self._build(request, compute, len(responses))

        return await self._serve(request, "nemo-gym", handle, score=False)

    async def _gym_reverify_mode(self, request: Request) -> Response:
        # a verify scores the request alone, so a stored rollout can be verified again
        _rollout_path(request)

        async def handle(body: Any) -> Any:
            return "stateless"

        return await self._serve(request, "nemo-gym", handle, score=False)

    async def _gym_verify(self, request: Request) -> Response:
        _rollout_path(request)

        async def handle(body: Any) -> Any:
            def build() -> Any:
                try:  # the answer echoes the row: one JSON cannot write is refused now
                    orjson.dumps(body)
                except orjson.JSONEncodeError as exc:  # read 1024 levels deep, written 254
                    raise _Reject(
                        422, errors.INVALID_INPUT, f"the row is nested too deeply to echo: {exc}"
                    ) from None
                try:
                    row = _GymRow.model_validate(body)
                except ValidationError as exc:
                    raise _Reject.of(invalid_input("not a NeMo Gym verify request", exc)) from None
                params = row.responses_create_params
                messages = _messages_of(params.input) + _messages_of(row.response.output)
                columns = {
                    k: v
                    for k, v in body.items()
                    if k not in ("responses_create_params", "response")
                }
                extra = {"trainer": "nemo-gym", "tools": params.tools, "row": columns}
                del row, params  # its validated items, before the input copies the messages
                return self._input(messages, body.get(self._ground_truth_field), extra)

            (scored,) = await self._score(request, "nemo-gym", [await self._build(request, build)])
            components = {name: scored.metrics.get(name, 0.0) for name in self._names([scored])}
            answer = {**body, "reward": scored.reward}
            answer["reward_components"] = {
                **components,
                FAILED_MARK: 1.0 if scored.failed else 0.0,
            }
            # Gym's BaseVerifyResponse: a failed verifier is no measurement of the policy, so
            # the sample is masked (left out of training and metrics), its kind named
            answer["mask_sample"] = scored.failed
            answer["failure_kind"] = _gym_failure_kind(scored.code) if scored.failed else None
            answer["failure_reason"] = None
            if scored.failed:  # user code's text: a lone surrogate must not break the answer
                answer["failure_reason"] = errors.safe_text(f"{scored.code}: {scored.message}")
                config = body.get("instance_config")  # where NeMo RL before 0.7 reads it
                answer["instance_config"] = {
                    **(config if isinstance(config, dict) else {}),
                    "mask_sample": True,
                }
            return answer

        return await self._serve(request, "nemo-gym", handle)

    # --- shared machinery ----------------------------------------------------------

    async def _serve(
        self,
        request: Request,
        protocol: str,
        handle: Any,
        score: bool = True,
        samples: Callable[[dict[str, Any]], int] | None = None,  # of a batch protocol
    ) -> Response:
        started = perf_counter()
        status, held = 200, 0
        code = message = ""  # of an error answer
        app = self.app
        bound = bind_request(request)  # every line about it carries its ids
        try:
            if score and not self._is_reward:
                raise _Reject(
                    404,
                    errors.NOT_FOUND,
                    f"the trainer protocols serve reward processors; this function is a "
                    f"{app.function.func_type.value}",
                )
            # as /api/v1: not ready, draining or full is answered before reading a body
            refusal = app.admit()
            if refusal is not None:
                if refusal[0] == errors.OVERLOADED:
                    app.metrics.rejected.inc()
                raise _Reject(503, *refusal)
            app.admission.leave()  # each sample takes its place once the body is in
            try:  # within --body-timeout, --max-body and --max-buffered, as /api/v1
                raw = await app.read_body(request.scope, request.receive)
            except RequestError as exc:
                raise _Reject.of(exc) from None
            held = len(raw)  # held in the body budget until the answer is out
            request.state.body_bytes = held
            try:  # and what its parse is estimated to take (what the adapter copies too)
                held += app.hold_parsed(raw, _PARSE_COSTS[protocol if score else "plain"])
            except RequestError as exc:
                raise _Reject.of(exc) from None
            body = _parse(raw)
            if samples is not None:
                held += self._hold_samples(samples(body), held)
            answer = await handle(body)
            if isinstance(answer, Response):
                return answer
            return Response(orjson.dumps(answer), 200, media_type="application/json")
        except _Reject as exc:
            status, code, message = exc.status, exc.code, str(exc)
            return exc.response
        except ClientGone:
            status, code, message = 499, errors.CLIENT_DISCONNECTED, "client disconnected"
            return Response(b"", 499)
        except Exception:  # a bug of ours: still a JSON answer, never a traceback
            status, code, message = 500, errors.INTERNAL_ERROR, "internal error"
            logging.getLogger("runtime").exception("internal error on %s", request.url.path)
            error = errors.error_body(errors.INTERNAL_ERROR, "internal error of the runtime")
            return Response(error, 500, media_type="application/json")
        finally:
            app.admission.release_body(held)
            self._requests.labels(protocol, str(status)).inc()
            scored: list[Scored] = getattr(request.state, "scored", [])
            if not scored and status != 200:  # refused whole: one failed result
                app.metrics.result(protocol, code)
            failed = [s for s in scored if s.failed] if status == 200 else []
            if failed:
                code = ",".join(sorted({s.code for s in failed}))
                message = f"{len(failed)} of {len(scored)} samples failed"
            elapsed = perf_counter() - started
            app.request_log.answered(request.scope, status, elapsed, code, message)
            unbind_request(bound)

    async def _build(self, request: Request, build: Callable[[], _T], samples: int = 1) -> _T:
        """``build()``: the inputs of a request's samples (mapped and validated, custom
        validators of user code included), in a thread for a batch of more than
        _INLINE_SAMPLES or a body of more than _INLINE_BYTES (seconds of work at 10 MiB,
        for one sample too), one request at a time; else inline."""
        if samples <= _INLINE_SAMPLES and request.state.body_bytes <= _INLINE_BYTES:
            return build()
        return await anyio.to_thread.run_sync(build, limiter=self._validation)

    def _input(self, messages: list[dict[str, Any]], ground_truth: Any, extra: dict) -> Any:
        data = {
            "func_type": "reward",
            "ground_truth": ground_truth,
            "agent_output": {"messages": messages, "rollout_extra": extra},
        }
        try:
            return self.app.function.input_model.model_validate(data)
        except ValidationError as exc:
            raise _Reject.of(invalid_input("cannot build the reward input", exc)) from None

    def _hold_samples(self, count: int, held: int) -> int:
        """Refuse a batch of more than --trainer-max-samples (413) before any sample is
        built, and hold in the body budget what its samples weigh beyond its body (a batch
        at the limit weighs one --max-body), so that --max-buffered bounds the samples a
        worker holds as it bounds bodies. The bytes held besides the body."""
        if count > self._max_samples:
            raise _Reject(
                413,
                errors.BODY_TOO_LARGE,
                f"the batch holds {count} samples; at most {self._max_samples} "
                "(--trainer-max-samples, TRAINER_MAX_SAMPLES)",
            )
        extra = max(0, count * self._sample_bytes - held)
        if not self.app.admission.hold_body(extra):
            raise _Reject(
                503,
                errors.OVERLOADED,
                f"this worker already holds {self.app.admission.buffered} bytes of request "
                "bodies and samples (--max-buffered); retry later",
            )
        return extra

    async def _score(self, request: Request, protocol: str, inputs: list[Any]) -> list[Scored]:
        """Score every input, concurrently, within one deadline.

        Each sample takes a place in the queue, as a /api/v1 request would. A batch larger
        than the free places runs in chunks: a sample that ends hands its place to the next
        one. The deadline is /api/v1's machinery (``runtime.serving.running``): at the
        deadline a sample is answered at once, whatever its task does, and cancelled again
        until it ends; one that will not end is counted as stuck and gives its place back.
        """
        app = self.app
        refusal = app.admit()
        if refusal is not None:
            if refusal[0] == errors.OVERLOADED:
                app.metrics.rejected.inc()
            raise _Reject(503, *refusal)
        places = 1
        while places < len(inputs) and app.admission.try_admit():
            places += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline
        results: list[Scored | None] = [None] * len(inputs)
        waiting = collections.deque(range(len(inputs)))
        running: dict[asyncio.Future[Scored], _Sample] = {}
        # answered samples, in order: a wait on all the running ones would cost each
        # answer O(places) (asyncio.wait adds and removes a callback on every future)
        answers: collections.deque[asyncio.Future[Scored]] = collections.deque()
        answered_one = asyncio.Event()

        def on_answer(answered: asyncio.Future[Scored]) -> None:
            answers.append(answered)
            answered_one.set()

        try:
            while True:
                while places and waiting:
                    index = waiting.popleft()
                    left = deadline - loop.time()
                    if left < _START_MARGIN or app.state != Health.READY:
                        results[index] = self._late(
                            Reason.DEADLINE if left < _START_MARGIN else None
                        )
                        continue
                    places -= 1
                    sample = _Sample()
                    answered: asyncio.Future[Scored] = loop.create_future()
                    sample.task = loop.create_task(
                        self._run(request.scope, inputs[index], left, answered, sample)
                    )
                    sample.index = index
                    running[answered] = sample
                    answered.add_done_callback(on_answer)
                if not running:
                    break
                await answered_one.wait()
                answered_one.clear()
                while answers:
                    answered = answers.popleft()
                    sample = running.pop(answered)
                    results[sample.index] = answered.result()
                    if sample.task.done():
                        places += 1  # the place passes to the next sample
                    else:  # answered late, still ending: its task or the deadline frees it
                        sample.orphaned = True
        except BaseException:  # our request was cancelled: so are its samples
            for sample in running.values():
                if sample.run is None:  # not started: cancelled before it holds anything
                    sample.task.cancel()
                    places += 1
                elif sample.task.done():
                    places += 1
                else:
                    sample.orphaned = True
                    sample.run.fire(Reason.DISCONNECT)
            raise
        finally:
            for _ in range(places):
                app.admission.leave()
        for index in waiting:  # no place came free in time
            results[index] = self._late(Reason.DEADLINE)
        scored = [s if s is not None else self._late(Reason.DEADLINE) for s in results]
        request.state.scored = scored  # its access line tells of them
        for one in scored:
            app.metrics.result(protocol, one.code)
        for index, one in enumerate(scored):
            if one.failed:
                place = f" sample {index} of {len(scored)}" if len(scored) > 1 else ""
                self._failed(request, protocol, one, place)
        return scored

    async def _run(
        self,
        scope: MutableMapping[str, Any],
        input_data: Any,
        timeout: float,
        answered: asyncio.Future[Scored],
        sample: _Sample,
    ) -> None:
        """One sample in its own task, under a deadline as a /api/v1 request is: at the
        deadline (or a stop past --grace) the runner answers ``answered`` at once, whatever
        the task does, and counts the task as stuck if it will not end."""
        app = self.app
        runner = app.runner
        loop = asyncio.get_running_loop()
        run = _SampleRun(runner, loop, asyncio.current_task(loop), scope, perf_counter(), timeout)
        run.answered_late = answered
        run.late_scored = self._late
        run.input_data = input_data
        sample.run = run
        scored = Scored(0.0, code=errors.INTERNAL_ERROR, message="internal error of the runtime")
        try:
            try:
                result, _ = await runner.run_admitted(run, input_data)
                scored = self._scored(result)
            except asyncio.CancelledError:
                if run.reason is None:
                    raise
                run.absorb()
            except ProcessorFailure as exc:
                scored = Scored(0.0, code=exc.code, message=str(exc))
            except Exception:
                logging.getLogger("runtime").exception("internal error while scoring a sample")
            if run.reason is not None:
                scored = self._late(run.reason)
        finally:
            run.end()
            if run.abandoned:  # the runner ended it late and freed its place
                runner.stuck_ended(run)
            elif sample.orphaned:  # the request has moved on: the place is ours to free
                app.admission.leave()
            if not answered.done():
                answered.set_result(scored)

    def _late(self, reason: Reason | None) -> Scored:
        """A sample cancelled: at its deadline, else at a stop (or the request's end)."""
        if reason is Reason.DEADLINE:
            return Scored(
                0.0,
                code=errors.DEADLINE_EXCEEDED,
                message=f"the reward did not finish within its {self._deadline:g}s deadline "
                "(--trainer-timeout, --timeout)",
            )
        return Scored(0.0, code=errors.DRAINING, message="the server is stopping")

    def _scored(self, result: Any) -> Scored:
        """The processor's output as a sample's outcome; /api/v1's output checks apply."""
        # INVALID_OUTPUT as /api/v1 says it; a RewardOutput: these routes serve rewards only
        output = cast(RewardOutput, self.app.function.validated(result))
        try:
            reward = output.reward
            score = _number(reward.reward_score, "reward_score")
            metrics = {  # the names are kept for every later answer: valid UTF-8, always
                errors.safe_text(str(k)): _number(v, f"reward_metrics[{k!r}]")
                for k, v in (reward.reward_metrics or {}).items()
            }
            status = getattr(output.status, "value", output.status)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ProcessorFailure(
                errors.INVALID_OUTPUT, f"output of process() is malformed: {exc}"
            ) from exc
        declared = self._declared
        if declared is not None and not declared.issuperset(metrics):
            self._undeclared(declared, metrics)
        self._metric_names.update(dict.fromkeys(metrics))
        if status == "failed":  # the processor said so itself: failed is 0.0, and marked
            if SCORE_METRIC in metrics:  # OpenRLHF's scores: a failed sample never counts solved
                metrics[SCORE_METRIC] = 0.0
            code = str(output.error_code or errors.PROCESSOR_ERROR)
            return Scored(0.0, metrics, code, str(output.error or "the processor failed"))
        return Scored(score, metrics)

    def _failed(self, request: Request, protocol: str, scored: Scored, place: str) -> None:
        """``place``: which sample of a batch (" sample 2 of 4"), "" for a lone one."""
        self._failures.labels(protocol, code_label(scored.code)).inc()  # OTHER: the function's
        message = scored.message if len(scored.message) <= 500 else scored.message[:500] + "..."
        if not self._fail_open:
            log.error("POST %s%s %s: %s", request.url.path, place, scored.code, message)
            status = 504 if scored.code == errors.DEADLINE_EXCEEDED else 500
            if scored.code == errors.DRAINING:
                status = 503
            raise _Reject(status, scored.code, scored.message)
        log.warning(
            "POST %s%s reward failed, answered %g and marked it: %s: %s",
            request.url.path,
            place,
            scored.reward,
            scored.code,
            message,
        )

    def _prompt_mismatch(self, request: Request) -> None:
        self._mismatches.inc()
        if not self._mismatch_logged:  # once: a template mismatch hits every sample
            self._mismatch_logged = True
            log.warning(
                "POST %s: a prompt is not part of its query (a different chat template, or "
                "special tokens stripped); the whole query is scored as the response, marked "
                "extra_logs[%r] (logged once, counted in "
                "rl_function_trainer_prompt_mismatches_total)",
                request.url.path,
                MISMATCH_MARK,
            )

    def _undeclared(self, declared: frozenset[str], metrics: dict[str, float]) -> None:
        """Log, once per name and process, a metric the processor did not declare: answers
        before its first appearance lacked it (verl's check of one key set then fails)."""
        logged = self._undeclared_logged
        for name in metrics:
            if name in declared or name in logged:
                continue
            if len(logged) >= _UNDECLARED_LOGGED:
                return
            logged.add(name)
            log.warning(
                "%s reported the metric %r, which its metric_names declaration lacks: answers "
                "before it first appeared lacked it; add it to %s.metric_names (logged once%s)",
                self.app.function.target.name,
                name,
                self.app.function.target.name,
                "; further undeclared names are not logged"
                if len(logged) == _UNDECLARED_LOGGED
                else "",
            )

    def _names(self, scored: list[Scored]) -> list[str]:
        names = self._metric_names
        for s in scored:
            names.update(dict.fromkeys(s.metrics))
        return [name for name in names if name not in _RESERVED]


@dataclass(eq=False)
class _Sample:
    """One running sample of a request: its task, its run, who frees its place."""

    index: int = 0
    task: asyncio.Task[None] = None  # type: ignore[assignment]  # set once created
    run: _SampleRun | None = None
    orphaned: bool = False  # answered before its task ended: the task frees its place


class _SampleRun(Running):
    """A sample's run: its late answer is its ``answered`` future's result."""

    __slots__ = ("answered_late", "late_scored")
    answered_late: asyncio.Future[Scored]
    late_scored: Callable[[Reason | None], Scored]

    async def answer_late(self) -> None:
        if not self.answered_late.done():
            self.answered_late.set_result(self.late_scored(self.reason))


def _declared_metrics(app: TrainerHost) -> tuple[list[str], bool]:
    """The metric names known before any request, and whether the processor declared any
    itself: its ``metric_names``, and those a decorated reward (``@sub_reward``, no
    ``@aggregate_func``) reports. TargetError for a malformed or reserved declaration."""
    cls = app.function.target.cls
    try:
        explicit = list(declared_metrics(cls))
    except TypeError as exc:
        raise TargetError(f"{app.function.target.spec}: {exc}") from None
    reserved = sorted(_RESERVED.intersection(explicit))
    if reserved:
        raise TargetError(
            f"{app.function.target.spec}: {cls.__name__}.metric_names declares {reserved[0]!r}, "
            f"which the trainer protocols reserve for their own marks "
            f"({', '.join(sorted(_RESERVED))}); name that metric otherwise"
        )
    names = dict.fromkeys(explicit)
    try:
        registry = registry_of(cls)
    except Exception:  # not one of ours (the SDK's classes): names come as they are seen
        return list(names), bool(explicit)
    if registry.aggregate is None:
        subs = [sub.name for sub in registry.sub_rewards]
        names.update(dict.fromkeys(subs))
        names.update(dict.fromkeys(f"{name}.failed" for name in subs))
        if subs and app.function.sub_reward_errors.mode == "renormalize":
            names[RENORMALIZED] = None
    return [name for name in names if name not in _RESERVED], bool(explicit)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"{name} is {value}")
    return float(value)


# --- mapping helpers -------------------------------------------------------------------


def _rollout_path(request: Request) -> None:
    """A 404 for /ng-rollout/<id>/... whose id Gym would not write (nor route)."""
    rollout_id = request.path_params.get("rollout_id")
    if rollout_id is not None and not _ROLLOUT_ID.fullmatch(rollout_id):
        raise HTTPException(404)


def _session_id(body: dict[str, Any]) -> str:
    session = body.get("resources_session_id")
    if not isinstance(session, str) or not session:
        raise _Reject(422, errors.INVALID_INPUT, "resources_session_id must be a non-empty string")
    return session


def _gym_failure_kind(code: str) -> str:
    """Gym's failure_kind of a failed sample: a processor's error_code that is one of Gym's
    kinds as it is (``judge_failed`` for a judge it could not reach), a stop ``shutdown``,
    anything else of the verifier (raised, malformed output, past its deadline)
    ``verifier_error``."""
    if code in GYM_FAILURE_KINDS or _GYM_KIND.fullmatch(code):
        return code
    if code == errors.DRAINING:
        return "shutdown"
    return "verifier_error"


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


def _split_query(query: str, prompt: str | None) -> tuple[str, bool]:
    """The response: the templated query minus its prompt; and whether the prompt was found.

    OpenRLHF left-truncates a long prompt, so the query may start with the prompt's tail
    only: the longest tail of the prompt (of at least ``_MIN_OVERLAP`` characters) that the
    query starts with is taken as the prompt then.
    """
    if not prompt:
        return query, True
    if query.startswith(prompt):
        return query[len(prompt) :], True
    at = query.find(prompt)  # a BOS token or a system preamble before the prompt
    if at >= 0:
        return query[at + len(prompt) :], True
    overlap = _overlap(prompt, query)
    if overlap >= min(len(prompt), _MIN_OVERLAP):
        return query[overlap:], True
    return query, False


_MIN_OVERLAP = 32  # characters: a shorter shared tail may be chance


def _overlap(prompt: str, query: str) -> int:
    """Length of the longest suffix of ``prompt`` that ``query`` starts with (KMP: linear
    time, and 8 bytes per character of the query's head, not a Python int and a list slot
    or two: a 5 MB prompt once took 330 MB)."""
    head = query[: len(prompt)]
    if not head:
        return 0
    border = array("q", bytes(8 * len(head)))  # border[i]: of head[: i + 1]
    k = 0
    for i in range(1, len(head)):
        char = head[i]
        while k and char != head[k]:
            k = border[k - 1]
        if char == head[k]:
            k += 1
        border[i] = k
    # the longest prefix of head that the prompt ends with (no longer than head: within
    # the prompt's last len(head) characters)
    k = 0
    for char in prompt[len(prompt) - len(head) :]:
        if k == len(head):
            k = border[k - 1]
        while k and char != head[k]:
            k = border[k - 1]
        if char == head[k]:
            k += 1
    return k


def _strip_end_tokens(text: str, tokens: tuple[str, ...]) -> str:
    """The response without its trailing end-of-turn tokens (``--trainer-end-tokens``)."""
    stripped = True
    while stripped:
        stripped = False
        rest = text.rstrip()
        for token in tokens:
            if rest.endswith(token):
                text = rest[: -len(token)]
                stripped = True
                break
    return text


def _prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    if prompt is None or prompt == "":
        return []
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in prompt]


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def _batch_size(body: dict[str, Any]) -> int:
    """The samples of an OpenRLHF request, counted before any is built."""
    queries = body.get("query")
    return len(queries) if isinstance(queries, list) else 1


# --- NeMo Gym's verify request: the fields read are typed, a malformed one is a 422 --------


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")  # the Responses API has many more fields


# Items and their parts are typed dicts, not models: a row may hold millions of them (a
# model each cost about 1 KB and 7 us, a 10 MiB row of empty items 3 GB and 25 s). Their
# other fields are left out of the validated copy: the answer echoes the row as it came.


class _Part(TypedDict, total=False):
    """A content part (input_text, output_text, refusal, input_image...)."""

    text: str | None
    refusal: str | None


# Each list stops at its first invalid item (fail_fast): a million invalid items were a
# million errors of 2.4 KB each.
_Content = str | Annotated[list[_Part], Field(fail_fast=True)] | None


class _Message(TypedDict, total=False):
    type: Literal["message"]
    role: str  # "assistant" when absent
    content: _Content


class _FunctionCall(TypedDict, total=False):
    type: Literal["function_call"]
    call_id: str | None
    id: str | None
    name: str | None
    arguments: str | None


class _FunctionCallOutput(TypedDict, total=False):
    type: Literal["function_call_output"]
    call_id: str | None
    output: _Content


class _OtherItem(TypedDict):
    type: str  # reasoning and the rest: left out of the messages, their fields unread


_ITEM_KINDS = ("message", "function_call", "function_call_output")


def _item_kind(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None  # not an item at all: pydantic names it
    kind = item.get("type", "message")
    return kind if kind in _ITEM_KINDS else "other"


_Item = Annotated[
    Annotated[_Message, Tag("message")]
    | Annotated[_FunctionCall, Tag("function_call")]
    | Annotated[_FunctionCallOutput, Tag("function_call_output")]
    | Annotated[_OtherItem, Tag("other")],
    Discriminator(
        _item_kind,
        custom_error_type="item_type",
        custom_error_message="a Responses API item must be an object",
    ),
]


class _CreateParams(_Loose):
    input: str | Annotated[list[_Item], Field(fail_fast=True)] | None = None
    tools: list[dict[str, Any]] | None = Field(None, fail_fast=True)


class _Response(_Loose):
    output: list[_Item] | None = Field(None, fail_fast=True)


class _GymRow(_Loose):
    """What /verify reads of a row; its other columns are kept as they came."""

    responses_create_params: _CreateParams
    response: _Response


def _text(content: _Content | None) -> str | None:
    """Responses API content parts joined into one string."""
    if isinstance(content, list):
        return "".join(part.get("text") or part.get("refusal") or "" for part in content)
    return content


def _messages_of(items: str | list[Any] | None) -> list[dict[str, Any]]:
    """Responses API items (validated) as chat messages: a string input is the user's
    message; reasoning and other items are left out."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items or ():
        kind = _item_kind(item)
        if kind == "message":
            role = item.get("role", "assistant")
            messages.append({"role": role, "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            content = _text(item.get("output"))
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": content}
            )
    return messages
