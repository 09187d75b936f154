"""Where this store stands in a replicated log (NATS JetStream): one position per stream,
recorded in the same transaction as the state it produced, so a restart resumes exactly after
the last message applied and a gap or a repeat is refused."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final, Protocol

from kbgraph.store import statements as sql
from kbgraph.store.model import DeliveryResult, KBLimitReached, ReplayRefused

DECIDED: Final = (ReplayRefused, KBLimitReached)  # a delivery's own refusal: a decision


class LogOutOfOrder(RuntimeError):
    """A delivery from a replicated log does not follow the position the store recorded."""


class Positioned(Protocol):
    position: tuple[str, int] | None  # (stream, sequence) of a delivery from a replicated log


def check(conn: sqlite3.Connection, group: Sequence[Positioned]) -> dict[str, int]:
    """The last log position per stream in ``group``, after checking that its deliveries
    follow the stored position one by one (none skipped, none applied twice)."""
    last: dict[str, int] = {}
    for pending in group:
        if pending.position is None:
            continue
        stream, seq = pending.position
        if stream not in last:
            row = conn.execute(sql.POSITION_GET, (stream,)).fetchone()
            last[stream] = 0 if row is None else row[0]
        if seq != last[stream] + 1:
            raise LogOutOfOrder(f"stream {stream}: sequence {seq} after {last[stream]}")
        last[stream] = seq
    return last


def record(
    conn: sqlite3.Connection,
    group: Sequence[Positioned],
    outcomes: list[tuple[DeliveryResult | None, BaseException | None]],
    last: dict[str, int],
) -> None:
    """Store the positions with the state, unless a logged delivery failed for a reason that
    another node would not share (I/O, a bug): then the whole group must not commit."""
    for pending, (_, exc) in zip(group, outcomes, strict=True):
        if pending.position is not None and exc is not None and not isinstance(exc, DECIDED):
            raise exc
    for stream, seq in last.items():
        conn.execute(sql.POSITION_SET, (stream, seq))
