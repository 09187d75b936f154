"""One embedder for a JetStream cluster (``kbgraph.jetstream.embedder``): three nodes (one of
them two workers beside an applier) with a remote provider that counts what it is asked; each
text is asked once for the whole cluster, and every node's store ends with the same vector rows,
byte for byte, carried in the stream."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtest.embed_provider import CountingProvider
from tests import webhook_client as wc
from tests.nats_cluster import running_cluster
from tests.test_jetstream import AUTH, KB, SECRET, Node

pytestmark = pytest.mark.slow

STREAM = "t-vec"
FILL_SECONDS = 120.0


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
        finally:
            for node in nodes:
                node.stop()
