"""``[log] kind = "sqlite"``: the store's own log table is the delivery log (one machine)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kbgraph.events import Event
from kbgraph.store import DeliveryResult, Store, WebhookMessage

log = logging.getLogger(__name__)


class StoreLog:
    """``[log] kind = "sqlite"``: the store's own log table is the log; ``append`` commits
    the delivery with its state in one transaction and wakes the projection's follower."""

    def __init__(self, store: Store, on_commit: Callable[[], None]) -> None:
        self.store = store
        self.on_commit = on_commit

    async def follow(self) -> None:
        """Nothing to start: the projection reads the table the writer appends to."""

    async def append(
        self, kb: str, events: list[Event], message: WebhookMessage | None
    ) -> DeliveryResult:
        result = await self.store.append_async(kb, events, message=message)
        if result.applied:
            try:
                self.on_commit()
            except Exception:  # the delivery is durable: the follower catches up on its own
                log.exception("on_commit hook failed")
        return result

    def problem(self) -> str | None:
        """Always None: whether the store can write is ``kbgraph.http.health.WriteProbe``'s."""
        return None

    async def close(self) -> None:
        """Nothing to stop."""

    def vector_share(self) -> None:
        """None: one store, one embedder lock."""
        return None
