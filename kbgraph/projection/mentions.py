"""Mentions: a concept's text naming another concept, kept as edges beside the links.

A text *names* a concept where its folded tokens hold one of the concept's names (title or
alias, ``kbgraph.search.nametrie``) as whole tokens. The rule, per text and per view (the
concepts a caller may see):

- only the names of visible concepts count, and a name made of stop words alone is no name;
- the names are matched longest first, scanning left to right: at each token, the longest
  name starting there is taken and the scan goes on after it (a name inside a longer one
  is part of it: "New York City" does not also mention "New York");
- a taken name mentions every visible concept holding it (two concepts sharing a name are
  both mentioned), except the text's own concept (no self-mention) and the concepts it
  declares a link to (that name is the link's, not a mention).

What is kept, per text, is every *occurrence* of a name any concept holds (first token, end
token, name key), whatever its visibility. An occurrence overlapping no
other one is taken in a view exactly when its name has a visible holder, so it gives *plain*
edges, masked by visibility as links are. The occurrences that overlap (*contested*: whether
one is taken depends on which longer name is visible) are resolved per view, when a view is
first read, and cached with it until the next change.

Patched in both directions (``KBProjection`` notes each event's changes under the write lock
and calls ``flush`` once at the end of its batch, before readers see it): the texts changed
are scanned again, their tokens in one compiled call; a name that appears (its first holder)
finds the texts that may hold it through the search index's term postings (every term of the
name in the text field, ``Postings.holding_all``) and those are scanned for the batch's new
names alone; a name that goes (its last holder) is dropped from the texts the reverse map
``by_key`` lists; a name whose holders change refreshes those texts' edges. Never a scan of
the whole KB, but at the first build.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Sequence
from functools import partial
from typing import Final, NamedTuple, TypeVar

import numpy as np

from kbgraph.search import SearchIndex, tokenize, tokens_with_offsets
from kbgraph.search.analysis import folded, stem
from kbgraph.search.nametrie import NAME_SEP, NameTrie, mentionable

VIEW_CACHE_ENTRIES: Final = 16
BUILD_CHUNK: Final = 1 << 12  # texts scanned in one compiled call by the first build
BULK_MASK: Final = 64  # a set of mentions this big is masked as an array (``MentionView``)
TEXT_HITS: Final = 0xFFFFFFFF  # a term posting's text-field hits (kbgraph.search.bulk.FIELD)


class Occurrence(NamedTuple):
    start: int  # first token
    end: int  # one past the last token
    key: str  # the name's folded tokens joined by NAME_SEP


def take(occurrences: Iterable[Occurrence]) -> list[Occurrence]:
    """Longest first, left to right: of ``occurrences`` (the active names' ones), those
    the scan takes."""
    taken: list[Occurrence] = []
    at = 0
    for o in sorted(occurrences, key=lambda o: (o.start, -o.end)):
        if o.start >= at:
            taken.append(o)
            at = o.end
    return taken


def split(occurrences: Sequence[Occurrence]) -> tuple[list[Occurrence], list[Occurrence]]:
    """(plain, contested): of ``occurrences`` (by first token), those overlapping no other,
    and the others."""
    plain: list[Occurrence] = []
    contested: list[Occurrence] = []
    group: list[Occurrence] = []
    reach = -1
    for o in occurrences:
        if group and o.start >= reach:
            (plain if len(group) == 1 else contested).extend(group)
            group = []
        group.append(o)
        reach = max(reach, o.end) if len(group) > 1 else o.end
    if group:
        (plain if len(group) == 1 else contested).extend(group)
    return plain, contested


def alone(src: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Of occurrences by source, then first token, those overlapping no other of their
    source's (``split``'s plain, for many texts at once): a group of overlapping ones starts
    where an occurrence starts at or after the furthest end before it in its text."""
    width = int(end.max()) + 1  # each source's tokens apart from the next one's
    first, last = src * width + start, src * width + end
    opens = np.ones(len(src), bool)
    opens[1:] = first[1:] >= np.maximum.accumulate(last)[:-1]
    group = np.cumsum(opens) - 1
    result: np.ndarray = np.bincount(group)[group] == 1
    return result


def words(text: str) -> list[str]:
    """The folded tokens names are matched against: ``tokenize``'s, as a name's own."""
    return tokenize(text)


def scan(index: SearchIndex, text: str) -> list[Occurrence]:
    """Every occurrence in ``text`` of a mentionable name some concept holds."""
    if not text:
        return []
    return [Occurrence(i, j, key) for _, i, j, key in index.name_trie().match_texts([folded(text)])]


def resolve(
    index: SearchIndex,
    u: int,
    occurrences: Sequence[Occurrence],
    mask: np.ndarray,
    declared: Iterable[int],
) -> list[tuple[Occurrence, list[int]]]:
    """The occurrences in u's text (u: -1 for a question) the scan takes in the view
    ``mask``, each with the visible concepts it mentions (not u, not ``declared``: u's links)."""
    holders: dict[str, list[int]] = {}
    for key in {o.key for o in occurrences}:
        holders[key] = [v for v in index.named_key(key) if mask[v]]
    linked = set(declared)
    taken = take(o for o in occurrences if holders[o.key])
    return [(o, [v for v in holders[o.key] if v != u and v not in linked]) for o in taken]


def offsets(text: str, taken: Iterable[tuple[Occurrence, list[int]]]) -> dict[int, int]:
    """Each mentioned concept's first occurrence's character offset in ``text`` (where a
    character folds into letters, "™" into "tm", the offsets' tokens may differ from
    ``words``: then the name is looked for among them, else the text's start)."""
    out: dict[int, int] = {}
    located: tuple[list[str], list[int], bool] | None = None
    for o, targets in taken:
        for v in targets:
            if v in out:
                continue
            if located is None:
                tokens, starts = tokens_with_offsets(text)
                located = tokens, starts, tokens == words(text)
            tokens, starts, aligned = located
            if aligned:
                out[v] = starts[o.start]
            else:
                found = find_tokens(tokens, o.key.split(NAME_SEP))
                out[v] = starts[found] if found is not None else 0
    return out


def find_tokens(tokens: list[str], name: list[str]) -> int | None:
    """Where ``name`` first occurs in ``tokens``, or None."""
    size = len(name)
    for at in range(len(tokens) - size + 1):
        if tokens[at : at + size] == name:
            return at
    return None


def unlinked(
    index: SearchIndex, text: str, u: int, mask: np.ndarray, declared: Iterable[int]
) -> dict[int, int]:
    """``Mentions.first_offsets`` for a KB that keeps no mentions: u's text scanned now."""
    return offsets(text, resolve(index, u, scan(index, text), mask, declared))


class MentionView:
    """The mention edges of one view: ``out(u)`` the visible concepts u's text mentions,
    ``into(u)`` those whose texts mention u, each ascending by node (callers order by id)."""

    __slots__ = ("_cin", "_cout", "_mask", "_of")

    def __init__(
        self,
        of: Mentions,
        mask: np.ndarray,
        cout: dict[int, set[int]],
        cin: dict[int, set[int]],
    ) -> None:
        self._of, self._mask = of, mask
        self._cout, self._cin = cout, cin

    def _seen(self, u: int) -> bool:
        return 0 <= u < len(self._mask) and bool(self._mask[u])

    def _visible(self, nodes: Collection[int]) -> set[int]:
        """Those of ``nodes`` the view shows: a big set (a name many texts hold) masked in
        one array operation, instead of an element at a time."""
        mask = self._mask
        size = len(mask)
        if len(nodes) < BULK_MASK:
            return {v for v in nodes if v < size and mask[v]}
        found = np.fromiter(nodes, np.int64, len(nodes))
        found = found[found < size]
        return set(found[mask[found] != 0].tolist())

    def out(self, u: int) -> set[int]:
        if not self._seen(u):
            return set()
        found = self._visible(self._of.out.get(u, ()))
        found |= self._cout.get(u, set())
        return found

    def into(self, u: int) -> set[int]:
        if not self._seen(u):
            return set()
        found = self._visible(self._of.inn.get(u, ()))
        found |= self._cin.get(u, set())
        return found

    def both(self, u: int) -> set[int]:
        """``out(u) | into(u)``, a new set the caller may change."""
        if not self._seen(u):
            return set()
        of = self._of
        found = self._visible(of.out.get(u, ()))
        found |= self._visible(of.inn.get(u, ()))
        found |= self._cout.get(u, set())
        found |= self._cin.get(u, set())
        return found


class Mentions:
    """One KB's mentions (the module docstring). ``text_of(u)``: u's text; ``declared(u)``:
    the nodes u declares links to. Patched by the follower under the KB's write lock, read by
    requests under its read lock (the view cache has its own small lock)."""

    def __init__(
        self,
        index: SearchIndex,
        text_of: Callable[[int], str],
        declared: Callable[[int], Iterable[int]],
    ) -> None:
        self.index = index
        self._text_of = text_of
        self._declared = declared
        self.occ: dict[int, list[Occurrence]] = {}  # source -> every occurrence, by start
        self.by_key: dict[str, set[int]] = {}  # name key -> sources with an occurrence
        self.out: dict[int, set[int]] = {}  # source -> targets of its plain occurrences
        self.inn: dict[int, set[int]] = {}  # target -> sources, the reverse of ``out``
        self.contested: dict[int, list[Occurrence]] = {}  # source -> its overlapping ones
        self.gen = 0  # bumped by every patch: the views cached before are stale
        self._holders: dict[str, list[int]] = {}  # name key -> its holders, until they change
        self._rescan: set[int] = set()  # texts to scan again at ``flush``
        self._relink: set[int] = set()  # texts whose links changed, to refresh at ``flush``
        self._had: dict[str, bool] = {}  # name key changed -> had a holder before the batch
        self._views: OrderedDict[tuple[int, int], tuple[np.ndarray, int, MentionView]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    # --- building and patching (follower thread, write lock held) ------------------------

    def build(self, nodes: Iterable[int]) -> None:
        """Scan every text of ``nodes`` (the existing concepts, ascending), once, into an
        empty ``Mentions``: ``BUILD_CHUNK`` texts' tokens at a time in one compiled call,
        plain and contested told apart for every text at once (``alone``), and the edges
        ``_refresh`` would make, made in one pass."""
        assert not self.occ, "build fills an empty Mentions"
        trie = self.index.name_trie()
        nodes_of = list(nodes)
        rows: list[tuple[int, int, int, str]] = []
        text_of = self._text_of
        for at in range(0, len(nodes_of), BUILD_CHUNK):
            chunk = nodes_of[at : at + BUILD_CHUNK]
            found = trie.match_texts([folded(text_of(u)) for u in chunk])
            rows += [(chunk[k], i, j, key) for k, i, j, key in found]
        self.gen += 1
        if not rows:
            return
        texts, starts, ends, _ = zip(*rows, strict=True)
        plains = alone(*(np.array(c, np.int64) for c in (texts, starts, ends))).tolist()
        holders = self._holders = self._named_in({row[3] for row in rows}, nodes_of)
        occ, by_key, out, contested = self.occ, self.by_key, self.out, self.contested
        for (s, i, j, key), plain in zip(rows, plains, strict=True):
            o = Occurrence(i, j, key)
            if (held := occ.get(s)) is None:
                occ[s] = [o]
            else:
                held.append(o)
            if (sources := by_key.get(key)) is None:
                by_key[key] = {s}
            else:
                sources.add(s)
            if not plain:
                contested.setdefault(s, []).append(o)
            elif (targets := out.get(s)) is None:
                out[s] = set(holders[key])
            else:
                targets.update(holders[key])
        inn = self.inn
        for s, targets in list(out.items()):
            targets.discard(s)
            if targets:
                targets.difference_update(self._declared(s))
            if not targets:
                del out[s]
            for v in targets:
                if (into := inn.get(v)) is None:
                    inn[v] = {s}
                else:
                    into.add(s)

    def saved(self) -> Saved:
        """The state as flat arrays, for a checkpoint (``restore``)."""
        numbers: dict[str, int] = {}
        rows = [(s, o.start, o.end, o.key) for s in sorted(self.occ) for o in self.occ[s]]
        key_of = [numbers.setdefault(key, len(numbers)) for _, _, _, key in rows]
        sources = sorted(self.out)
        return Saved(
            np.array([r[0] for r in rows], np.int64),
            np.array([r[1] for r in rows], np.int32),
            np.array([r[2] for r in rows], np.int32),
            np.array(key_of, np.int32),
            list(numbers),
            np.repeat(np.array(sources, np.int64), [len(self.out[s]) for s in sources]),
            np.array([v for s in sources for v in sorted(self.out[s])], np.int64),
        )

    def restore(self, saved: Saved) -> None:
        """Fill an empty ``Mentions`` from ``saved`` (a checkpoint's, of this very state)
        instead of scanning the texts, in bulk: no text read, no name trie built."""
        assert not self.occ, "restore fills an empty Mentions"
        self.gen += 1
        if not len(saved.src):
            return
        keys = list(saved.keys)
        names = list(map(keys.__getitem__, saved.key.tolist()))
        made = list(
            map(_occurrence, zip(saved.start.tolist(), saved.end.tolist(), names, strict=True))
        )
        heads, parts = _runs(saved.src)
        self.occ = dict(zip(heads, map(made.__getitem__, parts), strict=True))
        width = int(saved.src.max()) + 1
        pairs = np.unique(saved.key.astype(np.int64) * width + saved.src)
        heads, parts = _runs(pairs // width)
        self.by_key = dict(
            zip(map(keys.__getitem__, heads), _sets(pairs % width, parts), strict=True)
        )
        self.out = dict(zip(*_grouped(saved.edge_src, saved.edge_dst), strict=True))
        order = np.lexsort((saved.edge_src, saved.edge_dst))
        self.inn = dict(zip(*_grouped(saved.edge_dst[order], saved.edge_src[order]), strict=True))
        overlapping = np.flatnonzero(~alone(saved.src, saved.start, saved.end))
        heads, parts = _runs(saved.src[overlapping])
        contested = [made[i] for i in overlapping.tolist()]
        self.contested = dict(zip(heads, map(contested.__getitem__, parts), strict=True))

    def _named_in(self, keys: Container[str], nodes: Iterable[int]) -> dict[str, list[int]]:
        """The holders among ``nodes`` (ascending) of each of ``keys`` held by some, read
        node by node (a key at a time costs a postings lookup each)."""
        found: dict[str, list[int]] = {}
        names = self.index.names
        for u in nodes:
            for key in names.node_keys_of(u):
                if key in keys:
                    found.setdefault(key, []).append(u)
        return found

    def text_changed(self, u: int) -> None:
        """u exists with a new text (or names, or links): its occurrences and edges again (at
        ``flush``)."""
        self._rescan.add(u)

    def links_changed(self, u: int) -> None:
        """u's declared links changed: which names are its links' changed with them."""
        self._relink.add(u)

    def dropped(self, u: int) -> None:
        """u stopped existing: its own text (now empty) mentions nothing (its names:
        ``names_changed``)."""
        self._rescan.add(u)

    def names_changed(self, u: int, old: Iterable[str], new: Iterable[str]) -> None:
        """u's name keys went from ``old`` to ``new`` (the index already holds the new ones):
        every text naming a key that came or went is patched at ``flush``. Of each key, the
        first change of the batch records whether it had a holder before the batch."""
        before, after = set(old), set(new)
        had = self._had
        for key in before ^ after:
            self._holders.pop(key, None)
            if key in had or not mentionable(key):
                continue
            had[key] = key in before or self.index.names.held_by(key) > 1

    def flush(self) -> None:
        """The patches of the changes noted since the last flush, in one pass: the texts
        changed scanned again (their tokens in one compiled call), the names that came found
        in the texts that may hold them, the names that went dropped, and the edges of every
        text touched refreshed. The follower calls it once per batch, before readers see
        the KB."""
        rescan, relink, had = self._rescan, self._relink, self._had
        if not (rescan or relink or had):
            return
        self._rescan, self._relink, self._had = set(), set(), {}
        touched = set(relink)
        by_key, occ = self.by_key, self.occ
        appeared = []
        held_by = self.index.names.held_by  # a count: the holders themselves when needed
        for key, held in had.items():
            holders = held_by(key)
            if holders and not held:
                appeared.append(key)
            elif held and not holders:  # a name gone
                for s in sorted(by_key.get(key, ())):
                    if s not in rescan:
                        self._store(s, [o for o in occ[s] if o.key != key])
                        touched.add(s)
            elif holders:  # its holders changed: the edges of its texts
                touched.update(by_key.get(key, ()))
        if rescan:
            texts = list(rescan)
            for s, found in zip(texts, self._scan_many(texts), strict=True):
                self._store(s, found)
                self._refresh(s, found)  # at once, while its sets are in the caches
        if appeared:
            may = sorted({s for key in appeared for s in self._texts_with(key)} - rescan)
            for s, found in zip(may, self._scan_many(may, NameTrie(appeared)), strict=True):
                if found:
                    self._store(s, sorted([*occ.get(s, ()), *found]))
                    touched.add(s)
        for s in sorted(touched - rescan):
            self._refresh(s)
        self.gen += 1

    def _scan_many(
        self, texts: Sequence[int], trie: NameTrie | None = None
    ) -> list[list[Occurrence]]:
        """Each of ``texts``' occurrences of the names of ``trie`` (the index's: every name),
        every text's tokens matched in one compiled call."""
        text_of = self._text_of
        found: list[list[Occurrence]] = [[] for _ in texts]
        scanned = (trie or self.index.name_trie()).match_texts([folded(text_of(u)) for u in texts])
        for k, i, j, key in scanned:
            found[k].append(Occurrence(i, j, key))
        return found

    def _texts_with(self, key: str) -> list[int]:
        """The concepts whose text holds every term of the name ``key`` (a superset of those
        holding the name), from the search index's postings."""
        terms = {t for t in (stem(token) for token in key.split(NAME_SEP)) if t}
        found: list[int] = self.index.terms.holding_all(terms, TEXT_HITS).tolist()
        return found

    def _store(self, u: int, occurrences: list[Occurrence]) -> None:
        """Replace u's occurrences, keeping ``by_key`` (edges: ``_refresh``)."""
        old = {o.key for o in self.occ.pop(u, ())}
        new = {o.key for o in occurrences}
        by_key = self.by_key
        for key in old - new:
            _let_go(by_key, key, u)
        if occurrences:
            self.occ[u] = occurrences
            for key in new - old:
                _hold(by_key, key, u)

    def _refresh(self, u: int, occurrences: Sequence[Occurrence] | None = None) -> None:
        """u's plain edges and contested occurrences from its occurrences (``occurrences``,
        when the caller has them at hand), now."""
        plain, contested = split(self.occ.get(u, ()) if occurrences is None else occurrences)
        targets: set[int] = set()
        if plain:
            cached = self._holders
            for o in plain:
                found = cached.get(o.key)
                targets.update(self.holders(o.key) if found is None else found)
            targets.discard(u)
            if targets:
                targets.difference_update(self._declared(u))
        old = self.out.pop(u, set())
        inn = self.inn
        for v in old - targets:
            _let_go(inn, v, u)
        for v in targets - old:
            _hold(inn, v, u)
        if targets:
            self.out[u] = targets
        if contested:
            self.contested[u] = contested
        elif self.contested:
            self.contested.pop(u, None)

    def holders(self, key: str) -> list[int]:
        """The concepts holding the name ``key`` (cached until ``names_changed`` names it;
        the follower's thread only: readers ask the index)."""
        found = self._holders.get(key)
        if found is None:
            found = self._holders[key] = self.index.named_key(key)
        return found

    # --- reading (read lock held) --------------------------------------------------------

    def first_offsets(self, u: int, mask: np.ndarray) -> dict[int, int]:
        """Visible concept -> character offset of the first name of it u's text mentions."""
        occurrences = self.occ.get(u)
        if not occurrences or not mask[u]:
            return {}
        taken = resolve(self.index, u, occurrences, mask, self._declared(u))
        return offsets(self._text_of(u), taken)

    def named(self, text: str, mask: np.ndarray) -> set[int]:
        """The visible concepts ``text`` (a question) names, by the same rule as a concept's
        text."""
        taken = resolve(self.index, -1, scan(self.index, text), mask, ())
        return {v for _, targets in taken for v in targets}

    def view(self, mask: np.ndarray) -> MentionView:
        """The mention edges of the view ``mask``: its contested texts resolved once per
        mask and state (cached; the cache keeps the mask's array alive, so its address names
        it alone)."""
        base = mask if mask.base is None else mask.base
        assert isinstance(base, np.ndarray)
        key = (base.__array_interface__["data"][0], len(mask))
        with self._lock:
            hit = self._views.get(key)
            if hit is not None and hit[1] == self.gen and hit[0] is base:
                self._views.move_to_end(key)
                return hit[2]
        cout: dict[int, set[int]] = {}
        cin: dict[int, set[int]] = {}
        for s, occurrences in self.contested.items():
            if s >= len(mask) or not mask[s]:
                continue
            for _, targets in resolve(self.index, s, occurrences, mask, self._declared(s)):
                for v in targets:
                    cout.setdefault(s, set()).add(v)
                    cin.setdefault(v, set()).add(s)
        found = MentionView(self, mask, cout, cin)
        with self._lock:
            self._views[key] = (base, self.gen, found)
            self._views.move_to_end(key)
            while len(self._views) > VIEW_CACHE_ENTRIES:
                self._views.popitem(last=False)
        return found


class Saved(NamedTuple):
    """A ``Mentions`` as a checkpoint holds it: every occurrence (by source, then first token)
    and the plain edges (by source, then target)."""

    src: np.ndarray
    start: np.ndarray
    end: np.ndarray
    key: np.ndarray  # the name key's number in ``keys``
    keys: Sequence[str]
    edge_src: np.ndarray
    edge_dst: np.ndarray


_occurrence = partial(tuple.__new__, Occurrence)  # an Occurrence of a (start, end, key) tuple


def _runs(owner: np.ndarray) -> tuple[list[int], list[slice]]:
    """Of ``owner`` (sorted), each value once and the slice of its run."""
    cuts = (np.flatnonzero(owner[1:] != owner[:-1]) + 1).tolist()
    starts = [0, *cuts] if len(owner) else []
    heads: list[int] = owner[starts].tolist()
    return heads, list(map(slice, starts, [*cuts, len(owner)]))


def _sets(members: np.ndarray, parts: list[slice]) -> Iterator[set[int]]:
    values = members.tolist()
    return map(set, map(values.__getitem__, parts))


def _grouped(owner: np.ndarray, members: np.ndarray) -> tuple[list[int], Iterator[set[int]]]:
    """Of pairs sorted by ``owner``, each owner and the set of its members."""
    heads, parts = _runs(owner)
    return heads, _sets(members, parts)


K = TypeVar("K")  # a key of a map of sets: a name key, or a concept


def _hold(index: dict[K, set[int]], key: K, u: int) -> None:
    """Add ``u`` to ``index[key]``, the set made when it is the first."""
    found = index.get(key)
    if found is None:
        index[key] = {u}
    else:
        found.add(u)


def _let_go(index: dict[K, set[int]], key: K, u: int) -> None:
    """Take ``u`` out of ``index[key]`` (which holds it), the key dropped once empty."""
    held = index[key]
    held.discard(u)
    if not held:
        del index[key]
