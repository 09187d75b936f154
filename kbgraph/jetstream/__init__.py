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
stream and its decision rules), ``follower`` (reading and applying, failures and operators'
decisions), ``node`` (``JetStreamLog``: a node's lifecycle and publishing), ``admin``
(``kbgraph cluster`` commands), ``errors`` (the refusals the webhook endpoint answers with).
"""

from __future__ import annotations

import importlib
from typing import Any, Final

from kbgraph.jetstream.errors import DeliverySkipped, DeliveryTooLarge, LogUnavailable

# Loaded on first use: they import nats-py (the ``jetstream`` extra), the errors above do not
_LAZY: Final = {
    "ApplyFailed": "follower",
    "JetStreamLog": "node",
    "RulesDiffer": "connect",
    "StreamBehind": "follower",
    "decision_rules": "connect",
    "decode_delivery": "wire",
    "encode_delivery": "wire",
}

__all__ = [
    "ApplyFailed",
    "DeliverySkipped",
    "DeliveryTooLarge",
    "JetStreamLog",
    "LogUnavailable",
    "RulesDiffer",
    "StreamBehind",
    "decision_rules",
    "decode_delivery",
    "encode_delivery",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
