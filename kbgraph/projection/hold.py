"""The follower's hold: after a small batch, wait a little for more commits before reading.

Under a stream of single deliveries the store commits a group every ~10 ms and the follower
would read the log after each one, paying a read's fixed cost (the log read, the KB's write
lock, the mentions' and vectors' settle, the announce: ~300 us of CPU) for a few records.
After a batch under ``HOLD_BELOW`` records, ``Hold.after`` waits up to ``seconds`` (the
service's, with the local log only: ``HOLD_SECONDS``), so that one read takes several
commits. Readers that asked for a seq do not pay for it: ``asked`` (every ``X-Min-Seq``
request, ``Projections.wait_for``) ends a hold under way and none starts for ``quiet``
seconds after it, since a read sent after a 200 would otherwise wait for the held batch.
Over JetStream a 200 waits for this node's follower: the hold is off there (0 seconds).
"""

from __future__ import annotations

import threading
import time
from typing import Final

HOLD_SECONDS: Final = 0.010  # ~the store's group commit under load (its fsync ~4 ms)
HOLD_BELOW: Final = 256  # records: a batch this large pays its fixed cost under 10 %
HOLD_QUIET: Final = 1.0  # seconds after an X-Min-Seq request without a hold


class Hold:
    """When the follower waits before its next read (see the module's text)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.quiet = HOLD_QUIET
        self._asked = -HOLD_QUIET  # time.monotonic() of the last ``asked``
        self._hurry = threading.Event()  # ends a hold under way

    def asked(self) -> None:
        """A request waits (or may soon) for a seq: no hold now, nor for ``quiet`` seconds."""
        self._asked = time.monotonic()
        self._hurry.set()

    def end(self) -> None:
        """End a hold under way: the follower stops (its ``stopping`` set before this)."""
        self._hurry.set()

    def after(self, records: int, stopping: threading.Event) -> bool:
        """After a batch of ``records``: wait up to ``seconds`` when it was small and no
        request asked for a seq lately, unless ``stopping``; whether it held."""
        if not 0 < records < HOLD_BELOW or self.seconds <= 0:
            return False
        self._hurry.clear()  # an ``asked`` or ``end`` from here on sets it
        if time.monotonic() - self._asked < self.quiet or stopping.is_set():
            return False
        self._hurry.wait(self.seconds)
        return True
