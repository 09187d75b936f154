"""A KB's first build in bulk: its nodes and links from the store's columns, vectorised, with no
Python object per concept or link (``KBProjection.build_columns`` adds the search index).

The links' target ids are found by a ``StringTable`` of the ids' bytes; targets that are no
concept are interned after the store's ids in sorted order, and merged into the id order by
bisection (the store's ids come sorted); each adjacency's blocks are made from the edges and
the ids' ranks in linear compiled passes (``Adjacency.from_edges``).
"""

from __future__ import annotations

import bisect
import gc
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from kbgraph.projection.adjacency import Adjacency
from kbgraph.projection.arrays import MIN_NODE_CAP
from kbgraph.projection.keys import Keys
from kbgraph.projection.links import Links
from kbgraph.projection.nodes import Nodes
from kbgraph.store.columns import StringColumn, StringTable, strings_at
from kbgraph.store.model import KBColumns


def parts_of(cols: KBColumns) -> tuple[Nodes, Links]:
    """The nodes and links of a KB's columns; the nodes take the column lists they are given
    (``cols.links`` is emptied as soon as it is read)."""
    n0 = len(cols.ids)
    ids: StringColumn = cols.ids
    encoded = ids.encoded
    table = StringTable(*encoded)  # kept by the nodes past DICT_IDS (``Nodes.find_ahead``)
    src, dst, missing_src, missing_names = _link_columns(cols.links, table)
    added: dict[str, int] = {}  # the missing targets, after the store's ids
    for t in sorted(set(missing_names)):
        added[t] = len(ids)
        ids.append(t)
    dst[missing_src] = np.fromiter(map(added.__getitem__, missing_names), np.int64)
    del missing_src, missing_names
    n = len(ids)
    cap = max(MIN_NODE_CAP, 1 << (n - 1).bit_length())
    order = _id_order(ids, n0)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    loop = src == dst
    to_missing = (dst >= n0) & ~loop
    missing = zip(src[to_missing].tolist(), dst[to_missing].tolist(), strict=True)
    keep = ~(loop | to_missing)
    del loop, to_missing
    src, dst = src[keep], dst[keep]
    del keep
    out = Adjacency.from_edges(src, dst, rank, order, cap, undirected=False)
    und = Adjacency.from_edges(src, dst, rank, order, cap, undirected=True)
    del src, dst, rank, order
    keys = Keys.from_encoded(*encoded, cap)
    del encoded
    for t, u in added.items():
        keys.add(u, t)
    links = Links(und, out, keys)
    for u, t in missing:
        links.declare_missing(u, t)
    return Nodes.from_columns(cols, ids, n0, cap, table), links


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk build (it would walk every container the
    build makes, over and over, and find no cycle), on again after, as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _link_columns(
    links: list[tuple[np.ndarray, np.ndarray, np.ndarray]], table: StringTable
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(src, dst, rows of dst still to resolve, their target ids) of every declared link
    (``links``: ``KBColumns.links``, chunk by chunk, emptied as it is read: the targets' bytes
    freed chunk by chunk, as the search index is built beside), the targets found by
    ``table`` (of the ids); a target that is no concept gets dst -1 and is listed for the
    caller to intern."""
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    missing_rows: list[np.ndarray] = []
    missing_names: list[str] = []
    first = done = 0
    links.reverse()
    while links:
        counts, blob, off = links.pop()
        dst = table.find_all(blob, off)
        gone = np.flatnonzero(dst < 0)
        if len(gone):
            missing_rows.append(gone + done)
            missing_names.extend(strings_at(blob, off, gone.tolist()))
        srcs.append(np.repeat(np.arange(first, first + len(counts), dtype=np.int32), counts))
        dsts.append(dst)
        first += len(counts)
        done += len(dst)
    empty = np.zeros(0, np.int32)
    return (
        np.concatenate(srcs) if srcs else empty,
        np.concatenate(dsts) if dsts else empty,
        np.concatenate(missing_rows) if missing_rows else empty,
        missing_names,
    )


def _id_order(ids: Sequence[str], n0: int) -> np.ndarray:
    """The rows of ``ids`` in id order, when ``ids[:n0]`` (the store's, by id) and the rest
    (the missing targets, sorted) are each sorted: the two merged by a bisection per missing
    target, not a sort of a million strings. Otherwise sorted."""
    n = len(ids)
    tail = [ids[i] for i in range(n0, n)]
    if not (_ascending(itertools.islice(ids, n0)) and _ascending(tail)):
        return np.array(sorted(range(n), key=ids.__getitem__), np.int64)
    below = np.array([bisect.bisect_left(ids, t, 0, n0) for t in tail], np.int64)  # rows < t
    rank = np.empty(n, np.int64)
    rank[:n0] = np.arange(n0, dtype=np.int64) + np.searchsorted(below, np.arange(n0), "right")
    rank[n0:] = below + np.arange(n - n0, dtype=np.int64)
    order = np.empty(n, np.int64)
    order[rank] = np.arange(n, dtype=np.int64)
    return order


def _ascending(values: Iterable[str]) -> bool:
    first, second = itertools.tee(values)
    next(second, None)
    return all(map(operator.lt, first, second))
