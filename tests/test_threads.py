"""ToolThreads: results, exceptions and cancellations reach (or leave) the awaiting caller."""

from __future__ import annotations

import threading

import anyio
import pytest

from kbgraph.threads import ToolThreads


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
