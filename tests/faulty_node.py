"""``python -m tests.faulty_node serve ...``: ``kbgraph`` whose store cannot apply one message.

A delivery from the stream with an event whose subject starts with ``$KBGRAPH_TEST_FAIL_SUBJECT``
makes the store raise, on every node run this way and on every attempt, as SQLite 3.45's
``malformed JSON`` did (issue 23): the failure a node cannot get past on its own. The product
has no such code path; the tests start nodes through this module instead of ``kbgraph``.
"""

from __future__ import annotations

import os
import sqlite3
import sys

from kbgraph import cli
from kbgraph.store.group import GroupWriter, Pending

FAIL_SUBJECT = "KBGRAPH_TEST_FAIL_SUBJECT"


def install(prefix: str) -> None:
    original = GroupWriter.apply

    def apply(self: GroupWriter, conn: sqlite3.Connection, group: list[Pending]) -> list:
        for pending in group:
            if pending.position is not None and any(
                event.subject.startswith(prefix) for event in pending.events
            ):
                raise sqlite3.OperationalError("malformed JSON (injected by tests.faulty_node)")
        return original(self, conn, group)

    GroupWriter.apply = apply  # type: ignore[method-assign]


if __name__ == "__main__":
    install(os.environ[FAIL_SUBJECT])
    sys.exit(cli.main(sys.argv[1:]))
