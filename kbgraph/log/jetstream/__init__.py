"""The log on NATS JetStream: every node a full replica (``[log] kind = "jetstream"``).

The stream is the one total order of deliveries. A node that takes a delivery does not decide
it: it publishes the delivery as ONE message (the KB, the events as the log encodes them, the
signed webhook message) and awaits JetStream's acknowledgement, which a stream of R replicas
gives once a quorum stored it. Every node follows the stream in order from the position its
own SQLite store recorded and applies each message with the single store's decision code
(``Store.submit_from_log``: ``decide`` and the webhook-id binding, timed by the message's
stream timestamp, never the node's clock), recording the stream sequence in the same
transaction as the state it produced. Same messages, same order, same code: every node
reaches the same state and the same per-KB ``seq``, and the node that took a delivery answers
with the result its own follower computed for that message.

Along its jobs: ``wire`` (what a message carries), ``connect`` (the NATS connection, the
stream and its decision rules), ``consumer`` (reading and applying, failures and operators'
decisions), ``node`` (``JetStreamLog``: a node's lifecycle), ``publisher`` (one delivery to
the stream), ``applier`` and ``worker`` (a node of several workers: one applier process, the
workers' ``WorkerLog``), ``embedder`` (one embedder for the cluster), ``lease`` (which
process it is: signed claims and their rule), ``snapshots`` (putting and restoring them,
trimming the stream), ``snapshotfile`` (a snapshot's bytes: packing, unpacking), ``admin``
(``kbgraph cluster`` commands), ``commands`` (their command line, without nats-py),
``backend`` (the package's face to ``kbgraph.log.backends``).

The names below are loaded on first use: importing the package (``kbgraph.log.jetstream.commands``
does, for ``kbgraph --help``) must not import nats-py, which only ``[log] kind =
"jetstream"`` needs.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

_WHERE: Final = {
    "ApplyFailed": "kbgraph.log.jetstream.consumer",
    "DeliverySkipped": "kbgraph.log",
    "DeliveryTooLarge": "kbgraph.log",
    "JetStreamLog": "kbgraph.log.jetstream.node",
    "LogUnavailable": "kbgraph.log",
    "RulesDiffer": "kbgraph.log.jetstream.connect",
    "StreamBehind": "kbgraph.log.jetstream.consumer",
    "decision_rules": "kbgraph.log.jetstream.connect",
    "decode_message": "kbgraph.log.jetstream.wire",
    "encode_message": "kbgraph.log.jetstream.wire",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
