"""A writer-preferring readers-writer lock.

Many readers (request handlers in worker threads, whose numba kernels release the GIL) may hold
the lock at once; one writer (the projection's follower thread) holds it alone. Writer
preference: once a writer is waiting, new readers queue behind it, so a steady stream of
requests can never starve the follower. Hand-off: releasing the write lock admits every reader
queued at that moment before any next writer (a follower draining a backlog re-acquires at
once), so a reader waits at most for the readers already inside plus one write section.

Not reentrant: a thread holding the read lock must not take it again (with a writer waiting
between the two acquisitions it would deadlock), nor take the write lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0  # inside, or admitted by a release_write and about to wake
        self._writer = False
        self._writers_waiting = 0
        self._readers_waiting = 0
        self._generation = 0  # bumped by every release_write

    def acquire_read(self) -> None:
        with self._cond:
            if not self._writer and not self._writers_waiting:
                self._readers += 1
                return
            generation = self._generation
            self._readers_waiting += 1
            while self._generation == generation:
                self._cond.wait()
            # release_write counted this reader in _readers already.

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._readers += self._readers_waiting  # hand-off to the queued readers
            self._readers_waiting = 0
            self._generation += 1
            self._cond.notify_all()

    def queued(self) -> tuple[int, int]:
        """(readers, writers) waiting for the lock at this instant."""
        with self._cond:
            return self._readers_waiting, self._writers_waiting

    @contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()
