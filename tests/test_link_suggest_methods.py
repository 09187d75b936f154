"""link_suggest's two methods over HTTP (structure = the seed's rule, checked against networkx;
hybrid = structure plus mentions, rare terms and tags), the evidence module on its own, and a
question whose only matching note is hidden."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.agent.evidence import shares
from kbgraph.agent.tools import PPR_ALPHA, SUGGEST_MENTION_WEIGHT, SUGGEST_WALK_WEIGHT
from kbgraph.projection.mentions import unlinked
from kbgraph.search import STOP_WORDS, SearchIndex, tokens_with_offsets
from tests.kb_events import upsert
from tests.support import ADMIN, INFRA, Service

KB = "homelab"


def suggest(service: Service, seq: int, concept_id: str, **extra) -> dict:
    response = service.tool(ADMIN, KB, "link_suggest", {"id": concept_id, **extra}, seq)
    assert response.status_code == 200, response.text
    return response.json()


def test_method_is_checked_and_echoed(service: Service) -> None:
    seq = service.write(KB, [upsert("a/x", links=["a/y"]), upsert("a/y")])
    for method in ("hybrid", "structure"):
        assert suggest(service, seq, "a/x", method=method)["method"] == method
    assert suggest(service, seq, "a/x")["method"] == "hybrid"
    for bad in ("Hybrid", "", "ra"):
        response = service.tool(ADMIN, KB, "link_suggest", {"id": "a/x", "method": bad}, seq)
        assert response.status_code == 422
        assert response.json() == {"error": f'invalid method "{bad}": expected hybrid or structure'}
    wrong_type = service.tool(ADMIN, KB, "link_suggest", {"id": "a/x", "method": 3}, seq)
    assert wrong_type.status_code == 422


@pytest.mark.parametrize("seed", range(3))
def test_structure_equals_networkx(service: Service, seed: int) -> None:
    rng = random.Random(seed)
    ids = [f"c/n{i:02d}" for i in range(30)]
    links = {u: sorted(set(rng.sample(ids, 4)) - {u}) for u in ids}
    statuses = {u: rng.choice(["", "", "", "deprecated", "superseded"]) for u in ids}
    seq = service.write(KB, [upsert(u, links=links[u], status=statuses[u]) for u in ids])
    g = nx.Graph()
    g.add_nodes_from(ids)
    g.add_edges_from((u, v) for u in ids for v in links[u])
    for x in ids[:10]:
        nbrs = set(g[x])
        cands = [v for v in ids if v != x and v not in nbrs and len(nbrs & set(g[v])) >= 2]
        ra = {v: s for _, v, s in nx.resource_allocation_index(g, [(x, v) for v in cands])}
        # networkx sums a candidate's terms in set order, which moves with PYTHONHASHSEED: a
        # tie can differ in the last bit. Equal scores are ties, ranked by id (docs/api.md).
        ranked = sorted(ra, key=lambda v: (-round(ra[v], 12), v))
        kept = [v for v in ranked if statuses[v] not in ("deprecated", "superseded")][:20]
        got = suggest(service, seq, x, method="structure", limit=20)
        assert [c["id"] for c in got["candidates"]] == kept
        for c in got["candidates"]:
            assert c["score"] == round(ra[c["id"]], 4)
            assert c["common"] == sorted(nbrs & set(g[c["id"]]))[:5]
            assert "mention" not in c


def test_hybrid_finds_unlinked_mentions_outside_links(service: Service) -> None:
    text = (
        "Nightly jobs: see Backup with restic for the details. "
        "Passwords live in Vaultwarden, which restic also copies."
    )
    seq = service.write(
        KB,
        [
            upsert("ops/x", links=["ops/backup"], title="Nightly", text=text),
            upsert("ops/backup", title="Backup with restic", text="a b c"),
            upsert("ops/restic", title="restic", text="d e f"),
            upsert("ops/vault", title="Vaultwarden", text="g h i"),
            upsert("ops/old", title="Nightly jobs", status="deprecated", text="j"),
        ],
    )
    got = suggest(service, seq, "ops/x")
    by_id = {c["id"]: c for c in got["candidates"]}
    assert set(by_id) == {"ops/restic", "ops/vault"}  # ops/old is retired; ops/backup linked
    for c in by_id.values():
        assert c["common"] == []
        assert c["score"] >= SUGGEST_MENTION_WEIGHT
    assert by_id["ops/restic"]["score"] == SUGGEST_MENTION_WEIGHT  # "restic" is in 3 of 5: not rare
    # "restic" inside "Backup with restic" (linked) is not a mention; the later one is.
    assert by_id["ops/restic"]["mention"].startswith("…")
    assert "restic also copies" in by_id["ops/restic"]["mention"]
    assert "Passwords live in Vaultwarden" in by_id["ops/vault"]["mention"]
    # "vaultwarden" is a rare term the two share: more evidence than the mention alone
    assert [c["id"] for c in got["candidates"]] == ["ops/vault", "ops/restic"]
    assert suggest(service, seq, "ops/x", method="structure")["candidates"] == []


def test_hybrid_adds_the_walk_beyond_two_hops(service: Service) -> None:
    """A chain x - a - b - c and a spur a - d: b and d share a with x (resource allocation
    1/3 plus the walk), c is three hops away and has the walk alone; each walk share is the
    PPR mass from x over the best of it (x left out), checked against a dense solve."""
    names = ["x", "a", "b", "c", "d"]
    edges = [("x", "a"), ("a", "b"), ("b", "c"), ("a", "d")]
    words = {"x": "alpha", "a": "bravo", "b": "charlie", "c": "delta", "d": "echo"}
    seq = service.write(
        KB,
        [
            upsert(f"w/{n}", title=words[n], text=words[n],
                   links=[f"w/{t}" for s, t in edges if s == n])
            for n in names
        ],
    )  # fmt: skip
    at = {n: i for i, n in enumerate(names)}
    adj = np.zeros((5, 5))
    for s, t in edges:
        adj[at[s], at[t]] = adj[at[t], at[s]] = 1.0
    walk = adj / adj.sum(axis=1, keepdims=True)
    start = np.zeros(5)
    start[at["x"]] = 1.0
    ppr = np.linalg.solve((np.eye(5) - (1 - PPR_ALPHA) * walk).T, PPR_ALPHA * start)
    best = max(ppr[at[n]] for n in names if n != "x")
    got = {c["id"]: c["score"] for c in suggest(service, seq, "w/x", limit=20)["candidates"]}
    assert set(got) == {"w/b", "w/c", "w/d"}  # a is linked
    for n, ra in (("b", 1 / 3), ("d", 1 / 3), ("c", 0.0)):
        want = ra + SUGGEST_WALK_WEIGHT * ppr[at[n]] / best
        assert got[f"w/{n}"] == pytest.approx(want, abs=2e-3)  # push's eps, then rounding


def test_mentions_names_and_aliases_as_whole_words() -> None:
    index = SearchIndex()
    index.put(0, "Home", "")
    index.put(1, "Reverse proxy", "", ["Caddy"])
    index.put(2, "DNS", "")
    index.put(3, "Café network", "")
    text = "The homelab's reverse  PROXY is caddy; DNSSEC is off; the cafe network too."
    mask = np.ones(4, np.uint8)
    found = unlinked(index, text, 9, mask, set())
    assert found == {1: text.index("reverse"), 3: text.index("cafe")}  # not home/DNS in words
    assert unlinked(index, text, 9, mask, {1}).keys() == {3}
    mask[3] = 0
    assert unlinked(index, text, 9, mask, set()).keys() == {1}


def test_shares_count_visible_concepts_only() -> None:
    def index_of(docs: dict[int, str]) -> SearchIndex:
        index = SearchIndex()
        for node, text in docs.items():
            index.put(node, "", text)
        return index

    docs = {0: "zfs scrub", 1: "zfs pool", 2: "zfs scrub smart", 3: "pool", 4: "other"}
    full = index_of(docs)
    mask = np.ones(8, np.uint8)
    mask[2] = 0
    ref = index_of({k: v for k, v in docs.items() if k != 2})
    args = (0, 4, 4.0, 8)
    got = shares(full.doc_terms(0), full.term_nodes, mask, *args)
    want = shares(ref.doc_terms(0), ref.term_nodes, np.ones(8, np.uint8), *args)
    assert got.tolist() == want.tolist() == [0, 1, 0, 0, 0, 0, 0, 0]  # scrub: 0's alone now


def test_question_whose_only_match_is_hidden(service: Service) -> None:
    """Answers as on a KB where that note was never written: no seed, no hit."""
    notes = [
        upsert("infra/zfs", title="ZFS pool", text="Scrubs run monthly.", links=["apps/zebra"]),
        upsert("infra/ups", title="UPS", text="Battery runs 20 minutes.", links=["infra/zfs"]),
    ]
    hidden = upsert("apps/zebra", title="Zebra printer", text="Labels for the zebras.")
    seq = service.write(KB, [*notes, hidden])
    ref_seq = service.write("reference", notes)
    for body in ({"query": "zebra printers"}, {"query": "zebras", "ids": ["infra/ups"]}):
        narrowed = service.tool(INFRA, KB, "graph_context", body, seq)
        reference = service.tool(ADMIN, "reference", "graph_context", body, ref_seq)
        assert narrowed.content == reference.content
    assert service.tool(INFRA, KB, "graph_context", {"query": "zebra printers"}, seq).json() == {
        "query": "zebra printers",
        "ranked": [],
        "seeds": [],
        "results": [],
        "count": 0,
        "note": "no seed matched the query",
        "mode": "hybrid",
    }
    hits = service.call(INFRA, "GET", f"/v1/kbs/{KB}/search", seq, params={"q": "zebra"})
    assert hits.json()["hits"] == []


def oracle_mentions(
    index: SearchIndex, text: str, mask: np.ndarray, node: int, linked: set[int]
) -> dict[int, int]:
    """The rule (docs/api.md, Mentions) as a plain scan: at each token the longest visible
    name of some words not all stop words starting there, then on after it."""
    tokens, starts = tokens_with_offsets(text)
    lengths = sorted(index.name_lengths, reverse=True)
    out: dict[int, int] = {}
    at = 0
    while at < len(tokens):
        for length in lengths:
            name = tuple(tokens[at : at + length])
            holders = [v for v in index.named(name) if mask[v]] if len(name) == length else []
            if holders and any(t not in STOP_WORDS for t in name):
                for v in holders:
                    if v != node and v not in linked:
                        out.setdefault(v, starts[at])
                at += length
                break
        else:
            at += 1
    return out


_word = st.sampled_from(["a", "b", "c", "Ab", "é"])
_name = st.lists(_word, min_size=1, max_size=4).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(
    docs=st.lists(st.tuples(_name, st.lists(_name, max_size=3)), min_size=1, max_size=8),
    removed=st.sets(st.integers(0, 7), max_size=3),
    text=st.lists(st.one_of(_word, st.sampled_from([" ", ", ", "-"])), max_size=60).map(" ".join),
    hidden=st.sets(st.integers(0, 7), max_size=4),
    linked=st.sets(st.integers(0, 7), max_size=3),
    node=st.integers(0, 8),
    first_use_early=st.booleans(),
)
def test_mentions_equal_a_plain_longest_match_scan(
    docs, removed, text, hidden, linked, node, first_use_early
) -> None:
    index = SearchIndex()
    mask = np.ones(9, np.uint8)
    if first_use_early:
        index.name_trie()  # built empty, then kept up to date by put and remove
    for i, (title, aliases) in enumerate(docs):
        index.put(i, title, "", aliases)
    for i in removed:
        index.remove(i)
    for i in hidden:
        mask[i] = 0
    visible_linked = {v for v in linked if mask[v]}
    got = unlinked(index, text, node, mask, visible_linked)
    assert got == oracle_mentions(index, text, mask, node, visible_linked)
    meta, arrays = index.arrays()  # a checkpoint's index builds its trie on first use
    vocabularies = {
        part: (meta[part], {k: i for i, k in enumerate(meta[part])})
        for part in ("terms", "names", "tags")
    }
    loaded = SearchIndex.from_arrays(meta, vocabularies, arrays)
    assert unlinked(loaded, text, node, mask, visible_linked) == got


def test_mentions_work_is_bounded_by_the_text_not_the_name_lengths() -> None:
    """The issue's name bomb: hidden aliases of 1 to 200 words over a long text. The trie's
    edges are looked up a few times per token (counted by the trie, not timed), where trying
    every name length at every token made 200 lookups per token."""
    index = SearchIndex()
    words = [f"w{i}" for i in range(400)]
    for k in range(4):
        aliases = [" ".join(words[k : k + n]) for n in range(k * 50 + 1, k * 50 + 51)]
        index.put(k, f"bomb {k}", "", aliases)
    text = " ".join(words[i % 400] for i in range(10_000))
    mask = np.zeros(4, np.uint8)  # every name hidden
    trie = index.name_trie()
    assert unlinked(index, text, 9, mask, set()) == {}
    # the longest name at the first token covers the other names' first tokens, every time
    assert unlinked(index, text, 9, np.ones(4, np.uint8), set()) == {0: 0}
    assert trie.lookups <= 2 * 6 * 10_000  # two calls of one walk: under 6 per token
