"""The store: the event log and the current state of every KB, the source of truth.

Along its jobs: ``sqlite`` (``Store``: one SQLite file, its connections and the group-commit
writer), ``decide`` (the append decision of docs/events.md, pure), ``schema`` (tables,
version, migrations), ``statements`` (the SQL a group runs), ``model`` (what it answers).
"""

from kbgraph.store.eventlog import LogRecord
from kbgraph.store.group import MadeAhead
from kbgraph.store.model import (
    ConceptState,
    DeliveryResult,
    KBLimitReached,
    KBState,
    LogCut,
    ReplayRefused,
    StoreBusy,
    StoreClosed,
    StoreSnapshot,
    WebhookMessage,
)
from kbgraph.store.sqlite import Store

__all__ = [
    "ConceptState",
    "DeliveryResult",
    "KBLimitReached",
    "KBState",
    "LogCut",
    "LogRecord",
    "MadeAhead",
    "ReplayRefused",
    "Store",
    "StoreBusy",
    "StoreClosed",
    "StoreSnapshot",
    "WebhookMessage",
]
