"""What the store answers: delivery outcomes, concept states, snapshots, and its errors."""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple

import msgspec


class DeliveryResult(msgspec.Struct, frozen=True):
    accepted: int
    applied: int
    duplicates: int
    stale: int
    ignored: int
    seq: int


class ConceptState(msgspec.Struct, frozen=True):
    id: str
    version: int
    title: str
    type: str
    status: str
    tags: list[str]
    text: str
    links: list[str]  # declared out-links, deduplicated, sorted, also to missing targets
    aliases: list[str] = []


class KBState(msgspec.Struct, frozen=True):
    seq: int
    concepts: list[ConceptState]  # existing concepts only, sorted by id


class StoreSnapshot(msgspec.Struct, frozen=True):
    gid: int  # the log position this state reflects; follow the log from here
    kbs: dict[str, KBState]  # every KB with seq >= 1


class NewerSchema(sqlite3.DatabaseError):
    """The store's schema version is above this kbgraph's: a newer kbgraph wrote it. A
    database error, so every command that reports a store it cannot open reports this too."""


class StoreClosed(RuntimeError):
    """The store was closed: no more deliveries are taken."""


class StoreBusy(RuntimeError):
    """Another process held the write lock for longer than ``BUSY_RETRY_SECONDS``."""


class KBLimitReached(RuntimeError):
    """The delivery would create a KB beyond ``[limits] max_kbs``: nothing was stored (403)."""


class LogCut(RuntimeError):
    """The records a follower asked for were cut from the log: rebuild from a newer state."""


class ReplayRefused(RuntimeError):
    """The delivery's webhook-id was accepted for another KB within the window (401)."""


class WebhookMessage(NamedTuple):
    """A signed delivery as Standard Webhooks names it: its ``webhook-id`` and its body's
    sha256. A replay carries both unchanged (the signature covers them); another sender that
    happens to pick the same ``webhook-id`` sends another body."""

    id: str
    digest: bytes


class KBColumns(msgspec.Struct):
    """One KB's existing concepts as columns (the first build's input), sorted by id.

    ``links``: per chunk of concepts, ``kbgraph.store.columns.split_json_arrays`` of their stored
    JSON lists (how many targets each declares, and the target ids as one encoded column), so
    a million concepts' eight million target ids are flat bytes, never Python strings;
    ``ids``, ``titles`` and ``texts`` are ``kbgraph.store.columns.StringColumn`` (flat UTF-8, as a
    checkpoint holds them, decoded when read);
    ``tags`` and ``aliases`` are decoded, every empty one the same shared, never mutated,
    list.
    """

    seq: int
    ids: Any  # kbgraph.store.columns.StringColumn
    versions: list[int]
    titles: Any  # kbgraph.store.columns.StringColumn
    types: list[str]
    statuses: list[str]
    tags: list[list[str]]
    texts: Any  # kbgraph.store.columns.StringColumn
    aliases: list[list[str]]
    links: list[tuple[Any, Any, Any]]  # (counts, blob, off) numpy arrays per chunk


class ColumnSnapshot(msgspec.Struct):
    gid: int  # the log position this state reflects; follow the log from here
    kbs: dict[str, KBColumns]  # every KB with seq >= 1
