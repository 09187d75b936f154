"""Webhook bodies in flight in this process, bounded by ``[limits] max_inflight_ingest_bytes``:
what ``kbgraph.http.ingest`` reserves as a delivery's bytes arrive (past the bound: 503).
"""

from __future__ import annotations


class InflightBytes:
    """Delivery bodies being read or decoded in this process, bounded (event loop only).

    A delivery takes its bytes as they arrive (``Reservation``), not what it declares, so a
    client that declares a large body and trickles it holds only what it sent (and the server's
    body deadline, ``kbgraph.http.server``, ends it); one delivery alone is always let in.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reservation(self) -> Reservation:
        return Reservation(self)


class Reservation:
    """One delivery's share of ``InflightBytes``: ``take`` as bytes arrive, ``release`` once."""

    def __init__(self, pool: InflightBytes) -> None:
        self.pool = pool
        self.held = 0

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes; False when other deliveries hold the room."""
        pool = self.pool
        if pool.used > self.held and pool.used + size > pool.limit:
            return False
        pool.used += size
        self.held += size
        return True

    def release(self) -> None:
        self.pool.used -= self.held
        self.held = 0
