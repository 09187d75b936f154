"""The spine of the service: where a delivery goes once the webhook route has checked it.

A delivery's way, for a newcomer reading the code in order:

1. ``kbgraph.http.ingest.PostEvents`` checks the KB name, the signature, the body and its events,
   then calls ``DeliveryLog.append(kb, events, message)`` and answers 200 with the
   ``DeliveryResult`` it returns: nothing else of the service is reached from the route.
2. ``append`` makes the delivery durable and decided, in one of three ways:

   - ``StoreLog`` (``[log] kind = "sqlite"``, ``kbgraph.log.sqlite``): ``Store.append_async``
     hands it to the store's writer thread, which decides each event (``kbgraph.store.decide``),
     writes the state and appends the applied events to the log table
     (``kbgraph.store.eventlog.SqliteLog.append``) in one transaction, fsynced before the future
     resolves;
   - ``JetStreamLog`` (``kind = "jetstream"``, one process per node): publishes it as one
     message to the stream; this node's follower applies the stream in order through
     ``Store.submit_from_log`` (the same writer, the same decision code, the same log table)
     and resolves the waiting ``append`` with that message's result;
   - ``WorkerLog`` (``kind = "jetstream"`` with ``--workers N``): publishes it the same way;
     the node's one applier process applies it; the worker reads the result it recorded.

3. Every process's projection follower (``kbgraph.projection.Projections``) reads the log
   table in order (``SqliteLog.read``: whole deliveries) and patches its in-memory graph and
   search index per event; ``append`` wakes it (``on_commit``) when it applied something.

``follow`` starts whatever must run for appends to be answered (JetStream: the connection
and, on a node, the stream's follower); ``problem`` is what ``/readyz`` says about the log;
``close`` stops it. ``vector_share`` says who embeds when several stores follow one log
(JetStream: one process of the cluster, ``kbgraph.log.jetstream.embedder``; the SQLite log has one
store, whose embedder lock suffices). Exactly one log is chosen from the config, in one
function (``kbgraph.log.backends.open_log``); the rest depends on this protocol only. The
refusals every implementation raises are defined here so that a SQLite service never imports
nats-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kbgraph.events import Event
from kbgraph.store import DeliveryResult, WebhookMessage

if TYPE_CHECKING:
    from kbgraph.projection.filler import VectorShare


class LogUnavailable(RuntimeError):
    """The log did not take the delivery, or it is not applied here (yet): 503."""


class DeliverySkipped(RuntimeError):
    """The delivery is one an operator's decision skipped on every node (409)."""


class DeliveryTooLarge(ValueError):
    """The delivery, compressed, is over the NATS servers' ``max_payload`` (413)."""


class DeliveryLog(Protocol):
    """Where deliveries are appended and decided, one per process (see the module's text).

    ``append`` raises the store's refusals (``ReplayRefused`` 401, ``KBLimitReached`` 403),
    ``DeliveryTooLarge`` (413), ``DeliverySkipped`` (409), ``LogUnavailable`` and
    ``StoreBusy``/``StoreClosed`` (503): each leaves nothing acknowledged.
    """

    async def follow(self) -> None:
        """Start what answers appends (returns at once; ``problem`` says until it is ready)."""
        ...

    async def append(
        self, kb: str, events: list[Event], message: WebhookMessage | None
    ) -> DeliveryResult:
        """Make one delivery durable and decided; its result once this process's store holds
        it. An empty delivery stores nothing and answers the KB's position."""
        ...

    def problem(self) -> str | None:
        """Why this log cannot take deliveries now (``/readyz`` says it), or None."""
        ...

    async def close(self) -> None:
        """Stop following; the store is closed by its owner afterwards."""
        ...

    def vector_share(self) -> VectorShare | None:
        """Who computes vectors with a provider outside the process when several stores
        follow this log, started by ``follow``; None: this store's own embedder lock."""
        ...
