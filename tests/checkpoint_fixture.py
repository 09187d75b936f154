"""The history behind ``tests/data/checkpoint-format-1/``: a store and a checkpoint written by
the code before the projection's parts got their own modules (format 1, commit 399367f), which
``tests/test_checkpoint.py`` loads with today's code; and behind
``tests/data/checkpoint-format-2/``, the same written by the code before the checkpoint carried
the name trie (format 2, mentions kept, commit d6358be).

Made with that commit's ``kbgraph`` first on the path (``python -m tests.checkpoint_fixture
DIR``); the history covers every kind of array a checkpoint holds: non-ASCII ids, titles,
aliases and tags, several collections and types, links to missing concepts, a deletion that
sends its declarers back to pending, a re-creation, link events, a vector-less KB and a second
KB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from kbgraph.events import Event
from tests.kb_events import delete, link_added, link_removed, upsert

KBS = ("kb", "other")


def history() -> list[tuple[str, list[Event]]]:
    """(KB, delivery) in the order they were appended."""
    first = [
        upsert(
            f"{c}/n{i}",
            type=t,
            status="draft" if i % 3 else "",
            title=f"Note {i} über {c}",
            text=f"dns resolver {i} ; router {i % 4} — café",
            tags=[f"t{i % 3}", "ünï"],
            aliases=[f"alias {i}"] if i % 2 else [],
            links=[f"{c}/n{(i + 1) % 7}", f"net/n{i % 5}", f"ghost/g{i % 3}", f"{c}/n{i}"],
        )
        for i, (c, t) in enumerate(
            [("infra", "Runbook"), ("net", "Note"), ("ops", ""), ("é", "Runbook")] * 5
        )
    ]
    return [
        ("kb", first[:10]),
        ("kb", first[10:]),
        ("kb", [delete("net/n1", 5), link_added("infra/n0", "zzz/missing", 6)]),
        ("kb", [link_removed("infra/n4", "infra/n5", 7), upsert("ghost/g1", 2, links=["ops/n2"])]),
        ("kb", [upsert("net/n1", 9, title="back", links=["infra/n0"], tags=["again"])]),
        ("other", [upsert("a", links=["b"]), upsert("b", links=["a", "c"])]),
    ]


def later() -> list[tuple[str, list[Event]]]:
    """Deliveries a test appends after loading the checkpoint (event ids of their own: the
    history's were counted from e0 in the process that wrote the fixture)."""
    deliveries = [
        ("kb", [delete("infra/n0", 20), upsert("ghost/g0", 21, links=["infra/n0", "net/n1"])]),
        ("kb", [upsert("infra/n0", 22, type="Note", links=["ghost/g0"])]),
        ("other", [upsert("c", 3, links=["a"])]),
    ]
    return [
        (kb, [msgspec.structs.replace(e, id=f"later-{i}-{j}") for j, e in enumerate(delivery)])
        for i, (kb, delivery) in enumerate(deliveries)
    ]


def main(folder: Path) -> None:  # pragma: no cover - run once, by hand, with the old code
    from kbgraph.projection import Projections
    from kbgraph.store import Store

    with Store(folder / "kb.db") as store:
        for kb, delivery in history():
            store.append(kb, delivery)
        p = Projections(store, checkpoints=folder / "ckpt", log_retain=100)
        p.load()
        assert p.write_checkpoint() is not None


if __name__ == "__main__":  # pragma: no cover
    main(Path(sys.argv[1]))
