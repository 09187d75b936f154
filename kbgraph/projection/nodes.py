"""One KB's per-node columns: each interned id's fields, whether it exists, and its class.

Node ``u`` is the ``u``-th id ever interned (link targets too: a node that is not ``alive``
is a concept deleted or only linked to). Its fields are lists indexed by node, or encoded
columns read lazily after a checkpoint load or a first build
(``kbgraph.store.columns.StringColumn``). ``alive`` and ``cls`` are numpy arrays sized to the
node capacity ``cap`` (grown by doubling, like the adjacency's node arrays): ``cls[u]`` is the
index in ``classes`` of u's (collection, type) pair, which is what visibility rules read, so a
mask is ``alive & lut[cls]`` for a lookup table of a few classes.

A concept field the projection keeps goes into ``FIELDS`` (its name, as ``KBColumns`` and the
checkpoint call it, and how a checkpoint holds it), beside the others in ``__slots__`` and
``__init__``, and into ``update`` (how an upsert sets it): interning, the first build and
checkpoints follow from the table; a reader sees it once ``Snapshot`` names it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, NamedTuple

import msgspec
import numpy as np
from numba import njit

from kbgraph.access import RuleSet, visible
from kbgraph.events import UpsertData
from kbgraph.names import collection_of
from kbgraph.projection.ahead import Ahead
from kbgraph.projection.arrays import grown
from kbgraph.store.columns import (
    KeyIndex,
    StringColumn,
    StringTable,
    decode_strings,
    encode_strings,
    key_hashes,
    process_hashes,
)
from kbgraph.store.model import KBColumns

DICT_IDS: Final = 250_000  # a first build finds up to this many ids by a dict

Codec = Literal["text", "shared", "lists", "ints"]


class Field(NamedTuple):
    """A concept field kept per node: its column's name and how a checkpoint holds it
    (``text``: a string, read lazily; ``shared``: one of a few strings, decoded at once and
    shared; ``lists``: a list of strings as JSON, read lazily; ``ints``: an int64 array)."""

    name: str
    codec: Codec


FIELDS: Final = (
    Field("titles", "text"),
    Field("aliases", "lists"),
    Field("statuses", "shared"),
    Field("tags", "lists"),
    Field("texts", "text"),
    Field("versions", "ints"),
)
_BLANK: Final[Mapping[Codec, Callable[[], Any]]] = {
    "text": str,
    "shared": str,
    "lists": list,
    "ints": int,
}
_BLANKS: Final = tuple((field.name, _BLANK[field.codec]) for field in FIELDS)  # for ``add``
_lists_encoder = msgspec.json.Encoder()
_lists_decoder = msgspec.json.Decoder(list[str])


class Nodes:
    """Per-node columns of one KB. Mutated only by the follower thread, under the write lock;
    a ``Snapshot`` reads the columns themselves."""

    __slots__ = (
        "_ahead",
        "_class_of",
        "_collection_names",
        "_found",
        "_index",
        "aliases",
        "alive",
        "cap",
        "classes",
        "cls",
        "collections",
        "ids",
        "statuses",
        "tags",
        "texts",
        "titles",
        "types",
        "versions",
    )

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._index: dict[str, int] | KeyIndex = {}
        self.ids: list[str] | StringColumn = []
        self.titles: list[str] | StringColumn = []
        self.aliases: list[list[str]] | StringColumn = []
        self.types: list[str] = []
        self.statuses: list[str] = []
        self.tags: list[list[str]] | StringColumn = []
        self.texts: list[str] | StringColumn = []
        self.versions: list[int] = []
        self.collections: list[str] = []
        self.alive = np.zeros(cap, np.uint8)
        self.cls = np.zeros(cap, np.int32)  # (collection, type) class per node
        self.classes: list[tuple[str, str]] = []
        self._class_of: dict[tuple[str, str], int] = {}
        self._collection_names: dict[str, str] = {}
        self._ahead: Ahead | None = None  # the ids' column found by value (``find_ahead``)
        self._found: dict[str, int] = {}  # ``find_ahead``'s answers (-1: no row), until its next

    def __len__(self) -> int:
        return len(self.ids)

    def find(self, concept_id: str) -> int | None:
        """The node of an interned id (alive or not), else None."""
        found = self._found
        if found:
            u = found.get(concept_id)
            if u is not None:
                if u >= 0:
                    return u
                index = self._index  # no id of the column: one interned since, or none
                return index.added(concept_id) if isinstance(index, KeyIndex) else None
        return self._index.get(concept_id)

    @property
    def found_by_hash(self) -> bool:
        """Whether ids are found by a ``KeyIndex`` (~3 µs a look-up: a bisect over a million
        hashes, the candidate decoded and compared), so ``find_ahead`` pays."""
        return isinstance(self._index, KeyIndex)

    def find_ahead(self, concept_ids: Iterable[str]) -> None:
        """Find these ids (a batch's subjects and targets, before its write lock) at once
        (``kbgraph.projection.ahead``), so that ``find`` answers them from a small dict until
        the next call; a reader's ``find`` meanwhile is right either way."""
        ids = self.ids
        if not isinstance(self._index, KeyIndex) or not isinstance(ids, StringColumn):
            return
        if self._ahead is None or self._ahead.column is not ids:
            self._ahead = Ahead(ids)
        self._found = self._ahead.found(concept_ids)

    # --- patches (follower thread, write lock held) ---------------------------------------

    def add(self, concept_id: str) -> int:
        """Intern a new id (the caller made room: ``len(self) < cap``); returns its node."""
        u = len(self.ids)
        self._index[concept_id] = u
        self.ids.append(concept_id)
        collection = self.collection(concept_id)
        self.collections.append(collection)
        self.types.append("")
        for name, blank in _BLANKS:
            getattr(self, name).append(blank())
        self.cls[u] = self.class_of(collection, "")
        return u

    def update(self, u: int, data: UpsertData, was_alive: bool) -> tuple[bool, bool]:
        """Set u's fields from an upsert; returns (whether its title, text, aliases or tags
        changed or it appeared: the search index and vector follow; whether its type changed:
        its visibility follows)."""
        reindex = (
            not was_alive
            or self.titles[u] != data.title
            or self.texts[u] != data.text
            or self.aliases[u] != data.aliases
            or self.tags[u] != data.tags
        )
        self.titles[u] = data.title
        self.aliases[u] = list(data.aliases)
        self.statuses[u] = data.status
        self.tags[u] = list(data.tags)
        self.texts[u] = data.text
        self.versions[u] = data.version
        type_changed = self.types[u] != data.type
        if type_changed:
            self.types[u] = data.type
            self.cls[u] = self.class_of(self.collections[u], data.type)
        return reindex, type_changed

    def clear(self, u: int, version: int) -> None:
        """u was deleted at ``version``: its text, tags and aliases go (its title and type
        stay, as the store keeps them)."""
        self.alive[u] = 0
        self.versions[u] = version
        self.texts[u] = ""
        self.tags[u] = []
        self.aliases[u] = []

    def grown(self, n: int, new_cap: int) -> Callable[[], None]:
        """Grow the node arrays to ``new_cap``: copies made now, installed by the swap."""
        alive, cls = grown(self.alive, n, new_cap), grown(self.cls, n, new_cap)

        def swap() -> None:
            self.alive, self.cls, self.cap = alive, cls, new_cap

        return swap

    # --- classes and visibility ---------------------------------------------------------

    def visible(self, rules: RuleSet) -> np.ndarray:
        """uint8 per node: alive and of a class ``rules`` let see."""
        n = len(self.ids)
        lut = np.fromiter(
            (visible(rules, c, t) for c, t in self.classes), np.uint8, len(self.classes)
        )
        return self.alive[:n] & lut[self.cls[:n]]

    def collection(self, concept_id: str) -> str:
        """collection_of, one shared string per collection (a million ids, a few names)."""
        name = collection_of(concept_id)
        return self._collection_names.setdefault(name, name)

    def class_of(self, collection: str, concept_type: str) -> int:
        """The class of (collection, type), made when new."""
        key = (collection, concept_type)
        k = self._class_of.get(key)
        if k is None:
            k = self._class_of[key] = len(self.classes)
            self.classes.append(key)
        return k

    # --- a first build --------------------------------------------------------------------

    @classmethod
    def from_columns(
        cls, cols: KBColumns, ids: StringColumn, n0: int, cap: int, table: StringTable
    ) -> Nodes:
        """The nodes of a first build: the store's ``n0`` concepts (``cols``, whose lists the
        nodes take) and, after them in ``ids``, the link targets that are no concept;
        ``table``: the ``StringTable`` of the store's ids (``find_ahead``'s, past
        ``DICT_IDS``)."""
        nodes = cls(cap)
        n = len(ids)
        # Up to DICT_IDS a dict (~100 bytes an id; a look-up 0.6 µs, the follower's ~9 an
        # upsert); beyond, as a checkpoint load finds them, by the ids' sorted hashes (Python's
        # own here: never stored), no dict of strings (a look-up ~2.8 µs; the follower finds a
        # batch's at once, ``find_ahead``, in this build's ``StringTable`` of the store's ids)
        if n <= DICT_IDS:
            nodes._index = dict(zip(ids, range(n), strict=True))
        else:
            nodes._index = KeyIndex(ids, *process_hashes(ids), hasher=hash)
            nodes._ahead = Ahead(ids, table)
        nodes.ids = ids
        for field in FIELDS:
            column = getattr(cols, field.name)
            blank = _BLANK[field.codec]
            for _ in range(n - n0):
                column.append(blank())
            setattr(nodes, field.name, column)
        nodes.types = cols.types + [""] * (n - n0)
        nodes.collections = nodes._collections_of(ids, n0)
        nodes.alive[:n0] = 1
        nodes.cls[:n] = nodes._classes_of(nodes.collections, nodes.types)
        return nodes

    def _collections_of(self, ids: StringColumn, n0: int) -> list[str]:
        """``collection_of`` of every id, one shared string per collection: the store's ids
        (sorted, so an id prefix's rows are runs) split at their first "/" in one compiled
        pass, a string made per run; then the missing targets one by one."""
        blob, off = ids.encoded
        run_row, run_start, run_end = _prefix_runs(blob, off[: n0 + 1])
        lengths = np.diff(np.append(run_row, n0)).tolist()
        out: list[str] = []
        shared = self._collection_names
        for length, start, end in zip(lengths, run_start.tolist(), run_end.tolist(), strict=True):
            name = blob[start:end].tobytes().decode("utf-8", "surrogatepass")
            out.extend(itertools.repeat(shared.setdefault(name, name), length))
        out.extend(self.collection(ids[u]) for u in range(n0, len(ids)))
        return out

    def _classes_of(self, collections: list[str], types: list[str]) -> np.ndarray:
        """The (collection, type) class of every node, classes made in order of first
        appearance: pairs coded as numbers (few distinct strings), not a million tuples."""
        n = len(collections)
        codes: dict[str, int] = {}  # each string -> the row it first appears at
        column = np.fromiter(map(codes.setdefault, collections, itertools.count()), np.int64, n)
        codes = {}
        kind = np.fromiter(map(codes.setdefault, types, itertools.count()), np.int64, n)
        _, first, inverse = np.unique(column * n + kind, return_index=True, return_inverse=True)
        rank = np.empty(len(first), np.int32)
        for j in np.argsort(first).tolist():  # in order of first appearance
            row = int(first[j])
            rank[j] = self.class_of(collections[row], types[row])
        out: np.ndarray = rank[inverse.reshape(-1)]
        return out

    # --- checkpoints ------------------------------------------------------------------------

    def arrays(self) -> dict[str, np.ndarray]:
        """Every column as flat arrays (``from_arrays`` reads them back); ``classes`` and
        ``cap`` go beside them in the checkpoint's header."""
        arrays: dict[str, np.ndarray] = {}
        arrays["ids.blob"], arrays["ids.off"] = encode_strings(self.ids)
        arrays["ids.hash"], arrays["ids.order"] = key_hashes(self.ids)
        for field in FIELDS:
            column = getattr(self, field.name)
            if field.codec == "ints":
                arrays[field.name] = np.array(column, np.int64)
                continue
            if field.codec == "lists":
                column = (_lists_encoder.encode(values).decode() for values in column)
            blob, off = encode_strings(column)
            arrays[f"{field.name}.blob"], arrays[f"{field.name}.off"] = blob, off
        arrays["alive"], arrays["cls"] = self.alive[: self.cap], self.cls[: self.cap]
        return arrays

    @classmethod
    def from_arrays(
        cls, cap: int, classes: list[tuple[str, str]], arrays: Mapping[str, np.ndarray]
    ) -> Nodes:
        """The nodes ``arrays`` holds, its strings read lazily where they are many."""
        nodes = cls(0)
        nodes.cap = cap
        ids = StringColumn(arrays["ids.blob"], arrays["ids.off"])
        nodes.ids = ids
        nodes._index = KeyIndex(ids, arrays["ids.hash"], arrays["ids.order"])
        for field in FIELDS:
            name = field.name
            column: object
            if field.codec == "ints":
                column = arrays[name].tolist()
            elif field.codec == "shared":  # a few values, a million times
                shared: dict[str, str] = {}
                decoded = decode_strings(arrays[f"{name}.blob"], arrays[f"{name}.off"])
                column = [shared.setdefault(s, s) for s in decoded]
            else:
                decode = _lists_decoder.decode if field.codec == "lists" else None
                column = StringColumn(arrays[f"{name}.blob"], arrays[f"{name}.off"], decode)
            setattr(nodes, name, column)
        nodes.classes = [(c, t) for c, t in classes]
        nodes._class_of = {c: k for k, c in enumerate(nodes.classes)}
        nodes.alive, nodes.cls = arrays["alive"], arrays["cls"]
        collections = [nodes._collection_names.setdefault(c, c) for c, _ in nodes.classes]
        types = [t for _, t in nodes.classes]
        classes_of = nodes.cls[: len(ids)].tolist()
        nodes.collections = [collections[k] for k in classes_of]
        nodes.types = [types[k] for k in classes_of]
        return nodes


@njit(cache=True, nogil=True)
def _prefix_runs(
    blob: np.ndarray, off: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """(first row, prefix start, prefix end) of each run of rows whose ids share the part
    before their first "/" (empty: no "/"), in UTF-8 bytes (no multi-byte character holds
    the byte of "/")."""
    n = len(off) - 1
    rows = np.empty(n, np.int64)
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    runs = 0
    for r in range(n):
        start, stop = off[r], off[r + 1] - 1
        end = start
        while end < stop and blob[end] != 47:
            end += 1
        if end == stop:  # no "/": the empty collection
            end = start
        if runs > 0 and end - start == ends[runs - 1] - starts[runs - 1]:
            same = True
            for i in range(end - start):
                if blob[start + i] != blob[starts[runs - 1] + i]:
                    same = False
                    break
            if same:
                continue
        rows[runs], starts[runs], ends[runs] = r, start, end
        runs += 1
    return rows[:runs], starts[:runs], ends[:runs]
