"""The cluster embedder against someone holding a node's NATS credentials (issue 48, cases 1
and 2), on the secured loopback cluster:

- a ``_vectors`` message captured and published again after the concept's text changed (its
  MAC valid: it is the embedder's own message) changes no row on any node, and the nodes agree
  after restarts without asking the provider again;
- writing the lease bucket (``<stream>-embedder``: its old ``holder`` key, junk over every
  claim, old claims put back) stalls nothing: every node gets its vectors;
- a holder that renews its claim but produces no vectors (its provider fails for it alone)
  is routed around within seconds: the other node embeds, both fill."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.js.errors
import pytest

from kbgraph.log.jetstream import lease, wire
from kbgraph.store import Store
from loadtest.embed_provider import CountingProvider
from tests import webhook_client as wc
from tests.jetstream_nodes import AUTH, FILL_SECONDS, HOLDS, KB, SECRET, Node, wait_caught_up
from tests.nats_cluster import NatsCluster

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def provider(unavailable_to: str | None = None) -> Iterator[CountingProvider]:
    counting = CountingProvider(unavailable_to=unavailable_to)
    counting.start()
    try:
        yield counting
    finally:
        counting.stop()


def node_with(folder: Path, cluster: NatsCluster, stream: str, url: str, key: str = "") -> Node:
    """A node embedding with the provider at ``url``; ``key``: the variable holding the API key
    it sends (its name is not part of the model's: the nodes' rows are alike)."""
    node = Node(folder, cluster, stream)
    with node.config.open("a") as out:
        out.write(
            f'[embeddings]\nprovider = "openai"\nurl = "{url}"\nbatch = 8\nretries = 0\n'
            f'timeout_seconds = 5\napi_key_env = "{key}"\n'
        )
    return node


def status(node: Node) -> dict[str, Any]:
    answer = httpx.get(f"{node.url}/v1/kbs/{KB}/status", headers=AUTH, timeout=5)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def rows(node: Node) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(node.folder / "kb.db")) as conn:
        return conn.execute(
            "SELECT kb, concept, model, text_hash, vec, problem FROM vector ORDER BY kb, concept"
        ).fetchall()


def filled(nodes: list[Node], count: int, seconds: float = FILL_SECONDS) -> float:
    """Until every node says complete and holds ``count`` rows; the seconds it took."""
    began = time.monotonic()
    while time.monotonic() < began + seconds:
        if all(status(n).get("vectors") == "complete" and len(rows(n)) == count for n in nodes):
            return time.monotonic() - began
        time.sleep(0.2)
    logs = [n.proc.tail()[-3000:] for n in nodes if n.proc is not None]
    raise AssertionError(
        f"not filled in {seconds} s: {[(status(n), len(rows(n))) for n in nodes]} {logs}"
    )


def post(node: Node, events: list[dict[str, Any]]) -> None:
    body, headers = wc.delivery(SECRET, events)
    answer = httpx.post(f"{node.url}/v1/kbs/{KB}/events", content=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text


async def as_node(cluster: NatsCluster, stream: str) -> Any:
    """A connection with the stream's node credentials (no cluster secret)."""
    return await asyncio.wait_for(
        nats.connect(
            servers=cluster.urls,
            user=cluster.accounts.node_user(stream),
            password=cluster.accounts.node_password,
            tls=cluster.tls_context(),
        ),
        10,
    )


def vectors_messages(cluster: NatsCluster, stream: str) -> list[tuple[bytes, dict[str, str]]]:
    """Every ``_vectors`` message of the stream: (payload, headers), in order."""

    async def read() -> list[tuple[bytes, dict[str, str]]]:
        nc = await cluster.connect()
        try:
            js = nc.jetstream(timeout=5)
            last = int((await js.stream_info(stream)).state.last_seq)
            found = []
            for seq in range(1, last + 1):
                raw = await js.get_msg(stream, seq)
                if raw.subject == wire.vectors_subject(stream):
                    found.append((raw.data or b"", dict(raw.headers or {})))
            return found
        finally:
            await nc.close()

    return asyncio.run(read())


def test_a_replayed_vectors_message_changes_no_row(
    shared_cluster: NatsCluster, tmp_path: Path
) -> None:
    cluster, stream = shared_cluster, "t-vrep"
    with provider() as counting:
        nodes = [node_with(tmp_path / f"n{i}", cluster, stream, counting.url) for i in range(2)]
        try:
            for node in nodes:
                node.start()
            post(nodes[0], [wc.upsert(f"infra/c{i}", 1, text=f"alpha {i}") for i in range(4)])
            filled(nodes, 4)
            captured = vectors_messages(cluster, stream)
            old = {row[3] for row in rows(nodes[0])}  # the alpha texts' hashes
            post(nodes[1], [wc.upsert(f"infra/c{i}", 2, text=f"beta {i}") for i in range(4)])
            deadline = time.monotonic() + FILL_SECONDS
            while any(row[3] in old for n in nodes for row in rows(n)):
                assert time.monotonic() < deadline, "the changed texts got no vectors"
                time.sleep(0.2)
            filled(nodes, 4)
            before, asked = [rows(n) for n in nodes], len(counting.asked)
            assert before[0] == before[1]

            async def replay() -> None:  # the embedder's own messages, MAC and all
                nc = await as_node(cluster, stream)
                try:
                    js = nc.jetstream(timeout=5)
                    for payload, headers in captured:
                        headers[wire.MSG_ID] = secrets.token_hex(16)
                        await js.publish(wire.vectors_subject(stream), payload, headers=headers)
                finally:
                    await nc.close()

            asyncio.run(replay())
            wait_caught_up(nodes, cluster)
            assert [rows(n) for n in nodes] == before  # no row changed on any node
            assert all(status(n)["vectors"] == "complete" for n in nodes)
            for node in nodes:  # each replayed message noted alike: its rows all stale
                with Store(node.folder / "kb.db", read_only=True) as store:
                    notes = [d for _, k, d in store.stream_notes(stream) if k == "vectors"]
                replayed = [note.rsplit(": ", 1)[1] for note in notes[-len(captured) :]]
                assert sum(int(r.split()[-2]) for r in replayed) == 4, notes
                assert all(r.startswith("0 taken, 0 held already,") for r in replayed), notes

            for node in nodes:  # restarted, every node agrees, and nothing is asked again
                node.stop()
            for node in nodes:
                node.start()
            filled(nodes, 4)
            assert [rows(n) for n in nodes] == before
            assert len(counting.asked) == asked
        finally:
            for node in nodes:
                node.stop()


class LeaseWriter:
    """Someone with a node's credentials writing the lease bucket as fast as it likes: the
    ``holder`` key (the lease of old), junk over every claim, and each claim's first value put
    back (an old, validly signed claim replayed)."""

    def __init__(self, cluster: NatsCluster, stream: str) -> None:
        self.cluster, self.stream = cluster, stream
        self.writes = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.main, daemon=True)

    def main(self) -> None:
        try:
            asyncio.run(self.run())
        except BaseException as exc:  # the test says it, not a thread's traceback
            self.error = exc

    async def run(self) -> None:
        nc = await as_node(self.cluster, self.stream)
        try:
            js = nc.jetstream(timeout=5)
            bucket = f"{self.stream}-embedder"
            try:
                kv = await js.key_value(bucket)
            except nats.js.errors.NotFoundError:
                kv = await js.create_key_value(bucket=bucket, history=1, ttl=10.0)
            first: dict[str, bytes] = {}
            turn = 0
            while not self.stopping.is_set():
                await kv.put("holder", b"attacker")
                for key, value in await lease.entries(js, self.stream):
                    first.setdefault(key, value)
                    await kv.put(key, first[key] if turn % 2 else b"junk")
                    self.writes += 1
                turn += 1
                self.writes += 1
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    def __enter__(self) -> LeaseWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)


def test_a_lease_writer_with_node_credentials_stalls_nothing(
    shared_cluster: NatsCluster, tmp_path: Path
) -> None:
    cluster, stream = shared_cluster, "t-vlease"
    with provider() as counting, LeaseWriter(cluster, stream) as writer:
        nodes = [node_with(tmp_path / f"n{i}", cluster, stream, counting.url) for i in range(2)]
        try:
            for node in nodes:
                node.start()
            time.sleep(3)  # the writer has been at it for a while
            post(nodes[0], [wc.upsert(f"infra/c{i}", 1, text=f"alpha {i}") for i in range(12)])
            took = filled(nodes, 12)
            assert writer.error is None and writer.writes > 10, writer.error
            assert rows(nodes[0]) == rows(nodes[1])
            assert {f"alpha {i}" in " ".join(counting.asked) for i in range(12)} == {True}
            print(f"filled in {took:.1f} s under {writer.writes} lease writes")
        finally:
            for node in nodes:
                node.stop()


def test_a_holder_that_produces_nothing_is_routed_around(
    shared_cluster: NatsCluster, tmp_path: Path
) -> None:
    cluster, stream = shared_cluster, "t-vstall"
    home = os.environ["HOME"]  # the stalled node's API key: its requests are answered 503
    with provider(unavailable_to=home) as counting:
        stalled = node_with(tmp_path / "a", cluster, stream, counting.url, key="HOME")
        other = node_with(tmp_path / "b", cluster, stream, counting.url)
        try:
            stalled.start()
            deadline = time.monotonic() + 30
            while stalled.proc is not None and HOLDS not in stalled.proc.tail():
                assert time.monotonic() < deadline, stalled.proc.tail()
                time.sleep(0.1)
            other.start()
            post(other, [wc.upsert(f"infra/c{i}", 1, text=f"alpha {i}") for i in range(6)])
            took = filled([stalled, other], 6, seconds=90)
            assert other.proc is not None and HOLDS in other.proc.tail()
            assert len(counting.asked) == len(set(counting.asked)) == 6  # by the other alone
            assert rows(stalled) == rows(other)
            print(f"routed around the stalled holder: filled in {took:.1f} s")
        finally:
            stalled.stop()
            other.stop()
