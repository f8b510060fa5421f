"""One served function: parse request bytes, run the processor, serialise its output.

Shared by the HTTP app and ``python -m runtime invoke`` so that both validate, run and
fail the same way. Everything that can be decided once (sync or async, which models)
is decided here at startup, not per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from processors_base import dispatch
from processors_base.models import BaseDataModel, TaskStatus
from processors_base.redaction import Secrets, redact_head, request_secrets
from processors_base.redaction import redact as redact_text
from processors_base.rewards import InvalidSubRewardOutput, SubRewardErrors
from runtime import errors
from runtime.execution.finite import constant_in, finder_for, strict_serializer
from runtime.execution.loading import Target
from runtime.execution.offload import ProcessOffload, ThreadOffload, UserThreads, run_user_code

__all__ = ["Function", "ProcessorFailure", "RequestError", "invalid_input"]


class RequestError(Exception):
    """The client's request is wrong; ``body`` is the JSON error to send back."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail
        self.body = errors.error_body(code, message, detail)


class ProcessorFailure(Exception):
    """The processor raised or returned something that is not its output model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Function:
    def __init__(
        self,
        target: Target,
        *,
        isolation: str = "thread",
        processes: int = 1,
        threads: int = 32,
        sub_reward_errors: str = "zero",
    ) -> None:
        self.target = target
        self.func_type = target.func_type
        self.input_model = target.input_model
        self.output_model = target.output_model
        try:
            self.processor = target.cls()
        except (Exception, SystemExit) as exc:  # sys.exit() in __init__: a failed setup too
            raise ProcessorFailure(
                errors.SETUP_FAILED, f"{target.name}() failed: {errors.describe(exc)}"
            ) from exc
        # Only decides where setup() runs with process isolation; each call decides anew.
        self._process_is_async = inspect.iscoroutinefunction(self.processor.process)
        # The model's validator itself, unless the model overrides model_validate; read at
        # each call, never here: a model completed in setup() (model_rebuild) has none yet.
        self._validator_direct = (
            getattr(self.input_model.model_validate, "__func__", None)
            is BaseModel.model_validate.__func__  # type: ignore[attr-defined]
        )
        self._func_type_value = self.func_type.value
        self.failure_template = _failure_template(self.output_model)
        self._non_finite = finder_for(self.output_model)
        self._to_json = strict_serializer(self.output_model).to_json
        # How a failed sub-reward counts (see processors_base.rewards); the app adds its counter.
        self.sub_reward_errors = SubRewardErrors(sub_reward_errors)
        self._isolation = isolation
        self._processes = processes
        self.threads = UserThreads(threads)  # sync user code only; never runtime internals
        self._attach(ThreadOffload(self.processor, self.threads))

    def _attach(self, offload: ThreadOffload | ProcessOffload) -> None:
        # Sync sub-rewards and aggregates reach the same offload, and the sub-reward error
        # policy, through the context of each call of user code (dispatch.runtime_services).
        self.offload = offload
        self.services = dispatch.Services(offload, self.sub_reward_errors)

    @contextlib.contextmanager
    def _lent(self) -> Iterator[None]:
        """The runtime's services lent to the user code called in this block."""
        token = dispatch.runtime_services.set(self.services)
        try:
            yield
        finally:
            dispatch.runtime_services.reset(token)

    # --- lifecycle -------------------------------------------------------------------

    async def setup(self) -> None:
        """Run setup() here and, with process isolation, in the first child process."""
        setup = getattr(self.processor, "setup", None)
        try:
            if self._isolation == "process":
                offload = ProcessOffload(
                    self.target.spec,
                    str(self.target.workspace),
                    self.func_type.value,
                    self._processes or usable_cpus(),
                )
                self._attach(offload)
                await offload.ready()
                if not self._process_is_async:
                    return  # all of process() runs in the children: no setup() here
            if setup is not None:
                with self._lent():
                    await run_user_code(setup, threads=self.threads)
        except BaseException as exc:  # sys.exit() in setup() is a failed setup too
            if _cancelled(exc):
                raise
            raise ProcessorFailure(
                errors.SETUP_FAILED,
                f"{self.target.name}.setup() failed: {errors.describe(exc)}",
            ) from exc

    async def shutdown(self, run_hook: bool = True) -> None:
        try:
            shutdown = getattr(self.processor, "shutdown", None)  # the SDK's bases have none
            if run_hook and shutdown is not None:
                with self._lent():
                    await run_user_code(shutdown, threads=self.threads)
        finally:
            close_executor = getattr(self.processor, "close_executor", None)
            if close_executor is not None:  # a shutdown() override may not call super()
                close_executor()
            await self.offload.close()

    # --- the request path ------------------------------------------------------------

    def parse(self, body: bytes) -> BaseDataModel:
        """Request bytes to the validated input model, or a RequestError (400/422)."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if not body:
                message = "request body is empty"
            elif "UTF-8" in str(exc):
                message = "request body is not valid UTF-8"
            else:
                message = f"request body is not valid JSON: {exc}"
            raise RequestError(400, errors.INVALID_JSON, message) from None
        if type(data) is not dict:
            raise RequestError(
                400,
                errors.NOT_AN_OBJECT,
                f"request body must be a JSON object, not {_json_kind(data)}",
            )
        sent_type = data.get("func_type")
        if sent_type is not None and sent_type != self._func_type_value:
            raise RequestError(
                422,
                errors.FUNC_TYPE_MISMATCH,
                f"func_type {_shown(sent_type)} in the body does not match this function's type "
                f"{self._func_type_value!r}",
            )
        try:
            if self._validator_direct:
                return self.input_model.__pydantic_validator__.validate_python(data)
            return self.input_model.model_validate(data)
        except ValidationError as exc:
            raise invalid_input(
                f"request body does not fit {self.input_model.__name__}", exc
            ) from None

    async def process(self, input_data: BaseDataModel) -> bytes:
        """Run the processor on one input; the serialised output, or ProcessorFailure."""
        return self.serialise(await self.call(input_data))

    async def call(self, input_data: BaseDataModel) -> Any:
        """Run the processor on one input; what it returned, or ProcessorFailure."""
        token = dispatch.runtime_services.set(self.services)  # (inline: every request's path)
        try:
            result = await dispatch.call(self.processor, "process", input_data, self.offload)
        except InvalidSubRewardOutput as exc:  # a sub-reward returned None (a missing return)
            message = redact_message(str(exc), input_data)
            raise ProcessorFailure(errors.INVALID_OUTPUT, message) from exc
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: a failed request
            if _cancelled(exc):
                raise
            message = errors.describe(exc)
            message = redact_message(message, input_data)
            raise ProcessorFailure(errors.PROCESSOR_ERROR, message) from exc
        finally:
            dispatch.runtime_services.reset(token)
        return result

    def serialise(self, result: Any) -> bytes:
        output = self.validated(result)
        try:
            to_json = (
                self._to_json
                if type(output) is self.output_model
                else strict_serializer(type(output)).to_json  # a subclass of it
            )
            data = to_json(output)
        except Exception as exc:
            raise ProcessorFailure(
                errors.INVALID_OUTPUT, f"output of process() is not serialisable: {exc}"
            ) from exc
        found = constant_in(data)  # in a free-form field: validated() checked the typed ones
        if found is not None:
            raise ProcessorFailure(
                errors.INVALID_OUTPUT,
                f"process() returned a non-finite number in {found[0]} ({found[1]}): "
                "JSON has no NaN or Infinity",
            )
        return data

    def validated(self, result: Any) -> BaseModel:
        """What process() returned as the output model, checked for NaN and Infinity
        (the trainer protocols read it without serialising); else INVALID_OUTPUT."""
        if not isinstance(result, self.output_model):
            result = self._coerce(result)
        try:
            found = self._non_finite(result)
        except (AttributeError, TypeError) as exc:  # model_construct() with fields missing
            raise ProcessorFailure(
                errors.INVALID_OUTPUT, f"output of process() is malformed: {exc}"
            ) from exc
        if found is not None:
            raise ProcessorFailure(
                errors.INVALID_OUTPUT,
                f"process() returned a non-finite number in {found[0]} ({found[1]}): "
                "JSON has no NaN or Infinity",
            )
        # A failed output's error text (a sub-reward's failure, or one process() returned
        # itself) leaves in a body: blanked of secrets like the runtime's own error messages,
        # and cut as they are (before it is scrubbed: it may quote a huge answer).
        error = result.__dict__.get("error")
        if error and isinstance(error, str):
            cleaned = redact_message(error, None)
            if cleaned != error:
                result = result.model_copy(update={"error": cleaned})
        return result

    def _coerce(self, result: Any) -> BaseModel:
        name = self.output_model.__name__
        if isinstance(result, BaseModel):  # the same shape from another package (the SDK's)
            data: Any = result.model_dump()
        elif isinstance(result, dict):
            data = result
        else:
            raise ProcessorFailure(
                errors.INVALID_OUTPUT,
                f"process() returned {type(result).__name__}, expected {name} "
                "(or a dict of its shape)",
            )
        try:
            return self.output_model.model_validate(data)
        except ValidationError as exc:
            raise ProcessorFailure(
                errors.INVALID_OUTPUT,
                f"process() returned a value that is not a {name}: {_summary(exc)}",
            ) from None

    def failure(self, code: str, message: str) -> bytes:
        """The output shape with status "failed", for a request the processor could not serve.
        Its message is blanked of the request's secrets here too, whoever built it."""
        message = redact_message(message, None)
        return orjson.dumps({**self.failure_template, **errors.fields(code, message)})


def invalid_input(what: str, exc: ValidationError) -> RequestError:
    """A 422 ``INVALID_INPUT``: ``what`` with each offending field and why, never its value
    (it may be, or hold, a secret)."""
    return RequestError(422, errors.INVALID_INPUT, f"{what}: {_summary(exc)}", _details(exc))


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity and the cgroup (v1 or v2) CPU quota,
    not the host's count (64 children in a 2-CPU container would each run setup())."""
    import loky  # only with --isolation process

    return max(1, loky.cpu_count())


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is this task being cancelled (a deadline, a disconnect, the server
    stopping), as opposed to user code raising CancelledError of its own."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is None or cancelling() > 0


def redact(message: str, input_data: Any) -> str:
    """Blank the request's own api_key (plain, URL-encoded or base64) and credentials
    (Authorization, Bearer, URL userinfo) out of a message before it leaves the process."""
    secrets = request_secrets.get() or Secrets.of(input_data)  # the app bound them already
    return redact_text(message, secrets, marker="**********")


def redact_message(message: str, input_data: Any) -> str:
    """``redact`` of a message for an error body, cut to what a body shows (errors.cap)
    before it is scrubbed: a huge message is never scrubbed whole."""
    if len(message) <= errors.MAX_MESSAGE:  # whole (blanking may lengthen it: fields() cuts)
        return redact(message, input_data)
    secrets = request_secrets.get() or Secrets.of(input_data)
    return errors.cap(message, head=partial(redact_head, secrets=secrets, marker="**********"))


def _failure_template(output_model: type[BaseModel]) -> dict[str, Any]:
    fields = output_model.model_fields
    template: dict[str, Any] = {}
    if "agent_output" in fields:
        template["agent_output"] = None
    if "reward" in fields:
        reward_type = fields["reward"].annotation
        empty_group = reward_type is not None and "rewards" in getattr(
            reward_type, "model_fields", {}
        )
        template["reward"] = (
            {"rewards": []} if empty_group else {"reward_score": 0.0, "reward_metrics": None}
        )
    template["status"] = TaskStatus.FAILED.value
    return template


def _shown(value: Any) -> str:
    # A wrong func_type is echoed only when it is a short plain word: anything else may be
    # (or hold) a secret sent in the wrong field, and is named by its JSON kind.
    if isinstance(value, str) and _PLAIN_WORD.fullmatch(value):
        return repr(value)
    kind = "an object" if isinstance(value, dict) else _json_kind(value)
    return f"({kind}, not shown)"


_PLAIN_WORD = re.compile(r"[A-Za-z_]{1,32}")


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _loc(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(body)"


def _details(exc: ValidationError) -> list[dict[str, Any]]:
    # Never echo the offending input: it may be (or contain) a secret.
    return [
        {"loc": list(e["loc"]), "field": _loc(e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False, include_context=False)
    ]


def _summary(exc: ValidationError, limit: int = 5) -> str:
    items = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = [f"{_loc(e['loc'])}: {e['msg']}" for e in items[:limit]]
    if len(items) > limit:
        parts.append(f"and {len(items) - limit} more")
    return "; ".join(parts)
