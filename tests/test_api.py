"""The agent API over HTTP: statuses and error texts of the contract, and the seed's behaviours."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kbgraph.agent.ranking import (
    NEIGHBOUR_DEGREE_POWER,
    NEIGHBOUR_WEIGHT,
    WALK_DEGREE_POWER,
    WALK_WEIGHT,
)
from kbgraph.agent.tools import PPR_ALPHA as ALPHA
from kbgraph.agent.tools import SEED_VECTOR_WEIGHT
from kbgraph.api import context_of, create_app
from kbgraph.config import load_config, parse_config
from tests import webhook_client as wc
from tests.kb_events import delete, upsert
from tests.support import (
    ADMIN,
    INFRA,
    OTHER,
    RUNBOOKS,
    SECRET,
    Service,
    bearer,
    write_config,
)

KB = "homelab"


def homelab(service: Service) -> int:
    return service.write(
        KB,
        [
            upsert("infra/dns", links=["infra/router", "network/vlan"], type="Service",
                   title="DNS resolver", text="The resolver answers DNS queries for the lab."),
            upsert("infra/router", links=["network/vlan"], type="Host", title="Edge router",
                   text="Routes traffic between the VLANs."),
            upsert("network/vlan", type="Note", title="VLAN plan", text="VLAN 10 is for DNS."),
            upsert("ops/restart-dns", links=["infra/dns"], type="Runbook",
                   title="Restart DNS", text="How to restart the DNS resolver safely."),
            upsert("journal/2026-01", links=["ops/restart-dns"], type="Note",
                   title="January", text="Restarted the resolver twice."),
        ],
    )  # fmt: skip


def error(response) -> str:
    return response.json()["error"]


def test_missing_or_unknown_token_is_401(service: Service) -> None:
    seq = homelab(service)
    for token in (None, "nope"):
        response = service.tool(token, KB, "graph_context", {"ids": ["infra/dns"]}, seq)  # type: ignore[arg-type]
        assert response.status_code == 401
        assert error(response) == "missing or unknown bearer token"
    bad_scheme = service.call(
        None, "GET", f"/v1/kbs/{KB}/status", headers={"Authorization": f"Basic {ADMIN}"}
    )
    assert bad_scheme.status_code == 401


def test_kb_without_rule_answers_as_missing_kb(service: Service) -> None:
    seq = homelab(service)
    no_rule = service.tool(OTHER, KB, "graph_context", {"ids": ["infra/dns"]}, seq)
    missing = service.tool(ADMIN, "nosuchkb", "graph_context", {"ids": ["infra/dns"]})
    assert no_rule.status_code == missing.status_code == 404
    assert no_rule.content == missing.content.replace(b"nosuchkb", KB.encode())
    assert service.call(OTHER, "GET", f"/v1/kbs/{KB}/status").status_code == 404


def test_hidden_and_missing_concepts_give_the_same_404(service: Service) -> None:
    seq = homelab(service)
    hidden = service.tool(INFRA, KB, "link_suggest", {"id": "network/vlan"}, seq)
    missing = service.tool(INFRA, KB, "link_suggest", {"id": "network/nothing"}, seq)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.content == b'{"error":"not found: network/vlan"}'
    assert missing.content == b'{"error":"not found: network/nothing"}'
    concept = service.call(INFRA, "GET", f"/v1/kbs/{KB}/concepts/network/vlan", seq)
    assert concept.status_code == 404
    assert error(concept) == "not found: network/vlan"
    first_bad = service.tool(
        INFRA, KB, "graph_context", {"ids": ["infra/dns", "ops/restart-dns", "x/y"]}, seq
    )
    assert first_bad.status_code == 404 and error(first_bad) == "not found: ops/restart-dns"


@pytest.mark.parametrize(
    ("tool", "body", "status", "message"),
    [
        ("graph_context", {}, 422, "'query' or 'ids' is required"),
        ("graph_context", {"ids": [f"a/{i}" for i in range(11)]}, 422,
         "'ids' takes at most 10 concepts"),
        ("graph_context", {"query": "dns", "limit": "5"}, 422, "limit: Expected int, got str"),
        ("graph_context", {"query": 3}, 422, "query: Expected str | null, got int"),
        ("graph_context", {"query": "dns", "bogus": 1}, 422,
         "request: Object contains unknown field bogus"),
        ("link_suggest", {}, 422, "request: Object missing required field id"),
        ("link_suggest", {"id": "infra/dns", "limit": 1.5}, 422, "limit: Expected int, got float"),
        ("graph_path", {"source": "infra/dns", "target": "network/vlan", "direction": "in"},
         422, 'invalid direction "in": expected out or both'),
        ("graph_path", {"source": "infra/dns", "target": "network/vlan", "max_hops": True},
         422, "max_hops: Expected int, got bool"),
    ],
)  # fmt: skip
def test_invalid_requests_are_422_naming_the_problem(
    service: Service, tool: str, body: dict, status: int, message: str
) -> None:
    seq = homelab(service)
    response = service.tool(ADMIN, KB, tool, body, seq)
    assert (response.status_code, error(response)) == (status, message)


def test_malformed_json_is_400(service: Service) -> None:
    seq = homelab(service)
    response = service.call(
        ADMIN, "POST", f"/v1/kbs/{KB}/tools/graph_context", seq, content=b'{"query": '
    )
    assert response.status_code == 400
    assert error(response).startswith("malformed JSON")


def test_min_seq_waits_then_503(service: Service) -> None:
    seq = homelab(service)
    ok = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", seq)
    assert ok.status_code == 200 and ok.headers["X-KB-Seq"] == str(seq)
    late = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", seq + 1)
    assert late.status_code == 503
    assert late.headers["Retry-After"] == "1"
    assert "not yet at seq" in error(late)
    junk = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", headers={"X-Min-Seq": "soon"})
    assert junk.status_code == 422


def test_every_tool_response_carries_x_kb_seq(service: Service) -> None:
    seq = homelab(service)
    for tool, body in [
        ("graph_context", {"query": "dns"}),
        ("link_suggest", {"id": "infra/dns"}),
        ("graph_path", {"source": "infra/dns", "target": "journal/2026-01"}),
    ]:
        response = service.tool(ADMIN, KB, tool, body, seq)
        assert response.status_code == 200, response.text
        assert response.headers["X-KB-Seq"] == str(seq)


def test_graph_context_shape_and_determinism(service: Service) -> None:
    seq = homelab(service)
    body = {"query": "restart DNS", "ids": ["network/vlan"]}
    first = service.tool(ADMIN, KB, "graph_context", body, seq)
    second = service.tool(ADMIN, KB, "graph_context", body, seq)
    assert first.content == second.content
    answer = first.json()
    assert list(answer) == ["query", "ids", "ranked", "seeds", "results", "count", "mode"]
    assert answer["query"] == "restart DNS" and answer["ids"] == ["network/vlan"]
    assert abs(sum(seed["weight"] for seed in answer["seeds"]) - 1.0) < 1e-3
    weights = [(-s["weight"], s["id"]) for s in answer["seeds"]]
    assert weights == sorted(weights)
    seed_ids = {seed["id"] for seed in answer["seeds"]}
    assert answer["count"] == len(answer["results"]) > 0
    for result in answer["results"]:
        assert result["id"] not in seed_ids  # seeds never come back as results
        assert set(result) == {"id", "title", "score", "hops", "via", "snippet"}
        assert len(result["snippet"]) <= 160
        assert result["hops"] >= 1 and result["score"] > 0
    order = [(-r["score"], r["hops"], r["id"]) for r in answer["results"]]
    assert order == sorted(order)
    for seed in answer["seeds"]:
        assert set(seed) == {"id", "title", "weight", "score", "snippet"}
        assert 0 < seed["score"] <= 1 and len(seed["snippet"]) <= 160
    by_id = {s["id"]: s for s in answer["seeds"]}
    assert by_id["network/vlan"]["snippet"] == "VLAN 10 is for DNS."
    # Around the query's terms: the restart runbook's snippet opens at its text's "restart".
    assert by_id["ops/restart-dns"]["snippet"] == "How to restart the DNS resolver safely."
    only_ids = service.tool(ADMIN, KB, "graph_context", {"ids": ["infra/dns"]}, seq).json()
    assert "query" not in only_ids
    texts = {
        "infra/dns": "The resolver answers DNS queries for the lab.",
        "infra/router": "Routes traffic between the VLANs.",
        "network/vlan": "VLAN 10 is for DNS.",
        "ops/restart-dns": "How to restart the DNS resolver safely.",
        "journal/2026-01": "Restarted the resolver twice.",
    }
    for row in only_ids["seeds"] + only_ids["results"]:  # no query: the text's start
        assert row["snippet"] == texts[row["id"]]


def search_evidence(service: Service, seq: int, query: str, mode: str) -> dict[str, float]:
    """The seeds' fused search scores, recomputed from search's own lists (limit 50)."""

    def listed(how: str) -> list[tuple[str, float]]:
        path = f"/v1/kbs/{KB}/search?q={query}&limit=50&mode={how}"
        return [(h["id"], h["score"]) for h in service.call(ADMIN, "GET", path, seq).json()["hits"]]

    words = listed("lexical")
    scores = {cid: x / words[0][1] for cid, x in words}
    if mode == "hybrid":
        near = listed("vector")
        high, low = near[0][1], near[-1][1]
        for cid, x in near:
            scores[cid] = scores.get(cid, 0.0) + SEED_VECTOR_WEIGHT * (x - low) / (high - low or 1)
    return {cid: x for cid, x in scores.items() if x > 0}


@pytest.fixture
def links_only(tmp_path: Path) -> Iterator[Service]:
    """A service whose KBs keep no mentions: ``ranked`` walks the links alone."""
    app = create_app(load_config(write_config(tmp_path, "[mentions]\nenabled = false\n")))
    with TestClient(app) as client:
        yield Service(client)


def test_ranked_blends_seeds_and_results_once_each(links_only: Service) -> None:
    """``ranked`` (mentions off) against the documented rule recomputed from other routes:
    search's lists, the concepts' links (degrees, neighbours) and the answer's PPR figures
    (rounded, hence the tolerance)."""
    service = links_only
    seq = homelab(service)
    neighbours: dict[str, set[str]] = {}
    for cid in ("infra/dns", "infra/router", "network/vlan", "ops/restart-dns", "journal/2026-01"):
        got = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/{cid}", seq).json()
        neighbours[cid] = set(got["links"]) | set(got["backlinks"])
    for body in (
        {"query": "restart DNS", "ids": ["network/vlan"]},
        {"query": "restart DNS", "limit": 3},
        {"ids": ["infra/dns"], "limit": 30},
    ):
        answer = service.tool(ADMIN, KB, "graph_context", body, seq).json()
        ranked, seeds, results = answer["ranked"], answer["seeds"], answer["results"]
        limit = body.get("limit", 10)
        ids = [row["id"] for row in ranked]
        assert len(ids) == len(set(ids)) == min(limit, len(seeds) + len(results)) > 0
        assert [(-row["score"], row["hops"], row["id"]) for row in ranked] == sorted(
            (-row["score"], row["hops"], row["id"]) for row in ranked
        )
        seed_by_id = {s["id"]: s for s in seeds}
        result_by_id = {r["id"]: r for r in results}
        found = {}
        if "query" in body:
            found = search_evidence(service, seq, body["query"], answer["mode"])
        best = max(found.values(), default=1.0)
        search = found | {cid: best for cid in body.get("ids", [])}
        every = list(seed_by_id) + list(result_by_id)
        deg = {cid: len(neighbours[cid]) for cid in every}
        walk = {
            cid: max((seed_by_id.get(cid) or result_by_id[cid])["score"]
                     - ALPHA * seed_by_id.get(cid, {"weight": 0.0})["weight"], 0.0)
            / max(deg[cid], 1) ** WALK_DEGREE_POWER
            for cid in every
        }  # fmt: skip
        near = {
            cid: sum(
                search[u] / best * (len(neighbours[u]) * deg[cid]) ** -NEIGHBOUR_DEGREE_POWER
                for u in neighbours[cid]
                if u in search
            )
            for cid in every
        }
        top_walk, top_near = max(walk.values()) or 1.0, max(near.values()) or 1.0
        for row in ranked:
            want = (
                search.get(row["id"], 0.0) / best
                + WALK_WEIGHT * walk[row["id"]] / top_walk
                + NEIGHBOUR_WEIGHT * near[row["id"]] / top_near
            )
            if search.get(row["id"], 0.0) == best:  # search's best hit keeps the head
                want = 1.0 + WALK_WEIGHT + NEIGHBOUR_WEIGHT
            assert row["score"] == pytest.approx(want, abs=2e-3), (body, row)
            if row["id"] in seed_by_id:
                assert row["hops"] == 0 and "via" not in row
                assert list(row) == ["id", "title", "score", "hops", "snippet"]
                assert row["snippet"] == seed_by_id[row["id"]]["snippet"]
            else:
                result = result_by_id[row["id"]]
                assert list(row) == ["id", "title", "score", "hops", "via", "by", "snippet"]
                assert row["by"] == "link"
                assert (row["hops"], row["via"], row["snippet"]) == (
                    result["hops"],
                    result["via"],
                    result["snippet"],
                )
    nothing = service.tool(ADMIN, KB, "graph_context", {"query": "zzzunknown"}, seq).json()
    assert nothing["ranked"] == [] and nothing["count"] == 0


def test_snippets_without_a_query_start_the_text(service: Service) -> None:
    long_text = "alpha " * 20 + "omega " * 40
    seq = service.write(KB, [upsert("t/a", links=["t/b"], text=long_text), upsert("t/b")])
    answer = service.tool(ADMIN, KB, "graph_context", {"ids": ["t/b"]}, seq).json()
    (result,) = answer["results"]
    assert result["snippet"] == " ".join(long_text.split())[:159] + "…"
    assert answer["seeds"][0]["snippet"] == ""
    with_query = service.tool(ADMIN, KB, "graph_context", {"query": "omega", "ids": ["t/b"]}, seq)
    seed = next(s for s in with_query.json()["seeds"] if s["id"] == "t/a")
    assert seed["snippet"].startswith("…") and "omega" in seed["snippet"]


def test_a_seed_scores_its_own_ppr_estimate(service: Service) -> None:
    seq = service.write(KB, [upsert("i/alone"), upsert("p/a", links=["p/b"]), upsert("p/b")])
    alone = service.tool(ADMIN, KB, "graph_context", {"ids": ["i/alone"]}, seq).json()
    assert alone["seeds"] == [
        {"id": "i/alone", "title": "i/alone", "weight": 1.0, "score": 1.0, "snippet": ""}
    ]
    # Two nodes, one edge, restart a = 0.25: ppr(a) = a + (1 - a) ppr(b), ppr(b) = (1 - a) ppr(a),
    # so ppr(a) = 4/7; the push stops at most eps * deg = 1e-4 below it (then 4-decimal rounding).
    pair = service.tool(ADMIN, KB, "graph_context", {"ids": ["p/a"]}, seq).json()
    assert 4 / 7 - 1e-4 - 5e-5 <= pair["seeds"][0]["score"] <= 4 / 7 + 5e-5
    assert abs(pair["seeds"][0]["score"] + pair["results"][0]["score"] - 1.0) <= 2e-4


def test_graph_context_without_seed_has_note(service: Service) -> None:
    seq = homelab(service)
    answer = service.tool(ADMIN, KB, "graph_context", {"query": "zebra"}, seq).json()
    assert answer == {
        "query": "zebra",
        "ranked": [],
        "seeds": [],
        "results": [],
        "count": 0,
        "note": "no seed matched the query",
        "mode": "hybrid",
    }


def test_two_hop_chain_outranks_hub_leaves(service: Service) -> None:
    events = [upsert("s/seed", links=["s/hub", "s/a"]), upsert("s/a", links=["s/b"])]
    events += [upsert("s/hub", links=[f"s/leaf{i:02d}" for i in range(20)])]
    events += [upsert(f"s/leaf{i:02d}") for i in range(20)]
    events += [upsert("s/b")]
    seq = service.write(KB, events)
    answer = service.tool(ADMIN, KB, "graph_context", {"ids": ["s/seed"], "limit": 30}, seq)
    results = {r["id"]: r for r in answer.json()["results"]}
    assert results["s/b"]["hops"] == 2 and results["s/b"]["via"] == "s/a"
    assert results["s/leaf00"]["hops"] == 2 and results["s/leaf00"]["via"] == "s/hub"
    assert all(results["s/b"]["score"] > results[f"s/leaf{i:02d}"]["score"] for i in range(20))


def test_limits_default_and_clamp(service: Service) -> None:
    events = [upsert("h/hub", links=[f"h/n{i:02d}" for i in range(40)])]
    events += [upsert(f"h/n{i:02d}") for i in range(40)]
    seq = service.write(KB, events)

    def count(limit: object) -> int:
        body = {"ids": ["h/hub"]} if limit is None else {"ids": ["h/hub"], "limit": limit}
        return service.tool(ADMIN, KB, "graph_context", body, seq).json()["count"]

    assert (count(None), count(0), count(100), count(-3), count(7)) == (10, 10, 30, 1, 7)
    hits = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/search", seq, params={"q": "h"})
    assert hits.status_code == 200


def test_link_suggest_skips_retired_candidates(service: Service) -> None:
    # x and every c_i share the neighbours z1 and z2; c_i are candidates for x.
    events = [upsert("l/x", links=["l/z1", "l/z2"])]
    events += [upsert(f"l/z{k}", links=[f"l/c{i}" for i in range(8)]) for k in (1, 2)]
    statuses = ["deprecated", "", "superseded", "active", "", "draft", "disputed", ""]
    events += [upsert(f"l/c{i}", status=statuses[i]) for i in range(8)]
    seq = service.write(KB, events)
    answer = service.tool(ADMIN, KB, "link_suggest", {"id": "l/x"}, seq).json()
    assert answer["id"] == "l/x"
    assert [c["id"] for c in answer["candidates"]] == ["l/c1", "l/c3", "l/c4", "l/c5", "l/c6"]
    assert answer["count"] == 5
    first = answer["candidates"][0]
    assert first["common"] == ["l/z1", "l/z2"]
    assert first["score"] > round(1 / 9 + 1 / 9, 4)  # hybrid: the walk's share on top
    body = {"id": "l/x", "method": "structure"}
    structure = service.tool(ADMIN, KB, "link_suggest", body, seq).json()["candidates"]
    assert [c["id"] for c in structure] == ["l/c1", "l/c3", "l/c4", "l/c5", "l/c6"]
    assert structure[0]["score"] == round(1 / 9 + 1 / 9, 4)  # each z has x and 8 c's
    wide = service.tool(ADMIN, KB, "link_suggest", {"id": "l/x", "limit": 50}, seq).json()
    assert wide["count"] == 6


def test_graph_path_cases(service: Service) -> None:
    seq = homelab(service)
    same = service.tool(
        ADMIN, KB, "graph_path", {"source": "infra/dns", "target": "infra/dns"}, seq
    )
    assert same.json() == {
        "source": "infra/dns",
        "target": "infra/dns",
        "hops": 0,
        "path": [{"id": "infra/dns", "title": "DNS resolver"}],
    }
    chain = service.tool(
        ADMIN, KB, "graph_path", {"source": "journal/2026-01", "target": "network/vlan"}, seq
    ).json()
    assert [step["id"] for step in chain["path"]] == [
        "journal/2026-01", "ops/restart-dns", "infra/dns", "network/vlan"]  # fmt: skip
    assert chain["hops"] == 3
    bounded = service.tool(
        ADMIN, KB, "graph_path",
        {"source": "journal/2026-01", "target": "network/vlan", "max_hops": 2}, seq,
    ).json()  # fmt: skip
    assert bounded == {
        "source": "journal/2026-01",
        "target": "network/vlan",
        "hops": 0,
        "path": [],
        "note": "no path within 2 hops",
    }
    backwards = service.tool(
        ADMIN, KB, "graph_path",
        {"source": "network/vlan", "target": "infra/dns", "direction": "out"}, seq,
    ).json()  # fmt: skip
    assert backwards["path"] == [] and backwards["note"] == "no path within 6 hops"


def test_narrowed_tokens_see_only_their_subgraph(service: Service) -> None:
    seq = homelab(service)
    status = service.call(INFRA, "GET", f"/v1/kbs/{KB}/status", seq).json()
    assert status == {
        "kb": KB,
        "concepts": 2,
        "links": 1,
        "vectors": "complete",
        "vectors_missing": 0,
    }
    runbook = service.call(RUNBOOKS, "GET", f"/v1/kbs/{KB}/concepts/ops/restart-dns", seq)
    assert runbook.json()["links"] == []  # infra/dns is hidden from this token
    admin = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/ops/restart-dns", seq)
    assert admin.json()["links"] == ["infra/dns"]
    words = {"q": "dns", "mode": "lexical"}
    hits = service.call(INFRA, "GET", f"/v1/kbs/{KB}/search", seq, params=words).json()
    assert [hit["id"] for hit in hits["hits"]] == ["infra/dns"]
    for mode in ("vector", "hybrid"):  # by meaning too: only the two visible concepts
        params = {"q": "dns", "mode": mode}
        hits = service.call(INFRA, "GET", f"/v1/kbs/{KB}/search", seq, params=params).json()
        assert {hit["id"] for hit in hits["hits"]} == {"infra/dns", "infra/router"}


def test_search_endpoint(service: Service) -> None:
    seq = homelab(service)
    answer = service.call(
        ADMIN, "GET", f"/v1/kbs/{KB}/search", seq, params={"q": 'dns" AND (', "mode": "lexical"}
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["count"] == len(body["hits"]) >= 3
    assert [list(hit) for hit in body["hits"]] == [["id", "title", "score", "snippet"]] * len(
        body["hits"]
    )
    scores = [hit["score"] for hit in body["hits"]]
    assert scores == sorted(scores, reverse=True) and all(round(s, 4) == s for s in scores)
    index = context_of(service.app).service.projections.get(KB)
    with index.read() as snap:  # the same BM25 the seeds use, rounded to 4 decimals
        _, raw = snap.index.search("dns and", snap.view(None).mask)
        expected = sorted((round(float(x), 4) for x in raw), reverse=True)
    assert scores == expected[: len(scores)]
    rare = service.call(
        ADMIN, "GET", f"/v1/kbs/{KB}/search", seq, params={"q": "vlan", "mode": "lexical"}
    ).json()
    # the title's "VLAN" first, then "VLANs" in a text (one stem)
    assert [hit["id"] for hit in rare["hits"]] == ["network/vlan", "infra/router"]
    missing_q = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/search", seq)
    assert missing_q.status_code == 422 and error(missing_q) == "'q' is required"
    bad_limit = service.call(
        ADMIN, "GET", f"/v1/kbs/{KB}/search", seq, params={"q": "a", "limit": "x"}
    )
    assert bad_limit.status_code == 422


def test_concept_read_and_delete(service: Service) -> None:
    seq = homelab(service)
    concept = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/infra/dns", seq).json()
    assert concept["title"] == "DNS resolver" and concept["type"] == "Service"
    assert concept["links"] == ["infra/router", "network/vlan"]
    seq = service.write(KB, [delete("infra/router", 2)])
    concept = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/infra/dns", seq).json()
    assert concept["links"] == ["network/vlan"]
    seq = service.write(KB, [upsert("infra/router", 3)])
    concept = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/infra/dns", seq).json()
    assert concept["links"] == ["infra/router", "network/vlan"]  # declared links survive


def test_backlinks_are_visible_linkers_ascending(service: Service) -> None:
    seq = homelab(service)

    def read(token: str, concept_id: str) -> dict:
        return service.call(token, "GET", f"/v1/kbs/{KB}/concepts/{concept_id}", seq).json()

    assert read(ADMIN, "network/vlan")["backlinks"] == ["infra/dns", "infra/router"]
    assert read(ADMIN, "infra/dns")["backlinks"] == ["ops/restart-dns"]
    assert read(ADMIN, "journal/2026-01")["backlinks"] == []
    assert read(INFRA, "infra/router")["backlinks"] == ["infra/dns"]
    assert read(INFRA, "infra/dns")["backlinks"] == []  # ops/restart-dns is hidden from it
    assert read(RUNBOOKS, "ops/restart-dns")["backlinks"] == []  # journal is a Note
    # A reciprocal link is a link and a backlink; a deleted linker is no backlink any more.
    seq = service.write(KB, [upsert("network/vlan", 2, links=["infra/dns"])])
    assert read(ADMIN, "infra/dns")["links"] == ["infra/router", "network/vlan"]
    assert read(ADMIN, "infra/dns")["backlinks"] == ["network/vlan", "ops/restart-dns"]
    seq = service.write(KB, [delete("ops/restart-dns", 2)])
    assert read(ADMIN, "infra/dns")["backlinks"] == ["network/vlan"]


def test_service_endpoints(service: Service) -> None:
    assert service.client.get("/healthz").status_code == 200
    assert service.client.get("/readyz").json() == {"status": "ready"}
    homelab(service)
    service.tool(ADMIN, KB, "graph_context", {"query": "dns"}, 1)
    metrics = service.call(ADMIN, "GET", "/metrics")
    assert metrics.status_code == 200
    assert 'kbgraph_request_seconds_count{route="graph_context",status="200"}' in metrics.text
    spec = service.client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.1")
    schemas = spec["components"]["schemas"]
    assert set(schemas["GraphContextRequest"]["properties"]) == {"query", "ids", "limit"}
    assert "/v1/kbs/{kb}/tools/graph_path" in spec["paths"]
    assert "401" in spec["paths"]["/v1/kbs/{kb}/mcp"]["post"]["responses"]
    assert "backlinks" in schemas["ConceptResponse"]["properties"]
    assert "score" in schemas["SearchHit"]["properties"]
    listing = {tool["name"]: tool for tool in service.client.get("/v1/tools").json()}
    assert listing["graph_path"]["advanced"] is True
    assert listing["graph_context"]["advanced"] is False
    assert json.dumps(listing["link_suggest"]["input_schema"]).count('"id"') >= 1


def test_metrics_need_an_admin_or_metrics_token(service: Service) -> None:
    """/metrics counts deliveries and requests over every KB: not for just any caller."""
    assert service.client.get("/metrics").status_code == 401
    narrowed = service.call(INFRA, "GET", "/metrics")
    assert narrowed.status_code == 403
    assert narrowed.json() == {"error": "this token may not read /metrics: needs admin or metrics"}
    assert service.call(ADMIN, "GET", "/metrics").status_code == 200
    scraper = parse_config(
        '[[tokens]]\nname = "scraper"\ntoken = "scraper-token-of-tests"\nmetrics = true\n'
    )
    (grant,) = scraper.token_index().values()
    assert (grant.metrics, grant.admin, grant.rules) == (True, False, {})  # sees no KB


def test_every_error_is_json(service: Service) -> None:
    seq = homelab(service)
    odd_id = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/infra/a%0Ab", seq)
    assert (odd_id.status_code, odd_id.json()) == (404, {"error": "not found: infra/a\nb"})
    nowhere = service.call(ADMIN, "GET", "/v2/nothing")
    assert (nowhere.status_code, nowhere.json()) == (404, {"error": "not found: /v2/nothing"})
    wrong_method = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/tools/graph_path")
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"error": f"Method Not Allowed: /v1/kbs/{KB}/tools/graph_path"}
    assert wrong_method.headers["allow"] == "POST"


def test_an_unexpected_failure_is_a_json_500_that_reveals_nothing(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    seq = homelab(service)

    def broken(*args: object) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr("kbgraph.agent.tools.status", broken)
    quiet = TestClient(service.app, raise_server_exceptions=False)  # same running app
    headers = {**bearer(ADMIN), "X-Min-Seq": str(seq)}
    response = quiet.get(f"/v1/kbs/{KB}/status", headers=headers)
    assert (response.status_code, response.json()) == (500, {"error": "internal error"})


def test_a_bug_on_the_webhook_path_is_the_same_json_500(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery skips the exception middleware and the router (``kbgraph.api.App``); a bug
    there still answers as every route does, and a wrong method or path as the router does."""

    def broken(*args: object) -> None:
        raise RuntimeError("secret internals")

    quiet = TestClient(service.app, raise_server_exceptions=False)  # same running app
    body, headers = wc.delivery(SECRET, [wc.upsert("x")])
    assert quiet.post(f"/v1/kbs/{KB}/events", content=body, headers=headers).status_code == 200
    monkeypatch.setattr("kbgraph.http.ingest.is_kb_name", broken)
    response = quiet.post(f"/v1/kbs/{KB}/events", content=body, headers=headers)
    assert (response.status_code, response.json()) == (500, {"error": "internal error"})
    wrong_method = quiet.get(f"/v1/kbs/{KB}/events", headers=bearer(ADMIN))
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"error": f"Method Not Allowed: /v1/kbs/{KB}/events"}
    slash = quiet.post(f"/v1/kbs/{KB}/events/", content=body, headers=headers)
    assert (slash.status_code, slash.json()) == (404, {"error": f"not found: /v1/kbs/{KB}/events/"})


def test_readyz_fails_when_the_follower_stopped(service: Service) -> None:
    assert service.client.get("/readyz").status_code == 200
    context_of(service.app).service.projections.error = RuntimeError("apply failed")
    response = service.client.get("/readyz")
    assert response.status_code == 503
    assert "projection stopped following the log" in response.json()["error"]
