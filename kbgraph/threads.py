"""Running the tools off the event loop, cheaply.

Algorithms run off the event loop (docs/architecture.md). ``loop.run_in_executor`` with a
``ThreadPoolExecutor`` costs ~110-130 µs of CPU per call here (a ``concurrent.futures.Future``
with its condition variable, ``wrap_future`` chaining, callback hops), several times the cost
of a graph_path. ``ToolThreads`` keeps only what a hand-off needs: a C ``SimpleQueue`` into the
threads and one ``call_soon_threadsafe`` back to an asyncio future (measured ~70-80 µs per call
on this VM, most of it the two thread wake-ups). Under load a thread takes queued calls back to
back without sleeping in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

Resolve = Callable[[Any, BaseException | None], None]
_Call = tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]]


class ToolThreads:
    """A fixed set of daemon threads running zero-argument callables for the event loop."""

    def __init__(self, count: int, name: str = "kbgraph-tool") -> None:
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``fn`` in one of the threads; await the returned future for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, loop, future))
        return future

    def close(self) -> None:
        """Let every thread finish its current call, then stop them."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        while (call := self._queue.get()) is not None:
            fn, loop, future = call
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting request, not lost here
                loop.call_soon_threadsafe(settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(settle, future, result, None)


def settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """Resolve ``future`` on its loop with a result from another thread, unless it is done
    already (its awaiting client went away and cancelled it)."""
    if future.done():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


class LoopSettle:
    """A delivery's outcome handed from the store's writer thread to an asyncio future.

    Called alone it wakes the future's loop once (``call_soon_threadsafe``: a write to the
    loop's self-pipe and a thread wake-up). The writer settles a whole group with
    ``settle_groups`` instead: one wake-up per loop for every delivery of a commit (~40 single
    deliveries share one under load)."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self.loop = loop
        self.future = future

    def __call__(self, result: Any, exc: BaseException | None) -> None:
        self.loop.call_soon_threadsafe(settle, self.future, result, exc)


def settle_groups(outcomes: list[tuple[Resolve, Any, BaseException | None]]) -> None:
    """Call each ``(resolve, result, exc)``; the ``LoopSettle`` ones settled with one wake-up
    per loop. An outcome that cannot be delivered (its loop closed) is dropped, never raised
    into the writer."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, Any]]] = {}
    for resolve, result, exc in outcomes:
        if isinstance(resolve, LoopSettle):
            by_loop.setdefault(resolve.loop, []).append((resolve.future, result, exc))
        else:
            with contextlib.suppress(Exception):
                resolve(result, exc)
    for loop, settles in by_loop.items():
        with contextlib.suppress(Exception):  # a closed loop
            loop.call_soon_threadsafe(_settle_all, settles)


def _settle_all(settles: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, exc in settles:
        settle(future, result, exc)
