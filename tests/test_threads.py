"""ToolThreads: results, exceptions and cancellations reach (or leave) the awaiting caller."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import anyio
import pytest

from kbgraph.threads import LoopSettle, Resolve, ToolThreads, settle_groups


@pytest.mark.anyio
async def test_runs_off_the_loop_and_returns_results_and_errors() -> None:
    threads = ToolThreads(2)
    try:
        loop_thread = threading.get_ident()
        assert await threads.run(threading.get_ident) != loop_thread
        assert await threads.run(lambda: 41 + 1) == 42

        def fails() -> None:
            raise LookupError("not found: x")

        with pytest.raises(LookupError, match="not found: x"):
            await threads.run(fails)
    finally:
        threads.close()


@pytest.mark.anyio
async def test_a_cancelled_caller_does_not_break_the_threads() -> None:
    threads = ToolThreads(1)
    release = threading.Event()
    try:
        slow = threads.run(lambda: release.wait(5))
        with anyio.move_on_after(0.05):
            await slow
        assert slow.cancelled()
        release.set()
        assert await threads.run(lambda: "still serving") == "still serving"
    finally:
        threads.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # ToolThreads hands results back through an asyncio loop


def test_a_group_of_outcomes_wakes_each_loop_once() -> None:
    """The store's writer settles a commit's deliveries with one wake-up per event loop
    (it was one self-pipe write and thread wake-up per delivery); other callbacks are called
    as they are, a failing one or a closed loop never reaches the writer."""
    loop = asyncio.new_event_loop()
    closed = asyncio.new_event_loop()
    wakeups = 0
    real = loop.call_soon_threadsafe

    def counting(*args: Any) -> Any:
        nonlocal wakeups
        wakeups += 1
        return real(*args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    futures = [loop.create_future() for _ in range(5)]
    gone = closed.create_future()
    closed.close()
    plain: list[Any] = []

    def fails(result: Any, exc: BaseException | None) -> None:
        raise RuntimeError("a caller's callback failed")

    outcomes: list[tuple[Resolve, Any, BaseException | None]] = [
        (LoopSettle(loop, f), i, None) for i, f in enumerate(futures[:4])
    ]
    outcomes += [
        (LoopSettle(loop, futures[4]), None, LookupError("refused")),
        (lambda result, exc: plain.append((result, exc)), "direct", None),
        (fails, None, None),
        (LoopSettle(closed, gone), 9, None),
    ]
    futures[1].cancel()  # its client went away: left as it is
    threading.Thread(target=settle_groups, args=(outcomes,)).start()
    try:
        loop.run_until_complete(asyncio.wait(futures, timeout=10))
        assert wakeups == 1
        assert [futures[i].result() for i in (0, 2, 3)] == [0, 2, 3]
        assert futures[1].cancelled()
        assert isinstance(futures[4].exception(), LookupError)
        assert plain == [("direct", None)]
        assert not gone.done()
    finally:
        loop.close()
