"""Issue 28, Medium 6: no request can grow a process-wide cache, and snippets are a function
of the state and the request alone: after a flood of distinct words, a concept written later
gets its snippet around the match, and a restart from a checkpoint answers the same bytes."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from kbgraph.search import analysis
from tests import webhook_client as wc
from tests.kb_events import upsert
from tests.support import ADMIN, INFRA, SECRET, Service, bearer, start_server, stop, write_config

KB = "homelab"
LEAD = "Filler words come first here. " * 20  # the match sits 600 characters in


def test_a_word_flood_grows_no_cache_and_later_snippets_find_the_match(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    seq = service.write(KB, [upsert("infra/a", title="A", text="alpha beta")])
    assert service.tool(INFRA, KB, "graph_context", {"query": "alpha"}, seq).status_code == 200
    before = analysis.stems_cached()  # the KB indexed
    for batch in range(4):
        words = " ".join(f"w{batch}x{i}q" for i in range(5000))
        flood = service.tool(INFRA, KB, "graph_context", {"query": words}, seq)
        assert flood.status_code == 200
        assert service.call(INFRA, "GET", f"/v1/kbs/{KB}/search", params={"q": words}).is_success
    assert analysis.stems_cached() == before  # queries stem and forget
    # the stem cache full (as a flood of writes could leave it): answers are the same
    monkeypatch.setattr(analysis, "STEM_CACHE_MAX", analysis.stems_cached())
    seq = service.write(KB, [upsert("infra/z", title="Z", text=LEAD + "the zeugmatron sits here")])
    hits = service.call(
        ADMIN, "GET", f"/v1/kbs/{KB}/search", seq, params={"q": "zeugmatrons", "mode": "lexical"}
    )
    (hit,) = hits.json()["hits"]  # lexical: the one concept holding the word
    assert hit["snippet"].startswith("…") and "zeugmatron sits here" in hit["snippet"]


def answers(base: str, seq: int) -> list[bytes]:
    headers = {**bearer(ADMIN), "X-Min-Seq": str(seq)}
    out = []
    for query in ("zeugmatron", "filler zeugmatrons", "words"):
        search = httpx.get(f"{base}/v1/kbs/{KB}/search", params={"q": query}, headers=headers)
        context = httpx.post(f"{base}/v1/kbs/{KB}/tools/graph_context", headers=headers,
                             json={"query": query})  # fmt: skip
        assert search.status_code == context.status_code == 200
        out += [search.content, context.content]
    return out


@pytest.mark.slow
def test_same_state_same_bytes_across_a_restart_from_a_checkpoint(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace(
            'path = "kbgraph.db"\n', 'path = "kbgraph.db"\ncheckpoint_every_events = 1\n', 1
        )
    )
    checkpoints = tmp_path / "kbgraph.db.checkpoints"
    proc = start_server(config)
    try:
        body = wc.encode([wc.upsert(f"n/{i}", title=f"N{i}", text=LEAD + f"zeugmatron {i}")
                          for i in range(3)])  # fmt: skip
        headers = wc.signed_headers(SECRET, body, "application/cloudevents-batch+json")
        sent = httpx.post(f"{proc.url}/v1/kbs/{KB}/events", content=body, headers=headers)
        seq = sent.json()["seq"]
        first = answers(proc.url, seq)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(checkpoints.glob("*")):
            time.sleep(0.1)
        assert any(checkpoints.glob("*")), "no checkpoint written"
    finally:
        stop(proc)
    proc = start_server(config)  # a fresh process: its projection loads the checkpoint
    try:
        again = answers(proc.url, seq)
    finally:
        stop(proc)
    assert again == first
    assert "…".encode() in first[0]  # cut around the match, not the text's start
    assert b"zeugmatron 0" in first[0]
