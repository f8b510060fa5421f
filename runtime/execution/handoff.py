"""A count of places (request slots, user-code threads) handed over in order of arrival.

Taking a place costs no checkpoint while one is free and nobody waits. A place given back
while someone waits is handed straight to the first waiter (it never becomes free on the
way, so no later arrival takes it first). A waiter cancelled before it got a place leaves
the queue at no cost; one cancelled just as a place was handed to it passes it on.

Used by runtime.serving.admission (request slots) and runtime.execution.offload (user-code
threads); it lives here because execution never imports serving.
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["HandOff"]


class HandOff:
    """``free`` places; ``take_now``/``take`` one, ``give`` it back. Loop-bound: called on
    the event loop only."""

    def __init__(self, free: int) -> None:
        self.free = free
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take_now(self) -> bool:
        """Take a place if one is free and nobody waits for it; never waits."""
        if self.free and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a place, waiting in line for one when none is free."""
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # give() hands its place over: ``free`` never counts it
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed over just as we were cancelled: pass it on
            elif waiter in self._waiters:  # (a give may have dropped it already)
                self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        """Give a place back: to the first waiter still waiting, else to ``free``."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
