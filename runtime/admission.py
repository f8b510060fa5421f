"""Admission control: at most ``concurrency`` requests processed at once, at most ``queue``
more admitted and waiting for a slot, and an immediate 503 beyond that. The decision is
made before the body is read, so an overloaded worker spends nothing on a request it
cannot take."""

from __future__ import annotations

import anyio

__all__ = ["Admission"]


class Admission:
    def __init__(self, concurrency: int, queue: int) -> None:
        self._slots = anyio.CapacityLimiter(concurrency)
        self.capacity = concurrency + queue
        self.admitted = 0  # processing, waiting for a slot, or still sending its body

    @property
    def in_flight(self) -> int:
        return self._slots.borrowed_tokens

    @property
    def queued(self) -> int:
        return self.admitted - self._slots.borrowed_tokens

    def try_admit(self) -> bool:
        if self.admitted >= self.capacity:
            return False
        self.admitted += 1
        return True

    def leave(self) -> None:
        self.admitted -= 1

    async def acquire_slot(self) -> None:
        try:
            self._slots.acquire_nowait()  # the common case: no checkpoint, no waiting
        except anyio.WouldBlock:
            await self._slots.acquire()

    def release_slot(self) -> None:
        self._slots.release()
