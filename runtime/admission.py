"""Admission control: at most ``concurrency`` requests processed at once, at most ``queue``
more admitted and waiting for a slot, and an immediate 503 beyond that; and a budget of
body bytes held at once (``max_buffered``), counted while bodies are being read.

A slot is a count, not a token owned by a task: the request's task takes it, and whoever
ends the request gives it back (the request's task, or the deadline's responder when that
task ignores its cancellation).
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["Admission"]


class Admission:
    def __init__(self, concurrency: int, queue: int, max_buffered: int = 0) -> None:
        self.concurrency = concurrency
        self.capacity = concurrency + queue
        self.max_buffered = max_buffered  # body bytes held at once (0: no budget)
        self.buffered = 0
        self.admitted = 0  # processing, waiting for a slot, or still sending its body
        self.in_flight = 0  # holding a slot
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def queued(self) -> int:
        return self.admitted - self.in_flight

    @property
    def full(self) -> bool:
        return self.admitted >= self.capacity

    def hold_body(self, size: int) -> bool:
        """Count ``size`` more body bytes as held, unless that passes the budget."""
        if self.max_buffered and self.buffered + size > self.max_buffered:
            return False
        self.buffered += size
        return True

    def release_body(self, size: int) -> None:
        self.buffered -= size

    def try_admit(self) -> bool:
        if self.admitted >= self.capacity:
            return False
        self.admitted += 1
        return True

    def leave(self) -> None:
        self.admitted -= 1

    async def acquire_slot(self) -> None:
        if self.in_flight < self.concurrency and not self._waiters:
            self.in_flight += 1  # the common case: no checkpoint, no waiting
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release_slot() hands its slot over: in_flight stays counted
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release_slot()  # handed over just as we were cancelled: pass it on
            elif waiter in self._waiters:  # (a release may have dropped it already)
                self._waiters.remove(waiter)
            raise

    def release_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1
