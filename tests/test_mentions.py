"""Mention edges (kbgraph.projection.mentions): an independent oracle, incremental equals
rebuilt (also through a checkpoint), narrowed equals never-written."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kb_events import delete, link_added, link_removed, upsert
from msgspec import UNSET

from kbgraph.access import Rule, RuleSet, canonical, visible
from kbgraph.agent import tools
from kbgraph.agent.shapes import GraphContextRequest, GraphPathRequest
from kbgraph.events import Event
from kbgraph.projection import KBProjection, checkpoint
from kbgraph.projection.mentions import Occurrence, alone, split, unlinked
from kbgraph.search import STOP_WORDS, SearchIndex, tokenize
from kbgraph.store import KBState, LogRecord
from kbgraph.store.model import ConceptState
from tests.histories import apply_in_deliveries

WORDS = ["new", "york", "city", "the", "of", "paris", "big", "apple", "rome"]
IDS = ["a/ny", "a/nyc", "b/paris", "b/apple", "c/rome", "top", "a/city", "b/the"]
RULES: list[RuleSet] = [
    canonical([Rule(frozenset({"a"}), frozenset())]),
    canonical([Rule(frozenset(), frozenset({"t1"}))]),
    canonical([Rule(frozenset({"b", "c"}), frozenset()), Rule(frozenset(), frozenset({"t2"}))]),
]


@dataclass
class Concept:
    version: int
    title: str
    aliases: list[str]
    text: str
    type: str
    links: set[str] = field(default_factory=set)


def collection(concept_id: str) -> str:
    return concept_id.split("/")[0] if "/" in concept_id else ""


# --- the oracle: a plain longest-match scan over folded tokens ------------------------------


def oracle(kb: dict[str, Concept], rules: RuleSet | None) -> set[tuple[str, str]]:
    """(source, target) of every mention among the concepts ``rules`` shows."""
    seen = {i: c for i, c in kb.items() if visible(rules, collection(i), c.type)}
    names: dict[tuple[str, ...], set[str]] = {}
    for i, c in seen.items():
        for name in [c.title, *c.aliases]:
            tokens = tuple(tokenize(name))
            if any(t not in STOP_WORDS for t in tokens):
                names.setdefault(tokens, set()).add(i)
    longest = max((len(n) for n in names), default=0)
    edges = set()
    for i, c in seen.items():
        tokens = tokenize(c.text)
        at = 0
        while at < len(tokens):
            for size in range(min(longest, len(tokens) - at), 0, -1):
                holders = names.get(tuple(tokens[at : at + size]))
                if holders:
                    edges |= {(i, v) for v in holders if v != i and v not in c.links}
                    at += size
                    break
            else:
                at += 1
    return edges


def edges_of(kb: KBProjection, rules: RuleSet | None) -> set[tuple[str, str]]:
    with kb.read() as snap:
        view = snap.view(rules)
        mentions = kb.mentions
        assert mentions is not None
        mv = mentions.view(view.mask)
        ids = snap.ids
        out = {(ids[u], ids[v]) for u in range(len(ids)) for v in mv.out(u)}
        back = {(ids[u], ids[v]) for v in range(len(ids)) for u in mv.into(v)}
        assert out == back  # both directions agree
        for u in range(len(ids)):
            if view.mask[u]:
                first = mentions.first_offsets(u, view.mask)
                assert {(ids[u], ids[v]) for v in first} == {e for e in out if e[0] == ids[u]}
        return out


# --- histories ------------------------------------------------------------------------------

names_st = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
text_st = st.lists(st.sampled_from([*WORDS, "New", "YORK", "x"]), max_size=14).map(" ".join)


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, dict]]:
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["upsert", "upsert", "upsert", "delete", "link", "unlink"]))
        subject = draw(st.sampled_from(IDS))
        if kind == "upsert":
            steps.append(
                (
                    kind,
                    {
                        "subject": subject,
                        "title": draw(names_st),
                        "aliases": draw(st.lists(names_st, max_size=2)),
                        "text": draw(text_st),
                        "type": draw(st.sampled_from(["t1", "t2"])),
                        "links": draw(st.lists(st.sampled_from(IDS), max_size=2)),
                    },
                )
            )
        else:
            steps.append((kind, {"subject": subject, "target": draw(st.sampled_from(IDS))}))
    return steps


def run(steps: list[tuple[str, dict]]) -> tuple[list[Event], dict[str, Concept]]:
    """The events of ``steps`` that the store would apply, and the state after them."""
    kb: dict[str, Concept] = {}
    versions: dict[str, int] = {}
    events: list[Event] = []
    for kind, a in steps:
        s = a["subject"]
        v = versions[s] = versions.get(s, 0) + 1
        if kind == "upsert":
            events.append(
                upsert(s, v, title=a["title"], aliases=a["aliases"], text=a["text"],
                       type=a["type"], links=a["links"])
            )  # fmt: skip
            links = set(a["links"]) - {s}
            kb[s] = Concept(v, a["title"], a["aliases"], a["text"], a["type"], links)
        elif s not in kb:
            continue
        elif kind == "delete":
            events.append(delete(s, v))
            del kb[s]
        elif kind == "link":
            events.append(link_added(s, a["target"], v))
            if a["target"] != s:
                kb[s].links.add(a["target"])
        else:
            events.append(link_removed(s, a["target"], v))
            kb[s].links.discard(a["target"])
    return events, kb


def state_of(kb: dict[str, Concept], seq: int) -> KBState:
    return KBState(
        seq,
        [
            ConceptState(i, c.version, c.title, c.type, "", [], c.text, sorted(c.links), c.aliases)
            for i, c in sorted(kb.items())
        ],
    )


def applied(events: list[Event], rules: list[RuleSet]) -> KBProjection:
    kb = KBProjection("m")
    kb.attach_mentions(True)
    for r in rules:  # masks cached before the events, so they are patched along
        with kb.read():
            kb.mask(r)
    for e in events:
        kb.apply_event(e)
    return kb


def built(state: dict[str, Concept]) -> KBProjection:
    kb = KBProjection("m")
    kb.build(state_of(state, 1))
    kb.attach_mentions(True)
    return kb


# --- the properties -------------------------------------------------------------------------


@settings(max_examples=150)
@given(histories())
def test_incremental_equals_oracle_and_rebuilt(steps: list[tuple[str, dict]]) -> None:
    events, state = run(steps)
    kb = applied(events, RULES)
    fresh = built(state)
    for rules in [None, *RULES]:
        expected = oracle(state, rules)
        assert edges_of(kb, rules) == expected
        assert edges_of(fresh, rules) == expected


@settings(max_examples=100)
@given(histories(), st.sampled_from(RULES))
def test_narrowed_equals_never_written(steps: list[tuple[str, dict]], rules: RuleSet) -> None:
    events, state = run(steps)
    kb = applied(events, [rules])
    shown = {i: c for i, c in state.items() if visible(rules, collection(i), c.type)}
    never = built(shown)
    assert edges_of(kb, rules) == edges_of(never, None)


@settings(max_examples=100)
@given(histories(), st.lists(st.integers(1, 6), max_size=25))
def test_a_batch_patched_at_once_equals_the_oracle(
    steps: list[tuple[str, dict]], sizes: list[int]
) -> None:
    """``KBProjection.apply`` notes a batch's mention changes and patches them once, at its
    end (``Mentions.flush``): the same edges as event by event, deliveries of any size."""
    events, state = run(steps)
    kb = KBProjection("m")
    kb.attach_mentions(True)
    for r in RULES:
        with kb.read():
            kb.mask(r)
    records = [LogRecord(i + 1, "m", i + 1, e, False) for i, e in enumerate(events)]
    apply_in_deliveries(records, sizes, kb)
    for rules in [None, *RULES]:
        assert edges_of(kb, rules) == oracle(state, rules)
    assert occurrences(kb) == occurrences(built(state))  # no stale name left behind


def test_a_batch_failing_midway_keeps_the_mentions_of_what_it_applied() -> None:
    """An event that raises inside ``apply`` (a bug's way in) leaves the mention edges of the
    events applied before it, flushed, not waiting for a later batch."""
    kb = KBProjection("m")
    kb.attach_mentions(True)
    good = [upsert("t", 1, title="Old Name"), upsert("s", 1, text="about the old name")]
    broken = msgspec.structs.replace(upsert("u", 1, text="x"), data=None)
    records = [LogRecord(i + 1, "m", i + 1, e, True) for i, e in enumerate([*good, broken])]
    deliveries = [[records[0]], records[1:]]  # the broken event after a good one, in one
    with pytest.raises(AttributeError):
        while deliveries:
            deliveries = deliveries[kb.apply(deliveries) :]
    assert kb.seq == 1  # the broken delivery is not counted applied
    assert edges_of(kb, None) == {("s", "t")}


def occurrences(kb: KBProjection) -> dict[str, list[Occurrence]]:
    assert kb.mentions is not None
    with kb.read() as snap:
        return {snap.ids[u]: found for u, found in kb.mentions.occ.items()}


def test_longest_name_first_and_shadowing_by_a_hidden_name() -> None:
    state = {
        "a/ny": Concept(1, "New York", [], "", "t1"),
        "b/nyc": Concept(1, "New York City", [], "", "t1"),
        "a/x": Concept(1, "X", [], "I love New York City and New York.", "t1"),
    }
    kb = built(state)
    assert edges_of(kb, None) == {("a/x", "b/nyc"), ("a/x", "a/ny")}
    only_a = canonical([Rule(frozenset({"a"}), frozenset())])
    # the hidden, longer name shadows nothing: "New York" is mentioned from both places
    assert edges_of(kb, only_a) == {("a/x", "a/ny")}
    with kb.read() as snap:
        view = snap.view(only_a)
        x = snap.node("a/x")
        assert x is not None and kb.mentions is not None
        assert kb.mentions.first_offsets(x, view.mask) == {snap.node("a/ny"): 7}


def test_rules_of_the_docs() -> None:
    """A shared name mentions both holders; stop words alone name nothing; no self-mention;
    a linked concept's name is its link."""
    state = {
        "a": Concept(1, "Mercury", [], "", "t"),
        "b": Concept(1, "Planet", ["Mercury"], "", "t"),
        "c": Concept(1, "The Doors", [], "", "t"),
        "d": Concept(1, "Of The", [], "", "t"),
        "e": Concept(1, "E", [], "Mercury, the doors, of the, e and E", "t"),
        "f": Concept(1, "F", [], "Planet Mercury", "t", {"b"}),
    }
    assert edges_of(built(state), None) == {("e", "a"), ("e", "b"), ("e", "c"), ("f", "a")}


def test_rename_patches_every_text_naming_it() -> None:
    kb = KBProjection("m")
    kb.attach_mentions(True)
    kb.apply_event(upsert("t", 1, title="Old Name"))
    for i in range(50):
        kb.apply_event(upsert(f"s{i:02}", 1, text=f"about the old name and new name {i}"))
    assert {s for s, _ in edges_of(kb, None)} == {f"s{i:02}" for i in range(50)}
    kb.apply_event(upsert("t", 2, title="Other"))
    assert edges_of(kb, None) == set()
    kb.apply_event(upsert("t", 3, title="Name", aliases=["New name"]))
    expected = {(f"s{i:02}", "t") for i in range(50)}
    assert edges_of(kb, None) == expected
    kb.apply_event(delete("t", 4))
    assert edges_of(kb, None) == set()


def union_oracle(
    state: dict[str, Concept], rules: RuleSet | None, directed: bool
) -> nx.Graph | nx.DiGraph:
    """The visible concepts joined by their links and by the oracle's mentions."""
    g = nx.DiGraph() if directed else nx.Graph()
    seen = [i for i, c in state.items() if visible(rules, collection(i), c.type)]
    g.add_nodes_from(seen)
    g.add_edges_from((i, t) for i in seen for t in state[i].links if t in seen)
    g.add_edges_from(oracle(state, rules))
    return g


def smallest_path(g: nx.Graph | nx.DiGraph, source: str, target: str) -> list[str]:
    if not nx.has_path(g, source, target):
        return []
    return min(nx.all_shortest_paths(g, source, target))


@settings(max_examples=60)
@given(histories(), st.data())
def test_graph_path_over_all_edges_equals_a_bfs_oracle(
    steps: list[tuple[str, dict]], data: st.DataObject
) -> None:
    events, state = run(steps)
    kb = applied(events, RULES)
    rules = data.draw(st.sampled_from([None, *RULES]))
    direction = data.draw(st.sampled_from(["both", "out"]))
    g = union_oracle(state, rules, direction == "out")
    if not len(g):
        return
    source = data.draw(st.sampled_from(sorted(g)))
    target = data.draw(st.sampled_from(sorted(g)))
    request = GraphPathRequest(source, target, direction, edges="all", max_hops=12)
    with kb.read() as snap:
        got = tools.graph_path(snap, snap.view(rules), request)
    assert [step.id for step in got.path] == smallest_path(g, source, target)


def test_graph_path_edges_is_checked_and_links_stay_the_default() -> None:
    kb = built(
        {
            "a": Concept(1, "Alpha", [], "see Beta", "t"),
            "b": Concept(1, "Beta", [], "", "t"),
        }
    )
    with kb.read() as snap:
        view = snap.view(None)
        assert tools.graph_path(snap, view, GraphPathRequest("a", "b")).path == []
        both = tools.graph_path(snap, view, GraphPathRequest("a", "b", edges="all"))
        assert [s.id for s in both.path] == ["a", "b"]
        back = GraphPathRequest("b", "a", direction="out", edges="all")
        assert tools.graph_path(snap, view, back).path == []
        with pytest.raises(tools.ToolError, match='invalid edges "some": expected links or all'):
            tools.graph_path(snap, view, GraphPathRequest("a", "b", edges="some"))


def state(kb: KBProjection) -> tuple[object, ...]:
    """Every part of a KB's mentions, lists in order (a build's and a patch's order may
    differ)."""
    m = kb.mentions
    assert m is not None
    return (
        {s: sorted(o) for s, o in m.occ.items()},
        m.by_key,
        m.out,
        m.inn,
        {s: sorted(o) for s, o in m.contested.items()},
    )


def round_trip(kb: KBProjection, folder: Path, mentions: bool = True) -> KBProjection:
    path = checkpoint.write(folder, "store", 1, None, {"m": kb})
    header, start = checkpoint.read_header(path)
    loaded = checkpoint.load(path, header, start).kbs["m"]
    assert (
        header.kbs[0].mentions == (loaded.saved_mentions is not None) == (kb.mentions is not None)
    )
    carried = loaded.index.built_trie()  # the name trie too, where it kept mentions
    assert (carried is not None) == header.kbs[0].name_trie == (kb.mentions is not None)
    loaded.attach_mentions(mentions)  # as the follower does after a load
    if carried is not None:
        assert loaded.index.built_trie() is carried  # restored, not built again
    return loaded


@settings(max_examples=40)
@given(histories(), histories())
def test_a_checkpoint_round_trip_keeps_the_mentions(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, dict]],
    later: list[tuple[str, dict]],
) -> None:
    """Restored from the checkpoint's occurrences (no text scanned), the mentions equal the
    event-by-event ones part for part and a build's edges, and stay so through more events."""
    events, state_before = run(steps)
    kb = applied(events, [])
    loaded = round_trip(kb, tmp_path_factory.mktemp("ckpt"))
    assert state(loaded) == state(kb)
    for rules in [None, *RULES]:
        assert edges_of(loaded, rules) == edges_of(built(state_before), rules)
    everything, state_after = run(steps + later)
    for e in everything[len(events) :]:
        kb.apply_event(e)
        loaded.apply_event(e)
    assert state(loaded) == state(kb)
    fresh = built(state_after)
    for rules in [None, *RULES]:
        expected = oracle(state_after, rules)
        assert edges_of(loaded, rules) == edges_of(fresh, rules) == expected


def test_a_checkpoint_without_mentions_is_built_from_the_texts_and_the_reverse(
    tmp_path: Path,
) -> None:
    """Written with mentions off, loaded with them on: built from the texts, as a restart
    that carried none; written with them on, loaded off: none kept."""
    events, now = run(
        [
            ("upsert", {"subject": "a/ny", "title": "new york", "aliases": [],
                        "text": "rome", "type": "t1", "links": []}),
            ("upsert", {"subject": "c/rome", "title": "rome", "aliases": [],
                        "text": "new york city", "type": "t1", "links": []}),
        ]
    )  # fmt: skip
    off = applied(events, [])
    off.attach_mentions(False)
    folder = tmp_path / "off"
    path = checkpoint.write(folder, "store", 1, None, {"m": off})
    assert not checkpoint.read_header(path)[0].kbs[0].mentions
    on = round_trip(off, tmp_path / "again")
    assert edges_of(on, None) == oracle(now, None) == {("a/ny", "c/rome"), ("c/rome", "a/ny")}
    assert round_trip(applied(events, []), tmp_path / "on", mentions=False).mentions is None


def test_a_format_1_checkpoint_carries_no_mentions_and_they_are_built() -> None:
    """A checkpoint of the format before mentions were kept (which has no ``mentions`` arrays)
    is never taken as one holding none: its KBs restore no mention state, so attaching them
    builds from the texts (its answers equal a build's: ``test_checkpoint``'s format 1 test)."""
    folder = Path(__file__).parent / "data" / "checkpoint-format-1" / "ckpt"
    (path,) = checkpoint.candidates(folder)
    header, start = checkpoint.read_header(path)
    assert header.format == 1 < checkpoint.FORMAT
    assert header.kbs and not any(entry.mentions for entry in header.kbs)
    for kb in checkpoint.load(path, header, start).kbs.values():
        assert kb.saved_mentions is None


def test_ranked_says_by_which_edge_and_seeds_from_the_names_a_question_holds() -> None:
    kb = built(
        {
            "film": Concept(1, "The Long Road", [], "A film directed by Ann Smith.", "t"),
            "ann": Concept(1, "Ann Smith", [], "A director, daughter of Bo Lee.", "t"),
            "bo": Concept(1, "Bo Lee", [], "An actor.", "t", {"ann"}),
        }
    )
    request = GraphContextRequest(query="Who made The Long Road?")
    with kb.read() as snap:
        got = tools.graph_context(snap, snap.view(None), request)
    by = {row.id: (row.hops, row.via, row.by) for row in got.ranked}
    assert by["film"][0] == 0 and by["film"][2] is UNSET  # a seed
    assert by["ann"] == (1, "film", "mention")
    assert by["bo"] == (2, "ann", "link")
    assert [s.id for s in got.seeds] == ["film"]  # the seeds' rule is search's alone
    assert [r.id for r in got.results] == []  # and the results walk the links: none from film


def test_ranked_walks_links_alone_where_links_are_dense() -> None:
    """At half a link per concept or more, ``ranked`` is the links' rule, mentions or not."""
    names = ["Alpha", "Beta", "Gamma", "Delta"]
    state = {
        n.lower(): Concept(1, n, [], f"{n} names {names[i - 1]} here", "t", {names[i - 2].lower()})
        for i, n in enumerate(names)
    }
    with_mentions = built(state)
    without = KBProjection("m")
    without.build(state_of(state, 1))
    request = GraphContextRequest(query="alpha beta")
    with with_mentions.read() as a, without.read() as b:
        got = tools.graph_context(a, a.view(None), request)
        assert got == tools.graph_context(b, b.view(None), request)
        assert {row.by for row in got.ranked if row.hops} == {"link"}
    sparse = {i: Concept(1, c.title, [], c.text, "t") for i, c in state.items()}  # no links
    with built(sparse).read() as snap:
        got = tools.graph_context(snap, snap.view(None), request)
        assert {row.by for row in got.ranked if row.hops} == {"mention"}


def test_a_mention_offset_where_folding_joins_characters() -> None:
    """ "™" folds into letters ("a™" is one word, "atm"): the offset is still the name's."""
    index = SearchIndex()
    index.put(0, "Widget", "")
    index.put(1, "ATM", "")
    text = "a™ then Widget"
    mask = np.ones(2, np.uint8)
    assert unlinked(index, text, 9, mask, []) == {1: 0, 0: text.index("Widget")}


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 12), st.integers(1, 4)), max_size=8),
        min_size=1,
        max_size=5,
    )
)
def test_the_builds_split_of_many_texts_equals_split_text_by_text(
    texts: list[list[tuple[int, int]]],
) -> None:
    """``alone`` (the first build's, all texts at once) marks exactly ``split``'s plain."""
    rows = []
    expected = []
    for s, spans in enumerate(texts):
        occurrences = sorted({Occurrence(i, i + size, "k") for i, size in spans})
        plain, _ = split(occurrences)
        rows += [(s, o) for o in occurrences]
        expected += [o in plain for o in occurrences]
    if not rows:
        return
    src = np.array([s for s, _ in rows], np.int64)
    start = np.array([o.start for _, o in rows], np.int64)
    end = np.array([o.end for _, o in rows], np.int64)
    assert alone(src, start, end).tolist() == expected
