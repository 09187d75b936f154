"""Queries while deliveries stream in: never a 5xx, never half a delivery."""

from __future__ import annotations

import threading

from kbgraph.api import context_of
from tests.kb_events import upsert
from tests.support import ADMIN, Service

KB = "stream"
GROUP = 5  # every delivery: 5 new concepts linking each other (a 5-clique, 10 edges)
DELIVERIES = 120


def group(g: int) -> list:
    members = [f"g{g:03d}/m{i}" for i in range(GROUP)]
    return [
        upsert(member, links=[other for other in members if other != member], text=f"batch{g}")
        for member in members
    ]


def test_queries_see_whole_deliveries_while_they_stream_in(service: Service) -> None:
    seq = service.write(KB, group(0))
    failures: list[str] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for g in range(1, DELIVERIES):
                service.write(KB, group(g))
                context_of(service.app).service.projections.kick()
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    last_seq = seq
    while not done.is_set() or reads < 20:
        status = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", seq)
        if status.status_code != 200:
            failures.append(f"status {status.status_code}")
            break
        body = status.json()
        now = int(status.headers["X-KB-Seq"])
        if now < last_seq:
            failures.append(f"X-KB-Seq went back from {last_seq} to {now}")
        last_seq = now
        # Whole deliveries only: complete cliques, so concepts and links move in lockstep.
        if body["concepts"] % GROUP or body["links"] != body["concepts"] // GROUP * 10:
            failures.append(f"half a delivery: {body}")
        if now != body["concepts"]:  # one applied upsert per concept, nothing else
            failures.append(f"seq {now} but {body['concepts']} concepts")
        newest = body["concepts"] // GROUP - 1
        context = service.tool(ADMIN, KB, "graph_context", {"ids": [f"g{newest:03d}/m0"]}, now)
        if context.status_code != 200:
            failures.append(f"graph_context {context.status_code}")
        else:
            got = {r["id"] for r in context.json()["results"]}
            siblings = {f"g{newest:03d}/m{i}" for i in range(1, GROUP)}
            if got != siblings:
                failures.append(f"clique {newest} seen as {sorted(got)}")
        reads += 1
    thread.join()
    assert not failures, failures[:5]
    final = service.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", DELIVERIES * GROUP).json()
    assert final == {
        "kb": KB,
        "concepts": DELIVERIES * GROUP,
        "links": DELIVERIES * 10,
        "vectors": "complete",
        "vectors_missing": 0,
    }
