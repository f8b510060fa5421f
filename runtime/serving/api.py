"""``POST /api/v1``, the hot path, on raw ASGI: refused (not ready, draining, full) ->
body read and held -> admitted -> parsed -> run in a slot under its deadline -> answered,
logged and counted. Who answers is ``running.Running.claim``'s: see runtime.serving.running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, MutableMapping
from time import perf_counter
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from processors_base.models import TaskStatus
from processors_base.redaction import in_flight
from runtime import errors
from runtime.execution.function import Function, ProcessorFailure, RequestError
from runtime.logs import RequestLog, bind_request, bind_secrets, unbind_request
from runtime.serving.admission import PARSE_COSTS, PARSED_FLOOR, Admission, scan_above
from runtime.serving.body import BodyReader, ClientGone
from runtime.serving.deadlines import Reason
from runtime.serving.metrics import OTHER, Metrics
from runtime.serving.protocol import REJECTED
from runtime.serving.running import Runner, Running
from runtime.serving.sending import WHOLE_RESPONSE

if TYPE_CHECKING:  # imported only when tracing is on (server.build_app)
    from runtime.tracing.spans import Tracing

__all__ = ["ApiCall", "ApiHandler", "send_json"]

log = logging.getLogger("runtime")

_JSON = (b"content-type", b"application/json")
_JSON_ONLY = (_JSON,)
_CLOSE = (b"connection", b"close")
_RETRY_AFTER = (b"retry-after", b"1")
_OVERLOADED = "all processing slots and the queue are taken; retry later"


class ApiCall(Running):
    """A /api/v1 request being run: a late answer goes to its client, and an abandoned one
    is logged and counted then (its task may never end)."""

    __slots__ = ("handler", "send")
    handler: ApiHandler  # set when made
    send: Any  # the request's ASGI send

    async def answer_late(self) -> None:
        await self.handler.answer_late(self)

    def abandoned_now(self) -> None:
        assert self.late is None or self.late[0] in (503, 504)
        status, code, message = self.late or (
            499,
            errors.CLIENT_DISCONNECTED,
            "client disconnected; processing was cancelled",
        )
        self.handler.finish(
            self.scope, self.started, status, code, message, self.input_data, None, self.answered_at
        )


class ApiHandler:
    def __init__(
        self,
        function: Function,
        admission: Admission,
        body: BodyReader,
        runner: Runner,
        metrics: Metrics,
        request_log: RequestLog,
        refusal: Callable[[], tuple[str, str] | None],  # why no request is taken now
        draining: Callable[[], bool],  # whether the server stops
        tracing: Tracing | None = None,
    ) -> None:
        self.function = function
        self.admission = admission
        self.body = body
        self.runner = runner
        self.metrics = metrics
        self.request_log = request_log
        self.refusal = refusal
        self.draining = draining
        self.tracing = tracing
        # The serving loop, once the lifespan has started: on Python 3.11 each argument-less
        # get_running_loop() or current_task() is a getpid() system call.
        self.loop: asyncio.AbstractEventLoop | None = None
        # what a parsed body costs; one of up to _scan_above bytes is not scanned
        group = function.func_type.value == "group_reward"
        self._parse_costs = PARSE_COSTS["group" if group else "api"]
        self._scan_above = scan_above(self._parse_costs, PARSED_FLOOR)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = perf_counter()
        refused = self.refusal()
        if refused is not None:
            code, message = refused
            await send_json(send, 503, errors.error_body(code, message), _RETRY_AFTER)
            self.finish(scope, started, 503, code, message, None)
            return
        loop = self.loop or asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        admitted = await self._admitted_body(scope, receive, send, started, loop, task)
        if admitted is not None:
            await self._run(scope, receive, send, started, loop, task, *admitted)
            if self.tracing is not None and self.tracing.flush_each_request:
                # after the response: a short-lived instance loses no span, the client
                # waits for none
                await anyio.to_thread.run_sync(self.tracing.flush)

    async def _admitted_body(
        self,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        started: float,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],
    ) -> tuple[bytes, int] | None:
        """The body and the bytes it holds in the budget, admitted; None: answered.

        Full: answered before reading a body. Else admitted only once the body is in, so
        a client slow to send never holds the place of one that is ready."""
        admission = self.admission
        if not admission.full:
            try:
                body = await self.body.read(scope, receive, loop, task)
                held = len(body)
                if held > self._scan_above:  # charged for its parse too, until the end
                    try:
                        held += self.body.hold_parsed(body, self._parse_costs, PARSED_FLOOR)
                    except RequestError:
                        admission.release_body(held)
                        raise
            except RequestError as exc:
                extra = _RETRY_AFTER if exc.status == 503 else _CLOSE  # 408, 413: maybe unread
                await send_json(send, exc.status, exc.body, extra)
                self.finish(scope, started, exc.status, exc.code, str(exc), None)
                return None
            except ClientGone:
                message = "client disconnected while sending"
                self.finish(scope, started, 499, errors.CLIENT_DISCONNECTED, message, None)
                return None
            if admission.try_admit():
                return body, held
            admission.release_body(held)
        body = errors.error_body(errors.OVERLOADED, _OVERLOADED)
        await send_json(send, 503, body, _RETRY_AFTER)
        self.finish(scope, started, 503, errors.OVERLOADED, _OVERLOADED, None)
        return None

    async def _run(
        self,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        started: float,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],
        body: bytes,
        held: int,
    ) -> None:
        """Parse, run and answer an admitted request; it leaves the admission here."""
        function = self.function
        admission = self.admission
        run = ApiCall(self.runner, loop, task, scope, started)
        run.handler = self
        run.send = send
        bound = bind_request(run)  # its scope and input_data: the ids of its lines
        input_data = None
        status, code, message = 200, "", ""
        error: BaseException | None = None  # user code's exception: its traceback is logged
        secrets: tuple[str, ...] = ()
        try:
            try:
                input_data = function.parse(body)
                # blanked from this request's logs, bodies and spans; and, while it runs,
                # from lines logged where its context is not visible (threads of user code)
                if secrets := bind_secrets(input_data):
                    in_flight.add(secrets)
                run.input_data = input_data
                run.watch(receive)  # only now may another task wait on receive()
                result, output = await self.runner.run_admitted(
                    run, input_data, self.function.serialise
                )
                if (failed := _failed_result(result)) is not None:
                    code, message = failed  # answered 200 all the same: counted and logged
            except asyncio.CancelledError:
                if run.reason is None:
                    if not self.draining():
                        raise
                    run.reason = Reason.SHUTDOWN  # uvicorn cancels what runs past --grace
                run.absorb()
            # Who answers: with no reason, this task (nothing can fire after end()); after
            # one, whoever claims first, this task or the overdue responder (runner).
            if run.reason is None:
                await send(
                    {"type": WHOLE_RESPONSE, "status": 200, "headers": _JSON_ONLY, "body": output}
                )
            else:
                status, code, message = await self._answer_cancelled(run)
        except RequestError as exc:
            run.end()
            status, code, message = exc.status, exc.code, str(exc)
            if run.claim():
                await send_json(send, exc.status, exc.body, _CLOSE if exc.status == 413 else None)
        except ProcessorFailure as exc:
            run.end()
            status, code, message = 500, exc.code, str(exc)
            error = exc.__cause__ if code == errors.PROCESSOR_ERROR else None
            if run.claim():
                await send_json(send, 500, function.failure(code, message))
        except BaseException as exc:  # a bug of ours: still a JSON answer, never a traceback
            run.end()
            if isinstance(exc, asyncio.CancelledError):
                raise
            status, code, message = 500, errors.INTERNAL_ERROR, "internal error of the runtime"
            log.exception("internal error while serving a request")
            if run.claim():
                body = function.failure(code, f"{message}: {type(exc).__name__}")
                await send_json(send, 500, body)
        finally:
            if secrets:
                in_flight.discard(secrets)
            admission.release_body(held)  # when the task ends: until then it holds it
            if run.abandoned:  # the runner has ended the request; its task ends only now
                self.runner.stuck_ended(run)
            else:
                admission.leave()
                ended = None
                if run.late:  # the client got that answer, whatever came after it
                    status, code, message = run.late
                    ended = run.answered_at
                self.finish(scope, started, status, code, message, input_data, error, ended)
            unbind_request(bound)

    async def _answer_cancelled(self, run: ApiCall) -> tuple[int, str, str]:
        """Answer a run cancelled for its ``reason``, unless the runner has (or no one is
        there to answer); the (status, code, message) of its line."""
        if run.reason is Reason.DISCONNECT:  # no one to answer
            return 499, errors.CLIENT_DISCONNECTED, "client disconnected; processing was cancelled"
        stopped = self.runner.stopped_answer(run.reason)
        if run.claim():
            await self._send_stopped(run.send, stopped)
        return stopped

    async def answer_late(self, run: ApiCall) -> None:
        """Send ``run.late``, the answer the runner gave it when it stopped it."""
        assert run.late is not None
        await self._send_stopped(run.send, run.late)

    async def _send_stopped(self, send: Any, stopped: tuple[int, str, str]) -> None:
        """A deadline's 504 is a failed output, as the function's own failures are; a stop's
        503 is an error to retry."""
        status, code, message = stopped
        if status == 504:
            await send_json(send, 504, self.function.failure(code, message))
        else:
            await send_json(send, status, errors.error_body(code, message), _RETRY_AFTER)

    def finish(
        self,
        scope: MutableMapping[str, Any],
        started: float,
        status: int,
        code: str,
        message: str,
        input_data: Any,
        error: BaseException | None = None,
        ended: float | None = None,  # when the answer went out, if not now (a late answer)
    ) -> None:
        """Count a request and log its line (every non-2xx one; a 2xx one when sampled)."""
        elapsed = (ended or perf_counter()) - started
        rejected = scope.get(REJECTED)
        if rejected is not None:  # the protocol answered instead (a bad chunk, garbage after)
            status, code = rejected
            message = "the connection was answered and closed by the HTTP layer"
            error = None
        self.metrics.observe(status, elapsed, code)
        if status != 200 or code:  # RequestLog.answered, inline on the hot path
            self.request_log.failure(scope, status, elapsed, code, message, input_data, error)
        elif self.request_log.wants(elapsed):
            self.request_log.success(scope, elapsed, input_data)


async def send_json(
    send: Any, status: int, body: bytes, extra: tuple[bytes, bytes] | None = None
) -> None:
    """A whole JSON answer, with one extra header if given."""
    headers = _JSON_ONLY if extra is None else (_JSON, extra)
    await send({"type": WHOLE_RESPONSE, "status": status, "headers": headers, "body": body})


def _failed_result(result: Any) -> tuple[str, str] | None:
    """(error code, error) of a result of status failed (OTHER when it names no code); None
    for a success. The result is process()'s, already checked by ``Function.serialise``:
    an output model, one of another package (the SDK's), or a dict of its shape."""
    if type(result) is dict:
        status, code, error = (result.get(k) for k in ("status", "error_code", "error"))
    else:
        status = getattr(result, "status", None)
        if status is _SUCCESS:
            return None
        code, error = getattr(result, "error_code", None), getattr(result, "error", None)
    if getattr(status, "value", status) != "failed":
        return None
    return str(code) if code else OTHER, str(error) if error else ""


_SUCCESS = TaskStatus.SUCCESS
