"""The local model's vectors shipped in the delivery's message (``kbgraph.embeddings.shipped``),
on a real 3-server JetStream cluster, nodes in this process so that their models can be
counted: the process that takes a delivery runs the model once, every node (the publishing
one too) runs it 0 times for it and holds the same bytes, in its store, its log rows and its
projection, after a restart and from a fresh start; a replayed message changes no row, and a
message whose vectors were changed is refused; a node of another model's key runs its own."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from kbgraph.config import load_config
from kbgraph.embeddings import concept_text
from kbgraph.embeddings.carried import Carrier, pack
from kbgraph.embeddings.local import LocalEmbedder
from kbgraph.events import ConceptUpserted, Event
from kbgraph.log.jetstream import JetStreamLog, wire
from kbgraph.projection import Projections
from kbgraph.store import Store
from tests.embedders import LOCAL
from tests.jetstream_nodes import write_node_config
from tests.kb_events import delete, upsert
from tests.nats_cluster import NatsCluster, running_cluster

pytestmark = pytest.mark.anyio

STREAM = "t-ship"
KB = "kb"
WAIT_SECONDS = 60.0


class Counting:
    """The local model, counting the texts it is asked to embed."""

    name = LocalEmbedder.name
    remote = False

    def __init__(self) -> None:
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return LOCAL.embed(texts)


class InProcessNode:
    """A node's store and end of the stream, its model counted."""

    def __init__(self, folder: Path, cluster: NatsCluster, max_chars: int = 4000) -> None:
        self.folder = folder
        self.max_chars = max_chars
        self.config = load_config(write_node_config(folder, cluster, STREAM)).log.jetstream
        self.model = Counting()
        self.store = Store(folder / "kb.db", carrier=Carrier(self.model, max_chars))
        self.log = JetStreamLog(self.config, self.store, vector_max_chars=max_chars)
        self.live = Projections(self.store, embedder=self.model, vector_max_chars=max_chars)
        self.live.load()  # before the deliveries: it follows the log rows, as a worker does

    async def close(self) -> None:
        await self.log.close()
        self.store.close()

    def rows(self) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(self.folder / "kb.db")) as conn:
            return conn.execute(
                "SELECT kb, concept, model, text_hash, vec, problem FROM vector ORDER BY concept"
            ).fetchall()

    def carried(self) -> list[tuple[int, bytes]]:
        """Each log row's carried vector (seq, packed bytes)."""
        return [
            (r.seq, r.analysis.vector)
            for r in self.store.read_log(0)
            if r.analysis is not None and r.analysis.vector
        ]

    def projection(self) -> dict[str, tuple[bytes, bytes, bytes]]:
        """Each concept's installed vector (int8 row, scale, code), a projection built from
        the store (no checkpoint) and settled from its rows, with a model that must not run."""
        model = Counting()
        p = Projections(self.store, embedder=model, vector_max_chars=self.max_chars)
        p.load()
        assert p.filler is not None
        p.filler.round()  # what the build left waiting, from the store's vector rows
        assert model.texts == 0
        return installed(p)

    def followed(self) -> dict[str, tuple[bytes, bytes, bytes]]:
        """The same, as the projection loaded before the deliveries installed them from the
        log rows (the node's model counts what it runs)."""
        while self.live.follow_once():
            pass
        return installed(self.live)


def installed(p: Projections) -> dict[str, tuple[bytes, bytes, bytes]]:
    kb = p.get(KB)
    assert kb is not None and kb.vectors is not None
    v, ids = kb.vectors, kb.nodes.ids
    assert not v.dirty  # every row came with its vector
    return {
        ids[u]: (v.q8[u].tobytes(), v.scale[u].tobytes(), v.codes[u].tobytes())
        for u in range(len(ids))
        if u < v.cap and v.have[u]
    }


@contextlib.asynccontextmanager
async def nodes(folder: Path, cluster: NatsCluster, *chars: int) -> AsyncIterator[list[Any]]:
    made = [InProcessNode(folder / f"n{i}", cluster, c) for i, c in enumerate(chars)]
    try:
        for node in made:
            await node.log.follow()
        yield made
    finally:
        for node in made:
            await node.close()


async def caught_up(node: InProcessNode, position: int) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while node.log.applied < position:
        assert time.monotonic() < deadline, (node.log.applied, position, node.log.problem())
        await asyncio.sleep(0.05)


async def ready(node: InProcessNode) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while node.log.problem() is not None:
        assert time.monotonic() < deadline, node.log.problem()
        await asyncio.sleep(0.05)


def history() -> list[list[Event]]:
    """Deliveries: new concepts (two of one text), a change, a delete, a re-creation."""
    first = [upsert(f"c{i}", 1, title=f"c{i}", text=f"alpha text {i % 7}") for i in range(12)]
    first.append(upsert("twin", 1, title="c0", text="alpha text 0"))
    return [
        first[:5],
        first[5:],
        [upsert("c1", 2, title="c1", text="beta text, changed")],
        [delete("c2", 2)],
        [upsert("c2", 3, title="c2", text="gamma, again")],
    ]


def texts(deliveries: list[list[Event]]) -> int:
    """The distinct texts of each delivery's upserts, summed: what one model run per delivery
    embeds (``Carrier.vectors`` embeds each distinct text of a call once)."""
    return sum(
        len(
            {
                concept_text(e.data.title, e.data.aliases, e.data.tags, e.data.text)
                for e in events
                if isinstance(e, ConceptUpserted)
            }
        )
        for events in deliveries
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with running_cluster(tmp_path / "nats") as running:
        yield running


async def raw_messages(cluster: NatsCluster) -> list[Any]:
    nc = await cluster.connect()
    try:
        js = nc.jetstream(timeout=5)
        last = (await js.stream_info(STREAM)).state.last_seq
        return [await js.get_msg(STREAM, seq) for seq in range(1, last + 1)]
    finally:
        await nc.close()


async def publish_raw(cluster: NatsCluster, subject: str, payload: bytes, headers: dict) -> int:
    nc = await cluster.connect()
    try:
        js = nc.jetstream(timeout=5)
        headers = {k: v for k, v in headers.items() if k != wire.MSG_ID}
        return int((await js.publish(subject, payload, headers=headers)).seq)
    finally:
        await nc.close()


async def test_the_model_runs_once_for_the_cluster_and_every_node_holds_its_bytes(
    tmp_path: Path, cluster: NatsCluster
) -> None:
    deliveries = history()
    async with nodes(tmp_path, cluster, 4000, 4000, 4000) as (a, b, c):
        for node in (a, b, c):
            await ready(node)
        for events in deliveries:
            await a.log.append(KB, events, None)
        for node in (b, c):
            await caught_up(node, a.log.applied)
        assert a.model.texts == texts(deliveries)  # A's publishing, once per distinct text
        assert b.model.texts == c.model.texts == 0
        rows = a.rows()
        assert len(rows) == 13 and rows == b.rows() == c.rows()
        assert a.carried() == b.carried() == c.carried()
        vectors = a.projection()
        assert vectors == b.projection() == c.projection() == b.followed() == a.followed()
        # the int8 values are the model's own (only the float row is their dequantised form)
        final = {"c1": ("c1", "beta text, changed"), "c2": ("c2", "gamma, again")}
        for cid, (title, text) in final.items():
            q8 = pack(LOCAL.embed([concept_text(title, [], [], text)]))[0][: len(vectors[cid][0])]
            assert vectors[cid][0] == q8
        # a delivery taken by B: B runs the model once, A and C none
        before = a.model.texts
        await b.log.append(KB, [upsert("c3", 2, title="c3", text="delta from b")], None)
        await caught_up(a, b.log.applied)
        await caught_up(c, b.log.applied)
        assert a.rows() == b.rows() == c.rows()
        assert a.followed() == b.followed() == c.followed() == a.projection()
        assert (a.model.texts, b.model.texts, c.model.texts) == (before, 1, 0)
        rows = a.rows()

    # restarts keep it: B again from its store, and D, a new node, from the stream's start
    async with nodes(tmp_path, cluster, 4000, 4000, 4000, 4000) as (a, b, c, d):
        for node in (a, b, c, d):
            await ready(node)
        assert d.log.applied == b.log.applied == a.log.applied
        assert [n.model.texts for n in (a, b, c, d)] == [0, 0, 0, 0]
        assert a.rows() == b.rows() == d.rows() == rows
        assert a.carried() == d.carried()
        assert d.projection() == b.projection() == a.projection() == d.followed()
        assert [n.model.texts for n in (a, b, c, d)] == [0, 0, 0, 0]


async def test_a_replayed_or_altered_message_changes_no_vector(
    tmp_path: Path, cluster: NatsCluster
) -> None:
    async with nodes(tmp_path, cluster, 4000, 4000) as (a, b):
        for node in (a, b):
            await ready(node)
        await a.log.append(KB, [upsert("c0", 1, title="c0", text="first text")], None)
        await a.log.append(KB, [upsert("c0", 2, title="c0", text="second text")], None)
        await caught_up(b, a.log.applied)
        rows, vectors = b.rows(), b.projection()
        first, second = (await raw_messages(cluster))[-2:]

        # the first text's message again, MAC and all: its event is a duplicate
        replayed = await publish_raw(cluster, first.subject, first.data, first.headers)
        # the second's, its vector changed to the first's (the MAC no longer holds)
        payload = msgspec.msgpack.decode(second.data)
        payload[5] = msgspec.msgpack.decode(first.data)[5]
        altered = msgspec.msgpack.encode(payload)
        assert altered != second.data
        refused = await publish_raw(cluster, second.subject, altered, second.headers)
        # a new event with a vector of another text, signed with another secret
        forged_payload = wire.encode_message(
            KB,
            [upsert("c9", 1, title="c9", text="forged")],
            None,
            wire.decode_message(first.data).vectors,
        )
        headers: dict[str, str] = {}
        wire.Signer(b"not the cluster's secret, 32 b..").sign(
            second.subject, forged_payload, headers
        )
        forged = await publish_raw(cluster, second.subject, forged_payload, headers)
        for node in (a, b):
            await caught_up(node, forged)
            assert node.rows() == rows and node.projection() == vectors == node.followed()
            assert node.store.stream_note(STREAM, refused)[0] == "refused"
            assert node.store.stream_note(STREAM, forged)[0] == "refused"
            assert node.store.stream_note(STREAM, replayed) is None  # applied: 1 duplicate
        assert b.model.texts == 0 and a.model.texts == 2


async def test_a_node_of_another_models_key_runs_its_own(
    tmp_path: Path, cluster: NatsCluster
) -> None:
    async with nodes(tmp_path, cluster, 4000, 100) as (a, b):
        for node in (a, b):
            await ready(node)
        long = "words " * 100
        await a.log.append(KB, [upsert("c0", 1, title="c0", text=long)], None)
        await caught_up(b, a.log.applied)
        assert (a.model.texts, b.model.texts) == (1, 1)
        assert a.rows()[0][3] != b.rows()[0][3]  # each its own cut's text hash
