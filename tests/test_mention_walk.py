"""``ranked``'s walk over links and mentions (``kbgraph.agent.mentioned``) against the plain
Python walk of ``tests/mention_walk_oracle.py`` over edges found from the texts themselves:
the same rows, scores, hops, via and by, in every view, whatever order the concepts were
written (interned) in, with hubs named in more texts than ``BULK_MASK``."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kb_events import upsert

from kbgraph.access import Rule, RuleSet, canonical, visible
from kbgraph.agent import mentioned
from kbgraph.projection import KBProjection
from kbgraph.projection.mentions import BULK_MASK
from tests import mention_walk_oracle as oracle

WORDS = [f"w{i}" for i in range(12)]
RULES: list[RuleSet | None] = [
    None,
    canonical([Rule(frozenset({"a"}), frozenset())]),
    canonical([Rule(frozenset(), frozenset({"t1"}))]),
    canonical([Rule(frozenset({"b", "c"}), frozenset()), Rule(frozenset(), frozenset({"t2"}))]),
]
ALPHA = 0.25


def collection(concept_id: str) -> str:
    return concept_id.split("/")[0]


@st.composite
def knowledge_bases(draw: st.DrawFn) -> list[dict]:
    """Concepts named by one or two words, texts naming others, a few links, and maybe a
    hub: a name held by more texts than ``BULK_MASK``."""
    n = draw(st.integers(2, BULK_MASK + 16))
    hub = draw(st.sampled_from([0.0, 0.9]))
    ids = [f"{'abc'[i % 3]}/{i:03d}" for i in range(n)]
    word = st.sampled_from(WORDS)
    concepts = []
    for i, concept_id in enumerate(ids):
        title = "hub" if i == 0 and hub else " ".join(draw(st.lists(word, min_size=1, max_size=2)))
        text = draw(st.lists(word, max_size=6))
        if i and draw(st.floats(0.0, 1.0)) < hub:
            text.append("hub")
        links = draw(st.lists(st.sampled_from([*ids, "z/missing"]), max_size=1))
        if draw(st.integers(0, 3)):
            links = []  # sparse links: where the walk takes mentions
        concepts.append(
            {
                "id": concept_id,
                "title": title,
                "text": " ".join(text),
                "type": draw(st.sampled_from(["t1", "t2"])),
                "links": [t for t in links if t != concept_id],
            }
        )
    return draw(st.permutations(concepts))  # the order written: how ids are interned


def adjacency(
    concepts: list[dict], shown: set[str], node: dict[str, int]
) -> tuple[dict[int, dict[int, float]], set[tuple[int, int]]]:
    """The visible union, from the texts and links themselves, and its mentions."""
    seen = [c for c in concepts if c["id"] in shown]
    links = {c["id"]: set(c["links"]) for c in seen}
    texts = {c["id"]: c["text"] for c in seen}
    names = {c["id"]: c["title"] for c in seen}
    near: dict[int, dict[int, float]] = {}
    edges = {(node[s], node[t]) for s, t in oracle.mention_edges(texts, names, links)}
    for s, t in edges:
        near.setdefault(s, {})[t] = mentioned.MENTION_WEIGHT
        near.setdefault(t, {})[s] = mentioned.MENTION_WEIGHT
    for s, targets in links.items():
        for t in targets & shown:
            near.setdefault(node[s], {})[node[t]] = 1.0
            near.setdefault(node[t], {})[node[s]] = 1.0
    return near, edges


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knowledge_bases(), st.sampled_from(RULES), st.data())
def test_the_walk_equals_the_plain_python_walk(
    concepts: list[dict], rules: RuleSet | None, data: st.DataObject
) -> None:
    kb = KBProjection("w")
    kb.attach_mentions(True)
    for c in concepts:
        kb.apply_event(
            upsert(c["id"], title=c["title"], text=c["text"], type=c["type"], links=c["links"])
        )
    shown = sorted(c["id"] for c in concepts if visible(rules, collection(c["id"]), c["type"]))
    if not shown:
        return
    with kb.read() as snap:
        assert kb.mentions is not None
        view = snap.view(rules)
        node = {i: n for i in shown if (n := snap.node(i)) is not None}
        near, edges = adjacency(concepts, set(shown), node)
        picked = st.sampled_from(shown)
        weights = {
            node[i]: w
            for i, w in data.draw(
                st.dictionaries(picked, st.sampled_from([1.0, 0.5, 0.25]), min_size=1)
            ).items()
        }
        search = {
            node[i]: s for i, s in data.draw(st.dictionaries(picked, st.floats(0.05, 1.0))).items()
        }
        query = " ".join(data.draw(st.lists(st.sampled_from([*WORDS, "hub"]), max_size=4)))
        limit = data.draw(st.integers(1, 40))
        got = mentioned.ranked(view, kb.mentions, query, weights, search, limit, ALPHA)
        named = kb.mentions.named(query, view.mask) if query else set()
        into = {v: sum(1 for _, t in edges if t == v) for v in named}
        want = oracle.ranked(
            near, snap.ids.__getitem__, named, into.__getitem__, weights, search, limit, ALPHA
        )
    assert [(r.node, r.score, r.hops, r.via, by) for r, by in got] == want
