"""Narrowed equals hidden-never-written, byte for byte, for every tool, search and concept reads
(seed scores and snippets, result snippets, search scores, links and backlinks included).

For random KBs and random rule sets: the KB ``full-N`` gets every concept, ``ref-N`` only the
ones the rules let through (their links to hidden concepts still written, as links to concepts
that do not exist). A narrowed token on ``full-N`` must get exactly the bytes an admin gets on
``ref-N``, for found and not-found answers alike.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from kbgraph.access import Rule, canonical, visible
from kbgraph.api import context_of, create_app
from kbgraph.config import TokenGrant, load_config
from kbgraph.names import collection_of
from tests.kb_events import delete, upsert
from tests.support import ADMIN, Service, write_config

COLLECTIONS = ["infra", "apps", "ops", ""]
TYPES = ["Runbook", "Service", ""]
WORDS = ["dns", "backup", "router", "disk", "vlan", "owner"]
STATUSES = ["", "active", "deprecated", "superseded"]
TAGS = ["net", "storage", "Net"]
_counter = itertools.count()


@pytest.fixture(scope="module")
def shared_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder: Path = tmp_path_factory.mktemp("equivalence")
    app = create_app(load_config(write_config(folder)))
    with TestClient(app) as client:
        yield Service(client)


concept_names = st.tuples(st.sampled_from(COLLECTIONS), st.integers(0, 11)).map(
    lambda c: f"{c[0]}/n{c[1]}" if c[0] else f"n{c[1]}"
)


@st.composite
def knowledge_bases(draw: st.DrawFn) -> list[dict]:
    names = draw(st.lists(concept_names, min_size=2, max_size=14, unique=True))
    targets = st.one_of(st.sampled_from(names), concept_names)  # some never exist
    return [
        {
            "id": name,
            "type": draw(st.sampled_from(TYPES)),
            "status": draw(st.sampled_from(STATUSES)),
            "links": draw(st.lists(targets, max_size=5)),
            "text": " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=6))),
            "title": " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=2))),
            "tags": draw(st.lists(st.sampled_from(TAGS), max_size=2)),
            "aliases": draw(
                st.lists(st.sampled_from(["dns backup", "router disk vlan"]), max_size=1)
            ),
        }
        for name in names
    ]


rule_sets = st.lists(
    st.builds(
        Rule,
        st.frozensets(st.sampled_from(COLLECTIONS), max_size=2),
        st.frozensets(st.sampled_from(TYPES), max_size=2),
    ),
    min_size=1,
    max_size=2,
)


def requests_for(concepts: list[dict]) -> list[tuple[str, str, dict | None]]:
    ids = [c["id"] for c in concepts] + ["nowhere/x"]
    calls: list[tuple[str, str, dict | None]] = []
    for concept_id in ids:
        calls.append(("POST", "tools/graph_context", {"ids": [concept_id], "limit": 30}))
        calls.append(("POST", "tools/link_suggest", {"id": concept_id, "limit": 20}))
        body = {"id": concept_id, "limit": 20, "method": "structure"}
        calls.append(("POST", "tools/link_suggest", body))
        calls.append(("GET", f"concepts/{concept_id}", None))
    for source, target in itertools.islice(itertools.product(ids, ids), 0, None, 3):
        for direction, edges in itertools.product(("both", "out"), ("links", "all")):
            body = {"source": source, "target": target, "direction": direction, "edges": edges}
            calls.append(("POST", "tools/graph_path", body))
    for word in WORDS[:3]:
        calls.append(("POST", "tools/graph_context", {"query": word, "ids": ids[:1]}))
        calls.append(("POST", "tools/graph_context", {"query": f"{word} {WORDS[-1]}"}))
        calls.append(("GET", f"search?q={word}&limit=50", None))
        for mode in ("lexical", "vector", "hybrid"):  # vectors on: the default local model
            calls.append(("GET", f"search?q={word}%20{WORDS[-1]}&limit=50&mode={mode}", None))
    calls.append(("GET", "status", None))
    return calls


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(concepts=knowledge_bases(), rules=rule_sets)
def test_narrowed_equals_hidden_never_written(
    shared_service: Service, concepts: list[dict], rules: list[Rule]
) -> None:
    service = shared_service
    n = next(_counter)
    full_kb, ref_kb = f"full-{n}", f"ref-{n}"
    rule_set = canonical(rules)
    token = f"narrow-{n}"
    context_of(service.app).tokens[hashlib.sha256(token.encode()).hexdigest()] = TokenGrant(
        name=token, admin=False, rules={full_kb: rule_set}
    )

    def event(c: dict):
        return upsert(
            c["id"],
            type=c["type"],
            status=c["status"],
            links=c["links"],
            text=c["text"],
            title=c["title"],
            tags=c["tags"],
            aliases=c["aliases"],
        )

    shown = [c for c in concepts if visible(rule_set, collection_of(c["id"]), c["type"])]
    full_seq = service.write(full_kb, [event(c) for c in concepts])
    # The reference KB must exist even when nothing is visible: write a concept outside
    # every id the test queries, then delete it (a KB exists once it has applied an event).
    ref_seq = service.write(ref_kb, [event(c) for c in shown] + [upsert("zz/anchor")])
    ref_seq = service.write(ref_kb, [delete("zz/anchor", 2)])

    for method, path, body in requests_for(concepts):
        narrowed = service.call(token, method, f"/v1/kbs/{full_kb}/{path}", full_seq, json=body)
        reference = service.call(ADMIN, method, f"/v1/kbs/{ref_kb}/{path}", ref_seq, json=body)
        assert narrowed.status_code == reference.status_code, (path, body, reference.text)
        expected = reference.content
        if path == "status":
            expected = expected.replace(ref_kb.encode(), full_kb.encode())
        assert narrowed.content == expected, (path, body)


TIED = 4200  # identical visible notes: more than the vector search's shortlist holds


def test_ties_and_the_shortlist_cut_do_not_follow_hidden_concepts(shared_service: Service) -> None:
    """Thousands of visible notes with one text (their vectors, codes and scores all tie), and
    as many hidden ones, written first, each linking to a visible note not yet written, in
    reverse id order: they intern the visible notes in that reverse order. Vector, hybrid and
    graph_context answers to a narrowed token must still be the never-written KB's, byte for
    byte (ties and the shortlist's cut-off fall by id, never by interning row)."""
    service = shared_service
    n = next(_counter)
    full_kb, ref_kb, token = f"full-{n}", f"ref-{n}", f"narrow-{n}"
    rules = canonical([Rule(frozenset({"pub"}), frozenset())])
    context_of(service.app).tokens[hashlib.sha256(token.encode()).hexdigest()] = TokenGrant(
        name=token, admin=False, rules={full_kb: rules}
    )
    text = "dns router backup owner"
    notes = [upsert(f"pub/v{i:05d}", title="router notes", text=text) for i in range(TIED)]
    hidden = [upsert(f"sec/h{i:05d}", links=[f"pub/v{TIED - 1 - i:05d}"]) for i in range(TIED)]
    service.write(full_kb, hidden)
    full_seq = service.write(full_kb, notes)
    ref_seq = service.write(ref_kb, notes)
    for kb, seq in ((full_kb, full_seq), (ref_kb, ref_seq)):  # thousands of vectors to make
        deadline = time.monotonic() + 600
        while service.call(ADMIN, "GET", f"/v1/kbs/{kb}/status", seq).status_code != 200:
            assert time.monotonic() < deadline, f"{kb} not at seq {seq} in time"
    calls: list[tuple[str, str, dict | None]] = []
    for query in ("router", "dns backup"):
        for mode in ("vector", "hybrid"):
            for limit in (5, 50):
                calls.append(("GET", f"search?q={query}&limit={limit}&mode={mode}", None))
        calls.append(("POST", "tools/graph_context", {"query": query, "limit": 10}))
        calls.append(("POST", "tools/graph_context", {"query": query, "limit": 30}))
    for method, path, body in calls:
        narrowed = service.call(token, method, f"/v1/kbs/{full_kb}/{path}", full_seq, json=body)
        reference = service.call(ADMIN, method, f"/v1/kbs/{ref_kb}/{path}", ref_seq, json=body)
        assert reference.status_code == 200, (path, body, reference.text)
        assert narrowed.status_code == 200, (path, body, narrowed.text)
        assert narrowed.content == reference.content, (path, body)
