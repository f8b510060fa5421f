"""LLM spans: ``trace_client`` / ``untrace_client`` for clients, ``@observe_llm`` for a
function of your own.

``trace_client`` recognises clients by shape, not by class name:

- an OpenAI client, sync or async (``client.chat.completions.create``);
- a completions resource (``.create`` and no ``.chat``);
- a LangChain-like wrapper exposing ``.client`` and/or ``.async_client``;
- the DashScope ``Generation`` class itself (a class with a classmethod ``call``).

It patches the ``create`` (or ``call``) of that object in place, so calls keep returning
the client's own types; a streamed result stays an instance of its stream class (its
class is swapped for a subclass that ends the span when the stream is exhausted, closed
or fails). Tracing twice traces once.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, overload

from processors_base.observability import _spans
from processors_base.observability._core import active_provider

__all__ = ["observe_llm", "trace_client", "untrace_client"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
_MARK = "__rl_traced__"
_log = logging.getLogger("processors_base.observability")
_WARNED: set[str] = set()  # the types trace_client has warned about


def trace_client(
    client: T, *, tracer_provider: Any = None, provider: str | None = None, handler: Any = None
) -> T:
    """Trace every chat completion made through ``client`` from now on; returns it.

    ``provider`` names the LLM provider on the spans (default: ``openai``, or
    ``dashscope`` for the Generation class); ``handler`` is a GenAI telemetry handler of
    your own to record them with. An object it does not recognise is returned unchanged,
    with one warning per type (as in the SDK, tracing never breaks the code it observes).
    """
    targets = _targets(client)
    if not targets:
        kind = f"{type(client).__module__}.{type(client).__qualname__}"
        if kind not in _WARNED:
            _WARNED.add(kind)
            _log.warning(
                "trace_client: %s is not a client it knows, so its calls are not traced: pass "
                "an OpenAI client (.chat.completions.create), a completions resource "
                "(.create), a wrapper with .client / .async_client, or the DashScope "
                "Generation class",
                kind,
            )
        return client
    for owner, attr, provider_name in targets:
        _patch(owner, attr, provider or provider_name, tracer_provider, handler)
    return client


def untrace_client(client: T) -> T:
    """Undo ``trace_client``."""
    for owner, attr, _ in _targets(client):
        if isinstance(owner, type):
            original = getattr(owner.__dict__.get(attr), "__func__", None)
            if original is not None and getattr(original, _MARK, None) is not None:
                setattr(owner, attr, classmethod(getattr(original, _MARK)))
        elif getattr(vars(owner).get(attr), _MARK, None) is not None:
            del vars(owner)[attr]
    return client


def _targets(obj: Any, depth: int = 0) -> list[tuple[Any, str, str]]:
    if isinstance(obj, type):
        if isinstance(inspect.getattr_static(obj, "call", None), classmethod):
            return [(obj, "call", "dashscope")]
        return []
    completions = getattr(getattr(obj, "chat", None), "completions", None)
    if completions is not None and callable(getattr(completions, "create", None)):
        return [(completions, "create", "openai")]
    if callable(getattr(obj, "create", None)) and not hasattr(obj, "chat"):
        return [(obj, "create", "openai")]
    found: list[tuple[Any, str, str]] = []
    if depth < 2:
        for name in ("client", "async_client"):
            inner = getattr(obj, name, None)
            if inner is not None and inner is not obj:
                found += _targets(inner, depth + 1)
    return found


def _api_key(owner: Any) -> tuple[str, ...]:
    key = getattr(owner, "api_key", None) or getattr(
        getattr(owner, "_client", None), "api_key", None
    )
    return (key,) if isinstance(key, str) and key else ()


def _patch(
    owner: Any, attr: str, provider_name: str, tracer_provider: Any, handler: Any = None
) -> None:
    if isinstance(owner, type):
        original = owner.__dict__[attr].__func__
        if getattr(original, _MARK, None) is not None:
            return
        traced = _wrap(original, provider_name, tracer_provider, (), telemetry=handler)
        setattr(traced, _MARK, original)
        setattr(owner, attr, classmethod(traced))
        return
    original = getattr(owner, attr)
    if getattr(original, _MARK, None) is not None:
        return
    traced = _wrap(original, provider_name, tracer_provider, _api_key(owner), telemetry=handler)
    setattr(traced, _MARK, original)
    object.__setattr__(owner, attr, traced)


def _keywords(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    return kwargs  # clients take model=, messages= and the parameters by keyword


def _wrap(
    original: Callable[..., Any],
    provider_name: str,
    tracer_provider: Any,
    secrets: tuple[str, ...],
    arguments_of: Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]] = _keywords,
    mapper: Callable[[Any, Any], None] | None = None,
    telemetry: Any = None,
) -> Callable[..., Any]:
    """``original`` with an LLM span per call (while tracing is on); ``arguments_of`` names
    the call's arguments (model, messages, parameters); ``mapper(invocation, result)``
    replaces the reading of the response; ``telemetry`` is a user's own GenAI handler."""
    # openai's async create is a plain function returning a coroutine under a decorator
    if inspect.iscoroutinefunction(inspect.unwrap(original)):

        @functools.wraps(original)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            provider = active_provider(tracer_provider)
            if provider is None:
                return await original(*args, **kwargs)
            with _llm_span(
                telemetry or provider, provider_name, arguments_of(args, kwargs), secrets, mapper
            ) as done:
                return done(await original(*args, **kwargs))

        return traced_async

    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        provider = active_provider(tracer_provider)
        if provider is None:
            return original(*args, **kwargs)
        with _llm_span(
            telemetry or provider, provider_name, arguments_of(args, kwargs), secrets, mapper
        ) as done:
            return done(original(*args, **kwargs))

    return traced


@contextmanager
def _llm_span(
    provider: Any,
    provider_name: str,
    arguments: dict[str, Any],
    secrets: tuple[str, ...],
    mapper: Callable[[Any, Any], None] | None = None,
) -> Iterator[Callable[[Any], Any]]:
    """An LLM span around one call with these keyword arguments; yields ``done(result)``,
    which records the response (or hands the span to the stream returned) and returns it."""
    messages = arguments.get("messages", arguments.get("prompt"))
    invocation = _spans.start_llm(
        provider, provider_name, arguments.get("model"), messages, arguments
    )
    try:
        yield lambda result: _finish(provider, invocation, result, arguments, secrets, mapper)
    except BaseException as exc:
        _spans.fail_llm(provider, invocation, exc, secrets)
        raise


def _finish(
    provider: Any,
    invocation: Any,
    result: Any,
    kwargs: dict[str, Any],
    secrets: tuple[str, ...],
    mapper: Callable[[Any, Any], None] | None = None,
) -> Any:
    if inspect.isawaitable(result):  # an async call reached through a sync-looking wrapper
        return _finish_later(provider, invocation, result, kwargs, secrets, mapper)
    if mapper is None and (
        kwargs.get("stream") or inspect.isgenerator(result) or inspect.isasyncgen(result)
    ):
        _spans.detach(invocation)
        return traced_stream(result, _spans.StreamState(provider, invocation, secrets))
    if mapper is not None:
        mapper(invocation, result)
    else:  # a custom function may return plain text: recorded as the output text
        _spans.apply_response(
            invocation, {"output": {"text": result}} if isinstance(result, str) else result
        )
    _spans.finish_llm(provider, invocation)
    return result


async def _finish_later(
    provider: Any,
    invocation: Any,
    awaitable: Any,
    kwargs: dict[str, Any],
    secrets: tuple[str, ...],
    mapper: Callable[[Any, Any], None] | None = None,
) -> Any:
    try:
        result = await awaitable
    except BaseException as exc:
        _spans.fail_llm(provider, invocation, exc, secrets)
        raise
    return _finish(provider, invocation, result, kwargs, secrets, mapper)


# --- streams -------------------------------------------------------------------------

_stream_classes: dict[type, type] = {}


def traced_stream(stream: Any, state: _spans.StreamState) -> Any:
    """The same stream, ending its span when exhausted, closed or failed."""
    if inspect.isgenerator(stream):
        return _generator(stream, state)
    if inspect.isasyncgen(stream):
        return _async_generator(stream, state)
    cls = type(stream)
    traced_cls = _stream_classes.get(cls)
    if traced_cls is None:
        traced_cls = _stream_classes[cls] = (
            _async_stream_class(cls) if hasattr(cls, "__anext__") else _sync_stream_class(cls)
        )
    try:
        stream.__class__ = traced_cls
    except TypeError:  # a class whose instances cannot change class: end the span now
        state.finish()
        return stream
    object.__setattr__(stream, "_rl_stream_state", state)
    return stream


def _generator(stream: Iterator[Any], state: _spans.StreamState) -> Iterator[Any]:
    try:
        for chunk in stream:
            state.record(chunk)
            yield chunk
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            state.fail(exc)
        raise
    finally:
        state.finish()


async def _async_generator(
    stream: AsyncIterator[Any], state: _spans.StreamState
) -> AsyncIterator[Any]:
    try:
        async for chunk in stream:
            state.record(chunk)
            yield chunk
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            state.fail(exc)
        raise
    finally:
        state.finish()


def _sync_stream_class(base: type[Any]) -> type:
    def __next__(self: Any) -> Any:
        state = self._rl_stream_state
        try:
            chunk = base.__next__(self)
        except StopIteration:
            state.finish()
            raise
        except BaseException as exc:
            state.fail(exc)
            raise
        state.record(chunk)
        return chunk

    def __iter__(self: Any) -> Iterator[Any]:
        try:
            while True:
                try:
                    chunk = __next__(self)
                except StopIteration:
                    return
                yield chunk
        finally:  # also when the consumer stops early
            self._rl_stream_state.finish()

    def close(self: Any) -> Any:
        try:
            return base.close(self)
        finally:
            self._rl_stream_state.finish()

    def __exit__(self: Any, *exc_info: Any) -> Any:
        try:
            return base.__exit__(self, *exc_info)
        finally:
            self._rl_stream_state.finish()

    namespace: dict[str, Any] = {"__next__": __next__, "__iter__": __iter__}
    if hasattr(base, "close"):
        namespace["close"] = close
    if hasattr(base, "__exit__"):
        namespace["__exit__"] = __exit__
    return type(base.__name__, (base,), namespace)


def _async_stream_class(base: type[Any]) -> type:
    async def __anext__(self: Any) -> Any:
        state = self._rl_stream_state
        try:
            chunk = await base.__anext__(self)
        except StopAsyncIteration:
            state.finish()
            raise
        except BaseException as exc:
            state.fail(exc)
            raise
        state.record(chunk)
        return chunk

    async def __aiter__(self: Any) -> AsyncIterator[Any]:
        try:
            while True:
                try:
                    chunk = await __anext__(self)
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            self._rl_stream_state.finish()

    async def close(self: Any) -> Any:
        try:
            return await base.close(self)
        finally:
            self._rl_stream_state.finish()

    async def __aexit__(self: Any, *exc_info: Any) -> Any:
        try:
            return await base.__aexit__(self, *exc_info)
        finally:
            self._rl_stream_state.finish()

    namespace: dict[str, Any] = {"__anext__": __anext__, "__aiter__": __aiter__}
    if hasattr(base, "close"):
        namespace["close"] = close
    if hasattr(base, "__aexit__"):
        namespace["__aexit__"] = __aexit__
    return type(base.__name__, (base,), namespace)


# --- a function of your own -------------------------------------------------------------


@overload
def observe_llm(
    func: Callable[P, R],
    /,
    *,
    provider: str = "custom",
    request_model_arg: str = "model",
    messages_arg: str = "messages",
    prompt_arg: str = "prompt",
    result_mapper: Callable[[Any, Any], None] | None = None,
    handler: Any = None,
    tracer_provider: Any = None,
) -> Callable[P, R]: ...
@overload
def observe_llm(
    func: None = None,
    /,
    *,
    provider: str = "custom",
    request_model_arg: str = "model",
    messages_arg: str = "messages",
    prompt_arg: str = "prompt",
    result_mapper: Callable[[Any, Any], None] | None = None,
    handler: Any = None,
    tracer_provider: Any = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def observe_llm(
    func: Callable[..., Any] | None = None,
    /,
    *,
    provider: str = "custom",
    request_model_arg: str = "model",
    messages_arg: str = "messages",
    prompt_arg: str = "prompt",
    result_mapper: Callable[[Any, Any], None] | None = None,
    handler: Any = None,
    tracer_provider: Any = None,
) -> Any:
    """An LLM span around a function that calls a model. The model and the input are read
    from its arguments (by keyword, or by position through its signature): the argument
    named ``request_model_arg``, and ``messages_arg`` or else ``prompt_arg``.
    ``result_mapper(invocation, result)`` fills the span from the result instead of the
    built-in reading of OpenAI/DashScope responses; ``handler`` records through your own
    GenAI telemetry handler."""
    options = {
        "provider": provider,
        "request_model_arg": request_model_arg,
        "messages_arg": messages_arg,
        "prompt_arg": prompt_arg,
        "result_mapper": result_mapper,
        "handler": handler,
        "tracer_provider": tracer_provider,
    }
    if func is None:
        return lambda f: observe_llm(f, **options)
    signature = inspect.signature(func)
    params = signature.parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if request_model_arg not in params and not takes_kwargs:
        raise TypeError(
            f"@observe_llm: {func.__qualname__}() has no {request_model_arg!r} parameter; the "
            f"LLM span names the model from {request_model_arg}=... (see request_model_arg=)"
        )

    def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return dict(kwargs)  # the call itself will fail with Python's own message
        values = dict(bound.arguments)
        values.update(
            values.pop(
                next((n for n, p in params.items() if p.kind is inspect.Parameter.VAR_KEYWORD), ""),
                {},
            )
        )
        # the span reads model= and messages= (or prompt=): map the configured names to them
        values["model"] = values.get(request_model_arg)
        messages = values.get(messages_arg)
        values["messages"] = messages if messages is not None else values.get(prompt_arg)
        return values

    return _wrap(func, provider, tracer_provider, (), arguments, result_mapper, handler)
