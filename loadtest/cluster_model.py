"""``bench_spine --cluster``'s local-model phase, the nodes' side: how often a 3-node JetStream
cluster runs the local model per concept change.

Three nodes in one process (each its own store, end of the stream and projection), each
node's model a counting wrapper of the real local model, following the stream of the cluster
``bench_spine`` started (``--log``: the ``[log]`` sections of a node): ``--concepts`` 40-word
concepts created in deliveries of 10, then ``--changes`` changed, the deliveries spread over
the nodes, every node followed to the end. Prints one JSON line: the texts each node's model
embedded (its store, its publisher, its projection), the texts per change for the cluster
(aim 1; one per node when every store embeds), and whether every node's store holds the same
vector rows. Public APIs only and nothing else of this checkout: ``bench_spine`` runs a copy
of this file with the Python of the checkout measured (``--peer``: main's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kbgraph.config import parse_config
from kbgraph.embeddings.carried import Carrier
from kbgraph.embeddings.local import LocalEmbedder
from kbgraph.events import ConceptUpserted, UpsertData
from kbgraph.log.jetstream import JetStreamLog
from kbgraph.projection import Projections
from kbgraph.store import Store

KB = "spine"
PER_DELIVERY = 10
WAIT_SECONDS = 120.0
WORDS = [f"term{i}" for i in range(4000)]


class Counting:
    """The local model, counting the texts it is asked to embed (one per node)."""

    def __init__(self, model: LocalEmbedder) -> None:
        self.model = model
        self.name = model.name
        self.remote = False
        self.texts = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return self.model.embed(texts)


def concept(i: int, version: int, rng: random.Random) -> ConceptUpserted:
    text = " ".join(rng.choice(WORDS) for _ in range(40))
    data = UpsertData(version=version, title=f"Concept {i}", text=text, tags=["bench"])
    return ConceptUpserted(
        specversion="1.0", id=f"e{i}-{version}", source="bench://spine", subject=f"c{i}", data=data
    )


async def run(folder: Path, log_toml: str, concepts: int, changes: int) -> dict[str, Any]:
    model = LocalEmbedder()
    nodes: list[tuple[Counting, Store, JetStreamLog, Projections]] = []
    try:
        config = parse_config(log_toml).log.jetstream
        for i in range(3):
            counting = Counting(model)
            store = Store(folder / f"node{i}.db", carrier=Carrier(counting, 4000))
            log = JetStreamLog(config, store, vector_max_chars=4000)
            projections = Projections(store, embedder=counting, vector_max_chars=4000)
            projections.load()
            await log.follow()
            nodes.append((counting, store, log, projections))
        deadline = time.monotonic() + WAIT_SECONDS
        while any(log.problem() is not None for _, _, log, _ in nodes):
            if time.monotonic() > deadline:
                raise TimeoutError([log.problem() for _, _, log, _ in nodes])
            await asyncio.sleep(0.05)
        rng = random.Random(7)
        plan = [concept(i, 1, rng) for i in range(concepts)]
        plan += [concept(i, 2, rng) for i in range(changes)]
        taken = [0, 0, 0]
        for n, at in enumerate(range(0, len(plan), PER_DELIVERY)):
            taken[n % 3] += len(plan[at : at + PER_DELIVERY])
            await nodes[n % 3][2].append(KB, list(plan[at : at + PER_DELIVERY]), None)
        last = max(log.applied for _, _, log, _ in nodes)
        while any(log.applied < last for _, _, log, _ in nodes):
            if time.monotonic() > deadline + WAIT_SECONDS:
                raise TimeoutError("the nodes did not catch up")
            await asyncio.sleep(0.05)
        for _, _, _, projections in nodes:
            while projections.follow_once():
                pass
        rows = []
        for i in range(3):
            with contextlib.closing(sqlite3.connect(folder / f"node{i}.db")) as conn:
                rows.append(conn.execute("SELECT * FROM vector ORDER BY concept").fetchall())
        texts = [counting.texts for counting, *_ in nodes]
        events = len(plan)  # one change each
        return {
            "nodes": 3,
            "concept_changes": events,
            "events_taken_per_node": taken,
            "texts_embedded_per_node": texts,
            "embed_calls_per_change": round(sum(texts) / events, 2),
            "same_rows_on_every_node": all(r == rows[0] for r in rows),
            "rows_per_node": [len(r) for r in rows],
        }
    finally:
        for _, store, log, _ in nodes:
            await log.close()
            store.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.cluster_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True, help="a node's [log] sections (TOML)")
    parser.add_argument("--concepts", type=int, default=120)
    parser.add_argument("--changes", type=int, default=30)
    args = parser.parse_args()
    print(
        json.dumps(asyncio.run(run(args.folder, args.log.read_text(), args.concepts, args.changes)))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
