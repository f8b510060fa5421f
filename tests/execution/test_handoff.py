"""HandOff: places taken at no cost while free, handed over in order of arrival, and
never lost to a waiter cancelled just as one was handed to it."""

from __future__ import annotations

import asyncio

from runtime.execution.handoff import HandOff


async def test_free_places_are_taken_at_once_then_handed_over_in_order() -> None:
    places = HandOff(1)
    assert places.take_now()
    assert not places.take_now() and places.free == 0
    order: list[int] = []

    async def wait(n: int) -> None:
        await places.take()
        order.append(n)

    waiters = [asyncio.create_task(wait(n)) for n in range(3)]
    await asyncio.sleep(0)  # (each is in line now)
    for _ in range(3):
        places.give()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]
    assert places.free == 0  # handed over: never free on the way
    places.give()
    assert places.free == 1


async def test_a_place_handed_to_a_cancelled_waiter_passes_on() -> None:
    places = HandOff(0)
    first = asyncio.create_task(places.take())
    second = asyncio.create_task(places.take())
    await asyncio.sleep(0)
    places.give()  # handed to the first...
    first.cancel()  # ...cancelled before it ran: the place goes to the second
    await asyncio.gather(first, return_exceptions=True)
    await second
    assert places.free == 0


async def test_a_waiter_cancelled_in_line_leaves_it() -> None:
    places = HandOff(0)
    waiter = asyncio.create_task(places.take())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    places.give()
    assert places.free == 1  # nobody in line took it
    assert places.take_now()
