"""A KB's projection that is replaced (a reload after the log was cut past the follower) is
freed by its reference counts alone, with no reference cycle for the cyclic collector to find.

A serving process freezes its start-up heap out of the collector's walks once it is ready
(``kbgraph.service.settle_heap``): a KB built then and later in a cycle would never be freed,
its arrays and sets with it, on every reload. So here the collector is off while the old KB
is dropped, and the KB must be gone all the same."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kbgraph.projection import Projections
from kbgraph.store import Store
from tests.embedders import LOCAL
from tests.kb_events import upsert

KB = "kb"


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def written(store: Store, count: int) -> None:
    store.append(
        KB,
        [
            upsert(
                f"c/{i}",
                title=f"topic {i}",
                links=[f"c/{i - 1}", "c/missing"] if i else [],
                text=f"topic {i + 1} and topic {i + 2} named here, {i}",
                aliases=[f"alias {i}"],
                tags=["t"],
            )
            for i in range(count)
        ],
    )


@pytest.mark.parametrize("from_checkpoint", [False, True], ids=["built", "from-checkpoint"])
def test_a_replaced_kb_is_freed_without_the_cyclic_collector(
    tmp_path: Path, from_checkpoint: bool
) -> None:
    """Mentions and vectors on, the KB built from the store or loaded from a checkpoint (the
    mentions restored), read and followed once: after ``reload`` puts a new KB in its place,
    the old one is gone with the collector off (before: a closure over the KB in its mention
    state held it in a cycle)."""
    with Store(tmp_path / "kb.db") as store:
        written(store, 50)
        checkpoints = tmp_path / "ckpt"
        if from_checkpoint:
            first = Projections(store, checkpoints=checkpoints, embedder=LOCAL)
            first.load()
            while first.follow_once() or first.fill_vectors():
                pass
            assert first.write_checkpoint() is not None
        p = Projections(store, checkpoints=checkpoints, embedder=LOCAL)
        p.load()
        assert (p.loaded_from is not None) is from_checkpoint
        store.append(KB, [upsert("c/50", title="topic 50", text="topic 3 again")])
        while p.follow_once() or p.fill_vectors():
            pass
        old = p.get(KB)
        assert old is not None and old.mentions is not None and old.vectors is not None
        with old.read() as snapshot:
            assert len(snapshot.ids) > 50
        del snapshot  # it holds the KB's mask method
        with collector_off():
            gone = weakref.ref(old)
            del old
            p.reload()
            new = p.get(KB)
            assert new is not None and gone() is None, gc.get_referrers(gone())
