"""Admission control: at most ``concurrency`` requests processed at once, at most ``queue``
more admitted and waiting for a slot, and an immediate 503 beyond that; and a budget of
body bytes held at once (``max_buffered``), counted while bodies are being read, and then
also for what a body is estimated to take once parsed (:func:`parsed_extra`).

A slot is a count, not a token owned by a task: the request's task takes it, and whoever
ends the request gives it back (the request's task, or the deadline's responder when that
task ignores its cancellation).
"""

from __future__ import annotations

from runtime.execution.handoff import HandOff

__all__ = ["PARSED_FLOOR", "PARSE_COSTS", "Admission", "parsed_extra", "scan_above"]

# Bytes a parsed body takes, by route: (per ``{`` or ``[``, per ``,``, per ``:``) of its
# JSON outside strings, its strings' characters left out (they weigh about what they do in
# JSON); measured over bodies of tiny values (``{}``, ``{"a":1}``, ``[[]]``, ``"ab"``, ``1.5``,
# ``"k1":1.5``, messages, Responses API items: 3 MB of each), the most any of them took,
# with a margin. /api/v1 copies each message; a group reward makes a model of each agent
# output; slime a message of each item of a prompt list, even of ``1``; Gym validates each
# item, makes a message of it (three dicts for a function call) and echoes the row;
# "plain": parsed only.
PARSE_COSTS = {
    "api": (224, 96, 128),
    "group": (832, 112, 160),
    "slime": (128, 544, 64),
    "nemo-gym": (1024, 112, 96),
    "plain": (160, 96, 96),
}
# Bytes of parsed structure per /api/v1 body never charged: a small body is never scanned
# (the echo reward's 200 bytes cost no scan), at the price of this much per request held
# unbudgeted (24 MiB with the default 384 admitted).
PARSED_FLOOR = 64 * 1024


class Admission:
    def __init__(self, concurrency: int, queue: int, max_buffered: int = 0) -> None:
        self.concurrency = concurrency
        self.capacity = concurrency + queue
        self.max_buffered = max_buffered  # body bytes held at once (0: no budget)
        self.buffered = 0
        self.admitted = 0  # processing, waiting for a slot, or still sending its body
        self._slots = HandOff(concurrency)

    @property
    def in_flight(self) -> int:
        """Requests holding a slot."""
        return self.concurrency - self._slots.free

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
        if not self._slots.take_now():  # the common case takes one: no checkpoint
            await self._slots.take()  # in line; release_slot() hands its slot over

    def release_slot(self) -> None:
        self._slots.give()


def scan_above(costs: tuple[int, int, int], floor: int) -> int:
    """The size up to which parsed_extra is 0 for any JSON, unscanned: a body holds at most
    one container per 2 bytes (it opens and closes), one comma per byte and one colon per
    4 (``"":0,``)."""
    return floor // (max(costs[0] // 2 + 1, costs[1]) + costs[2] // 4)


def parsed_extra(
    raw: bytes, costs: tuple[int, int, int], floor: int = 0, exact: bool = False
) -> int:
    """What ``raw`` is estimated to take once parsed beyond twice its length (the share
    the README's bound gives every body: its strings weigh about what they do in JSON)
    and ``floor``: ``costs`` (per container, comma, colon) times those in it: one C-level
    pass that keeps only them (and quotes), then counts on what it kept. ``exact``: those
    in its strings left out (LaTeX and code hold braces and commas that cost nothing): a
    few passes more, so only for a body the first estimate would refuse; only when its
    strings are few (the pieces cost memory too: else their marks count)."""
    size = len(raw)
    if size <= scan_above(costs, floor):
        return 0
    marks = raw.translate(_MARKS, _NOT_MARKS)
    if len(marks) * max(costs) <= size + floor:  # too few to count one by one
        return 0
    extra = _structure(marks, costs) - size - floor
    if exact and extra > 0 and 0 < marks.count(b'"') <= size // 8:
        if b"\\" in raw:  # escaped backslashes and quotes left out, so that quotes pair up
            raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
            marks = raw.translate(_MARKS, _NOT_MARKS)
        extra = _structure(b"".join(marks.split(b'"')[::2]), costs) - size - floor
    return max(0, extra)


# What is counted, "[" as "{" (one count for both), and quotes; the rest is deleted.
_MARKS = bytes.maketrans(b"[", b"{")
_NOT_MARKS = bytes(sorted(set(range(256)) - set(b'{[,:"')))


def _structure(marks: bytes, costs: tuple[int, int, int]) -> int:
    return (
        marks.count(b"{") * costs[0] + marks.count(b",") * costs[1] + marks.count(b":") * costs[2]
    )
