"""One embedder for a JetStream cluster (``kbgraph.log.jetstream.embedder``): three nodes (one of
them two workers beside an applier) with a remote provider that counts what it is asked; each
text is asked once for the whole cluster, and every node's store ends with the same vector rows,
byte for byte, carried in the stream; the lease's holder killed, another process takes over
and the next change is asked once too."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kbgraph.embeddings import concept_text
from loadtest.embed_provider import CountingProvider
from tests import webhook_client as wc
from tests.jetstream_nodes import AUTH, FILL_SECONDS, HOLDS, KB, Node
from tests.nats_cluster import running_cluster
from tests.support import SECRET

pytestmark = pytest.mark.slow

STREAM = "t-vec"


@contextlib.contextmanager
def provider() -> Iterator[CountingProvider]:
    counting = CountingProvider()
    counting.start()
    try:
        yield counting
    finally:
        counting.stop()


def complete(node: Node) -> bool:
    """``/status`` says complete on a few fresh connections (each worker of the node asked)."""
    for _ in range(4):
        answer = httpx.get(f"{node.url}/v1/kbs/{KB}/status", headers=AUTH, timeout=5)
        if answer.status_code != 200 or answer.json().get("vectors") != "complete":
            return False
    return True


def rows(node: Node) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(node.folder / "kb.db")) as conn:
        return conn.execute(
            "SELECT kb, concept, model, text_hash, vec, problem FROM vector ORDER BY kb, concept"
        ).fetchall()


def filled(nodes: list[Node], count: int) -> list[list[tuple[object, ...]]]:
    """Until every node is complete and holds ``count`` rows; each node's rows."""
    deadline = time.monotonic() + FILL_SECONDS
    while time.monotonic() < deadline:
        if all(complete(node) for node in nodes):
            stored = [rows(node) for node in nodes]
            if all(len(r) == count for r in stored):
                return stored
        time.sleep(0.2)
    raise AssertionError(f"not filled: {[len(rows(n)) for n in nodes]} rows of {count}")


def post(url: str, events: list[dict]) -> None:
    body, headers = wc.delivery(SECRET, events)
    answer = httpx.post(f"{url}/v1/kbs/{KB}/events", content=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text


def test_a_cluster_embeds_each_text_once_and_every_node_stores_the_same_bytes(
    tmp_path: Path,
) -> None:
    with provider() as counting, running_cluster(tmp_path / "nats") as cluster:
        nodes = [
            Node(tmp_path / f"node{i}", cluster, STREAM, workers=2 if i == 0 else 1)
            for i in range(3)
        ]
        for node in nodes:
            with node.config.open("a") as out:
                out.write(f'[embeddings]\nprovider = "openai"\nurl = "{counting.url}"\nbatch = 8\n')
        try:
            for node in nodes:
                node.start()
            created = 24
            for i in range(created):  # each node takes some of the deliveries
                event = wc.upsert(f"infra/c{i}", 1, title=f"c{i}", text=f"alpha text {i}")
                post(nodes[i % 3].url, [event])
            first = filled(nodes, created)
            # who holds the lease, from the line it logged (early: a node keeps 40 lines)
            holders = [n for n in nodes if n.proc is not None and HOLDS in n.proc.tail()]
            assert len(holders) == 1, [n.proc and n.proc.tail()[-500:] for n in nodes]
            holder = holders[0]
            assert all(r == first[0] for r in first)  # the same bytes on every node
            assert len(counting.asked) == created, counting.asked
            assert len(set(counting.asked)) == created

            changed = 6
            for i in range(changed):
                event = wc.upsert(f"infra/c{i}", 2, title=f"c{i}", text=f"beta text {i}")
                post(nodes[(i + 1) % 3].url, [event])
            deadline = time.monotonic() + FILL_SECONDS
            while first[0] == rows(nodes[0]) and time.monotonic() < deadline:
                time.sleep(0.2)
            second = filled(nodes, created)
            assert all(r == second[0] for r in second)
            assert second[0] != first[0]
            assert len(counting.asked) == created + changed, counting.asked
            assert len(set(counting.asked)) == created + changed  # none asked twice

            answers = [
                httpx.get(
                    f"{node.url}/v1/kbs/{KB}/search",
                    params={"q": "beta text", "mode": "vector"},
                    headers=AUTH,
                    timeout=10,
                )
                for node in nodes
            ]
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            assert all(a.content == answers[0].content for a in answers)

            asked = len(counting.asked)  # the three questions' vectors among them

            # the holder killed (no goodbye): its lease expires, another process takes it
            assert holder.proc is not None
            os.killpg(holder.proc.pid, signal.SIGKILL)
            holder.proc.wait(30)
            holder.proc = None
            alive = [n for n in nodes if n is not holder]
            post(alive[0].url, [wc.upsert("infra/c9", 3, title="c9", text="gamma after")])
            deadline = time.monotonic() + FILL_SECONDS
            while len(counting.asked) == asked and time.monotonic() < deadline:
                time.sleep(0.2)
            third = filled(alive, created)
            assert all(r == third[0] for r in third) and third[0] != second[0]
            expected = concept_text("c9", [], [], "gamma after")
            assert counting.asked[asked:] == [expected], counting.asked[asked:]
            assert any(n.proc is not None and HOLDS in n.proc.tail() for n in alive)
        finally:
            for node in nodes:
                node.stop()
