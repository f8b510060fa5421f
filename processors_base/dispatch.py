"""One way to call user code, shared by ``process``, sub-rewards, aggregates and the hooks.

Whether code is async is decided when it is called, from what attribute lookup finds
then (never from a function a decorator wrapped, nor from what a parent class declared):
an ``async def`` (or anything ``inspect`` sees as a coroutine function) is awaited on the
event loop; anything else runs off the loop, and if it hands back an awaitable (a sync
wrapper around async code) that is awaited on the loop too, so no coroutine is dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio.to_thread

if TYPE_CHECKING:
    from processors_base.rewards import SubRewardErrors

__all__ = ["Offload", "Services", "call", "call_function", "is_async", "runtime_services"]

# A runtime's way to run sync user code off the loop: ``await offload(attr, arg)`` runs
# ``getattr(processor, attr)(arg)`` (in a bounded thread pool, or a child process).
Offload = Callable[[str, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Services:
    """What a runtime lends the user code it runs: ``offload``, where sync sub-rewards and
    aggregates run; ``sub_reward_errors``, how a failed sub-reward counts and who hears of
    it (see processors_base.rewards)."""

    offload: Offload | None = None
    sub_reward_errors: SubRewardErrors | None = None


# The runtime sets it around each call of user code; the tasks and threads that call starts
# inherit it with their context. (Never an attribute of the processor: a class that takes
# no new attributes, slotted or frozen, would lose it.) None: no runtime, anyio's threads.
runtime_services: ContextVar[Services | None] = ContextVar("runtime_services", default=None)

# Whether a function is a coroutine function never changes, and asking ``inspect`` costs
# more than a request's whole dispatch: the answer is kept per function (bounded, since a
# callable object made per call would otherwise pile up).
_async_functions: dict[Any, bool] = {}
_CACHE_LIMIT = 4096


def is_async(func: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction(func)``, remembered per underlying function."""
    key = getattr(func, "__func__", func)  # a bound method: its function
    try:
        return _async_functions[key]
    except KeyError:
        found = inspect.iscoroutinefunction(func)
        if len(_async_functions) >= _CACHE_LIMIT:
            _async_functions.clear()
        _async_functions[key] = found
        return found
    except TypeError:  # unhashable
        return inspect.iscoroutinefunction(func)


async def call(owner: Any, attr: str, arg: Any, offload: Offload | None = None) -> Any:
    """``owner.<attr>(arg)``: awaited on the loop if async, else run by ``offload``.

    Without ``offload``, the runtime's (``runtime_services``) is used, and failing that
    anyio's worker threads.
    """
    func = getattr(owner, attr)
    if is_async(func):
        return await func(arg)
    if offload is None:
        services = runtime_services.get()
        offload = services.offload if services is not None else None
    if offload is not None:
        result = await offload(attr, arg)
    else:
        result = await anyio.to_thread.run_sync(func, arg, abandon_on_cancel=True)
    if inspect.isawaitable(result):
        result = await result
    return result


async def call_function(
    func: Callable[..., Any],
    *args: Any,
    run_sync: Callable[..., Awaitable[Any]] | None = None,
) -> Any:
    """``func(*args)`` with the same rules; sync code runs by ``await run_sync(func, *args)``
    (a runtime's bounded pool), or in anyio's worker threads."""
    if is_async(func):
        return await func(*args)
    if run_sync is not None:
        result = await run_sync(func, *args)
    else:
        result = await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=True)
    if inspect.isawaitable(result):
        result = await result
    return result
