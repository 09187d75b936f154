"""One KB's declared links and the graph they make: undirected and directed adjacency, the ids'
bytes the kernels compare, and the declared links whose target does not exist.

A declared link to an existing target *is* the out-block entry (``kbgraph.projection.adjacency``);
links to missing targets are kept in ``missing_out[u]`` (targets) and ``pending_in[t]``
(sources), so a concept appearing turns its declared in-links into edges in O(its degree)
(``take_pending``), and a concept disappearing moves them back (``drop``: its undirected
neighbours that remain after its own out-links went are exactly the concepts declaring it).
The patches return what changed, for the mask cache to follow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

import numpy as np

from kbgraph.projection.adjacency import Adjacency, declare, drop, undeclare
from kbgraph.projection.arrays import grown
from kbgraph.projection.keys import Keys

PARTS: Final = ("und", "out")  # the two adjacencies, as checkpoints name their arrays


class Links:
    """Adjacency, keys and pending links of one KB. Mutated only by the follower thread, under
    the write lock (``prepare``'s copies outside it); requests read ``und``, ``out`` and
    ``declared``."""

    __slots__ = ("keys", "missing_out", "out", "pending_in", "und")

    def __init__(self, und: Adjacency, out: Adjacency, keys: Keys) -> None:
        self.und = und
        self.out = out
        self.keys = keys
        self.missing_out: dict[int, set[int]] = {}  # u -> declared targets not alive
        self.pending_in: dict[int, set[int]] = {}  # t (not alive) -> sources declaring it

    @classmethod
    def empty(cls, cap: int) -> Links:
        return cls(Adjacency(cap), Adjacency(cap), Keys([], cap))

    def declared(self, u: int) -> list[int]:
        """u's declared targets: the existing ones in id order, then the missing ones."""
        out: list[int] = self.out.block(u).tolist()
        missing = self.missing_out.get(u)
        if missing:
            out.extend(missing)
        return out

    # --- patches (follower thread, write lock held) ---------------------------------------

    def declare(
        self, sources: list[int], targets: list[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """sources[i] (alive) declares targets[i] (alive, != sources[i]); already declared
        pairs are left as they are. Returns (src, dst, flags) as ``adjacency.declare`` sets
        them (2: a new undirected edge)."""
        src = np.array(sources, np.int32)
        dst = np.array(targets, np.int32)
        flags = np.empty(len(src), np.int8)
        und, out, keys = self.und, self.out, self.keys
        done = 0
        while True:
            done += declare(
                src[done:],
                dst[done:],
                flags[done:],
                und.off,
                und.len,
                und.cap,
                und.pool,
                und.meta,
                out.off,
                out.len,
                out.cap,
                out.pool,
                out.meta,
                keys.pre,
                keys.data,
                keys.off,
            )
            if done == len(src):
                break
            # Rare: the batch outgrew the headroom ``prepare`` left.
            und.ensure_room(sources[done], targets[done])
            out.ensure_room(sources[done], targets[done])
        return src, dst, flags

    def undeclare(
        self, sources: list[int], targets: list[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """sources[i] (alive) stops declaring targets[i] (alive); pairs not declared are
        left as they are. Returns (src, dst, flags) as ``adjacency.undeclare`` sets them
        (2: an undirected edge removed)."""
        src = np.array(sources, np.int32)
        dst = np.array(targets, np.int32)
        flags = np.empty(len(src), np.int8)
        undeclare(src, dst, flags, *self._pools())
        return src, dst, flags

    def drop(self, u: int) -> np.ndarray:
        """u stops existing: its declared links to missing targets and every undirected edge
        of it go, and the neighbours declaring it wait for it again. Returns its former
        undirected neighbours."""
        missing = self.missing_out.get(u)
        if missing:
            for t in list(missing):
                self.undeclare_missing(u, t)
        nb = self.und.block(u).copy()
        declares = np.zeros(len(nb), np.int8)
        drop(u, nb, declares, *self._pools())
        declarers = nb[declares != 0].tolist()
        if declarers:
            for s in declarers:
                self.missing_out.setdefault(s, set()).add(u)
            self.pending_in[u] = set(declarers)
        return nb

    def declare_missing(self, u: int, t: int) -> None:
        """u declares t (not alive)."""
        self.missing_out.setdefault(u, set()).add(t)
        self.pending_in.setdefault(t, set()).add(u)

    def undeclare_missing(self, u: int, t: int) -> None:
        """u stops declaring t (not alive, declared)."""
        missing = self.missing_out[u]
        missing.discard(t)
        if not missing:
            del self.missing_out[u]
        pending = self.pending_in[t]
        pending.discard(u)
        if not pending:
            del self.pending_in[t]

    def take_pending(self, t: int) -> list[int]:
        """t appeared: the concepts declaring it, no longer waiting (their edges to t are the
        caller's to declare)."""
        sources = []
        for s in self.pending_in.pop(t, ()):
            missing = self.missing_out[s]
            missing.discard(t)
            if not missing:
                del self.missing_out[s]
            sources.append(s)
        return sources

    def _pools(self) -> tuple[np.ndarray, ...]:
        """The arrays the removing kernels (``drop``, ``undeclare``) take, in their order."""
        und, out, keys = self.und, self.out, self.keys
        return (und.off, und.len, und.pool, und.meta, out.off, out.len, out.pool, out.meta,
                keys.pre, keys.data, keys.off)  # fmt: skip

    # --- growth and compaction (follower thread, outside the write lock) ------------------

    def prepared(self, n: int, mentions: int, nodes_grow: bool) -> list[Callable[[], None]]:
        """Room for a batch mentioning up to ``mentions`` ids and links among ``n`` nodes:
        the keys grown in place (readers never look at them), the pools grown or compacted
        as copies, returned as swaps to run under the write lock. ``nodes_grow``: the node
        arrays are being replaced (``grown``), so no compaction now (both replace ``off``)."""
        self.keys.reserve(n + mentions, 32 * mentions)
        swaps: list[Callable[[], None]] = []
        for adj in (self.und, self.out):
            if not nodes_grow and adj.needs_compaction():
                swaps.append(_installer(adj, adj.compacted(n)))
            elif adj.end + 4 * mentions + 64 > 3 * len(adj.pool) // 4:
                swaps.append(
                    _pool_swap(adj, grown(adj.pool, adj.end, 2 * len(adj.pool) + 8 * mentions))
                )
        return swaps

    def grown(self, n: int, new_cap: int) -> Callable[[], None]:
        """Grow the node arrays to ``new_cap``: copies made now, installed by the swap."""
        und = self.und.grow_nodes(n, new_cap)
        out = self.out.grow_nodes(n, new_cap)

        def swap() -> None:
            self.und.install_nodes(und)
            self.out.install_nodes(out)

        return swap

    # --- checkpoints ------------------------------------------------------------------------

    def arrays(self, cap: int) -> dict[str, np.ndarray]:
        """Every array of the first ``cap`` nodes (``from_arrays`` reads them back)."""
        arrays: dict[str, np.ndarray] = {}
        for part, adj in zip(PARTS, (self.und, self.out), strict=True):
            arrays.update({f"{part}.{name}": a for name, a in adj.arrays(cap).items()})
        arrays.update({f"keys.{name}": a for name, a in self.keys.arrays(cap).items()})
        pairs = [(u, t) for u, targets in self.missing_out.items() for t in sorted(targets)]
        arrays["missing"] = np.array(sorted(pairs), np.int64).reshape(len(pairs), 2)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Links:
        und, out = (Adjacency.from_arrays(_part(arrays, part)) for part in PARTS)
        links = cls(und, out, Keys.from_arrays(_part(arrays, "keys")))
        for u, t in arrays["missing"].tolist():
            links.declare_missing(u, t)
        return links


def _part(arrays: Mapping[str, np.ndarray], part: str) -> dict[str, np.ndarray]:
    prefix = f"{part}."
    return {k[len(prefix) :]: a for k, a in arrays.items() if k.startswith(prefix)}


def _installer(adj: Adjacency, compacted: tuple[np.ndarray, np.ndarray, int]) -> Callable[[], None]:
    return lambda: adj.install_compacted(compacted)


def _pool_swap(adj: Adjacency, pool: np.ndarray) -> Callable[[], None]:
    def swap() -> None:
        adj.pool = pool

    return swap
