"""Vectors as derived data off the paths of events and questions (issue 35, items 1 and 2) and
the provider's surface (issue 34, cases 2, 5 and 9).

Calls to the provider are counted, never timed: applying embeds nothing; each text is embedded
once per store whichever process asks, and never again after a restart with or without a
checkpoint; a changed model embeds again in the background; a text the provider refuses is
recorded alone; a question whose vector does not come is answered by its words and says so.
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from kbgraph.access import Rule, canonical
from kbgraph.agent import retrieval, tools
from kbgraph.api import context_of, create_app
from kbgraph.config import ConfigError, load_config, parse_config
from kbgraph.embeddings import EmbeddingRefused, concept_text, embed_each
from kbgraph.embeddings.openai import OpenAIEmbedder
from kbgraph.projection import Projections, checkpoint
from kbgraph.store import Store
from tests.embedders import FakeServer, HashEmbedder, config, vectors_of
from tests.kb_events import delete, upsert
from tests.support import ADMIN, INFRA, OTHER, Service, write_config

KB = "homelab"
LIMIT = 60  # characters the refusing model takes
INFRA_ONLY = canonical([Rule(frozenset({"infra"}), frozenset())])


class Counting(HashEmbedder):
    """Counts texts; refuses (as a context-length error) any batch holding a text over LIMIT.
    A provider outside the process (``remote``): its calls stay off the follower's path."""

    remote = True

    def __init__(self, name: str = "hash-64") -> None:
        self.name = name
        self.texts = 0
        self.calls = 0
        self.lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        with self.lock:
            self.calls += 1
            if max(map(len, texts)) > LIMIT:
                raise EmbeddingRefused("HTTP 400: context length")
            self.texts += len(texts)
        return super().embed(texts)


def concepts(n: int, prefix: str = "infra") -> list:
    return [upsert(f"{prefix}/n{i}", title=f"note {i}", text=f"disks {i}") for i in range(n)]


def follow(p: Projections) -> None:
    while p.follow_once():
        pass


# --- item 1: nothing remote on the apply path ------------------------------------------------


def test_events_are_applied_and_readable_while_the_provider_hangs(tmp_path: Path) -> None:
    """A provider that never answers: deliveries are applied and answered at once (status
    filling), a question falls back to its words and says so, vector mode answers 503 without
    the provider's address; once it answers, the vectors fill in."""
    server = FakeServer()
    server.gate.clear()
    server.start()
    extra = (
        f'[embeddings]\nprovider = "openai"\nurl = "{server.url}"\nretries = 0\n'
        "timeout_seconds = 30\nquery_timeout_seconds = 0.2\n"
    )
    try:
        with TestClient(create_app(load_config(write_config(tmp_path, extra)))) as client:
            s = Service(client)
            seq = 0
            for i in range(3):
                seq = s.write(KB, [upsert(f"infra/dns{i}", title=f"DNS {i}")], vectors=False)
                got = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/concepts/infra/dns{i}", seq)
                assert got.status_code == 200 and got.headers["X-KB-Seq"] == str(seq)
            status = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", seq).json()
            assert status["vectors"] == "filling" and status["vectors_missing"] == 3
            words = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/search?q=dns", seq).json()
            assert words["mode"] == "lexical" and words["count"] == 3
            context = s.tool(ADMIN, KB, "graph_context", {"query": "dns"}, seq).json()
            assert context["mode"] == "lexical" and context["seeds"]
            vector = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/search?q=dns&mode=vector", seq)
            assert vector.status_code == 503
            assert vector.json() == {"error": retrieval.UNAVAILABLE}  # no URL (case 9)
            server.gate.set()
            s.vectors_settled(KB, seq)
            app_context = context_of(client.app)  # from now on a question waits for its vector
            config = app_context.config
            embeddings = msgspec.structs.replace(config.embeddings, query_timeout_seconds=120)
            # the context is frozen for the service; the test alone changes it while it runs
            object.__setattr__(
                app_context, "config", msgspec.structs.replace(config, embeddings=embeddings)
            )
            hybrid = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/search?q=dns", seq).json()
            assert hybrid["mode"] == "hybrid"
            context = s.tool(ADMIN, KB, "graph_context", {"query": "dns"}, seq).json()
            assert context["mode"] == "hybrid"
            assert "mode" not in s.tool(ADMIN, KB, "graph_context", {"ids": ["infra/dns0"]}).json()
    finally:
        server.gate.set()
        server.stop()


def wait_complete(s: Service, seq: int, kb: str = KB) -> dict:
    """/status until the vectors are complete (the filler is kicked on every applied batch)."""
    deadline = time.monotonic() + 60
    while True:
        status = s.call(ADMIN, "GET", f"/v1/kbs/{kb}/status", seq).json()
        if status["vectors"] == "complete" or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_applying_calls_no_provider(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb.db")
    embedder = Counting()
    p = Projections(store, embedder=embedder)
    p.load()
    store.append(KB, concepts(30))
    store.append(KB, [upsert("infra/n1", 2, title="note 1", text="now the router")])
    follow(p)
    assert embedder.calls == 0 and p.get(KB).vectors.status() == "filling"
    assert p.fill_vectors() == 30 and embedder.texts == 30
    store.close()


# --- item 2: durable, computed once ----------------------------------------------------------


def test_every_process_of_a_store_reads_the_same_rows_and_a_restart_embeds_nothing(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "kb.db")
    store.append(KB, concepts(40))
    first, second = Counting(), Counting()
    a = Projections(store, checkpoints=tmp_path / "ckpt", embedder=first)
    b = Projections(Store(tmp_path / "kb.db"), embedder=second)  # another worker
    for p in (a, b):
        p.load()
        p.fill_vectors()
    assert first.texts == 40 and second.texts == 0
    assert vectors_of(a) == vectors_of(b) and len(vectors_of(a)) == 40
    assert a.write_checkpoint() is not None
    for folder in (tmp_path / "ckpt", None):  # with and without the checkpoint
        again = Counting()
        restarted = Projections(store, checkpoints=folder, embedder=again)
        restarted.load()
        assert (restarted.loaded_from is not None) == (folder is not None)
        restarted.fill_vectors()
        assert again.calls == 0 and vectors_of(restarted) == vectors_of(a)
    store.append(
        KB, [upsert("infra/n3", 2, title="note 3", text="the router now"), delete("infra/n4", 2)]
    )
    for p in (a, b):
        follow(p)
        p.fill_vectors()
    assert first.texts + second.texts == 41  # the changed one, once for both
    assert vectors_of(a) == vectors_of(b) and len(vectors_of(a)) == 39
    b.store.close()
    store.close()


def test_two_processes_filling_at_once_embed_each_text_once(tmp_path: Path) -> None:
    """The embedder lock, then a second look-up: however the two interleave, each text is
    embedded once (the other finds the rows)."""
    store = Store(tmp_path / "kb.db")
    store.append(KB, concepts(1500))
    embedder = Counting()
    workers = [Projections(Store(tmp_path / "kb.db"), embedder=embedder) for _ in range(2)]
    for p in workers:
        p.load()
    threads = [threading.Thread(target=p.fill_vectors) for p in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert embedder.texts == 1500
    assert vectors_of(workers[0]) == vectors_of(workers[1])
    for p in workers:
        p.store.close()
    store.close()


def test_a_changed_model_embeds_again_in_the_background(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb.db")
    store.append(KB, concepts(20))
    old = Projections(store, checkpoints=tmp_path / "ckpt", embedder=Counting("hash-64"))
    old.load()
    old.fill_vectors()
    old.write_checkpoint()
    new_model = Counting("hash-64-v2")
    p = Projections(store, checkpoints=tmp_path / "ckpt", embedder=new_model)
    p.load()
    assert p.loaded_from is not None and new_model.calls == 0
    assert p.get(KB).vectors.status() == "filling"  # answered by words meanwhile
    p.fill_vectors()
    assert new_model.texts == 20 and p.get(KB).vectors.status() == "complete"
    store.close()


def stored_rows(path: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT model, concept FROM vector ORDER BY model, concept").fetchall()


def test_rows_of_deleted_concepts_and_of_other_models_are_pruned(tmp_path: Path) -> None:
    """Nothing stale stays in the store: a new model's first round prunes the old model's
    rows, and a prune after a delete takes the deleted concept's row (and only it)."""
    store = Store(tmp_path / "kb.db")
    store.append(KB, concepts(6))
    old = Projections(store, embedder=Counting("hash-64"))
    old.load()
    old.fill_vectors()
    assert {model for model, _ in stored_rows(tmp_path / "kb.db")} == {"hash-64"}
    new = Counting("hash-64-v2")
    p = Projections(store, embedder=new)
    p.load()
    p.fill_vectors()
    everything = [("hash-64-v2", f"infra/n{i}") for i in range(6)]
    assert stored_rows(tmp_path / "kb.db") == everything
    store.append(KB, [delete("infra/n1", 2)])
    follow(p)
    p.fill_vectors()
    assert p.filler is not None and p.filler.prune() == 1
    assert stored_rows(tmp_path / "kb.db") == [r for r in everything if r[1] != "infra/n1"]
    assert p.filler.prune() == 0
    store.append(KB, [upsert("infra/n1", 3, title="note 1", text="disks 1")])  # re-created
    follow(p)
    p.fill_vectors()
    assert stored_rows(tmp_path / "kb.db") == everything and new.texts == 7
    store.close()


# --- case 2: one refused text -----------------------------------------------------------------


def test_embed_each_splits_until_the_refusal_is_one_texts() -> None:
    embedder = Counting()
    texts = [f"short {i}" for i in range(9)]
    texts[5] = "x" * (LIMIT + 1)
    got = embed_each(embedder, texts)
    assert isinstance(got[5], str) and "context length" in got[5]
    assert all(isinstance(v, np.ndarray) for i, v in enumerate(got) if i != 5)
    assert embedder.texts == 8  # each of the others once


def refused_total() -> float:
    return REGISTRY.get_sample_value("kbgraph_vectors_refused_total") or 0.0


def test_a_refused_text_is_recorded_alone_and_never_asked_again(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb.db")
    long_one = upsert("infra/long", title="long", text="y" * 5000)
    store.append(KB, [*concepts(10), long_one, *concepts(10, "ops")])
    embedder = Counting()
    before = refused_total()
    p = Projections(store, embedder=embedder)
    p.load()
    p.fill_vectors()
    assert refused_total() == before + 1
    kb = p.get(KB)
    with kb.read() as snap:
        status = tools.status(snap, snap.view(None), KB)
        assert (status.vectors, status.vectors_missing) == ("complete", 0)
        assert status.vectors_failed == 1 and status.vectors_failed_ids == ["infra/long"]
        words = tools.search(snap, snap.view(None), "long", 5, "lexical")
        assert [h.id for h in words.hits] == ["infra/long"]  # served by its words
    assert len(vectors_of(p)) == 20
    again = Counting()
    restarted = Projections(store, embedder=again)
    restarted.load()
    restarted.fill_vectors()
    assert again.calls == 0  # the refusal is stored with its text's hash
    with restarted.get(KB).read() as snap:
        assert tools.status(snap, snap.view(None), KB).vectors_failed_ids == ["infra/long"]
    store.close()


def test_over_http_a_long_text_is_cut_at_max_chars_and_a_refused_one_split_out(
    tmp_path: Path,
) -> None:
    server = FakeServer()
    server.refuse_over = 3000
    server.start()
    extra = (
        f'[embeddings]\nprovider = "openai"\nurl = "{server.url}"\nretries = 0\n'
        "batch = 64\nmax_chars = 2000\n"
    )
    try:
        with TestClient(create_app(load_config(write_config(tmp_path, extra)))) as client:
            s = Service(client)
            seq = s.write(KB, [*concepts(5), upsert("infra/long", title="t", text="z" * 10_000)])
            status = wait_complete(s, seq)
            assert status["vectors_missing"] == 0 and "vectors_failed" not in status
            assert max(len(t) for r in server.requests for t in r["input"]) == 2000
    finally:
        server.stop()
    server = FakeServer()
    server.refuse_over = 3000
    server.start()
    extra = f'[embeddings]\nprovider = "openai"\nurl = "{server.url}"\nretries = 0\n'
    try:
        folder = tmp_path / "second"
        folder.mkdir()
        with TestClient(create_app(load_config(write_config(folder, extra)))) as client:
            s = Service(client)
            seq = s.write(KB, [*concepts(5), upsert("infra/long", title="t", text="z" * 10_000)])
            status = wait_complete(s, seq)
            assert status["vectors_failed_ids"] == ["infra/long"], status
            assert status["vectors"] == "complete" and status["vectors_missing"] == 0
            assert s.call(INFRA, "GET", f"/v1/kbs/{KB}/status", seq).json()["vectors_failed"] == 1
    finally:
        server.stop()


visible_texts = st.lists(st.integers(0, 3), min_size=1, max_size=12)
hidden_texts = st.lists(st.integers(0, 3), min_size=1, max_size=12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(visible=visible_texts, hidden=hidden_texts, seed=st.integers(0, 2**16))
def test_narrowed_vectors_equal_a_kb_where_the_hidden_concepts_were_never_written(
    visible: list[int], hidden: list[int], seed: int
) -> None:
    """Hidden concepts, some refused (length 3), some not: a narrowed token's /status and
    vector, hybrid and graph_context answers are the admin's on a KB without them, byte for
    byte. Visible concepts may be refused too (length 3)."""

    def text(i: int, kind: int) -> str:
        return ("w" * (LIMIT + 1)) if kind == 3 else f"text {i} kind {kind} seed {seed}"

    shown = [
        upsert(f"infra/v{i}", title=f"v{i}", text=text(i, k), links=[f"infra/v{(i + 1) % 5}"])
        for i, k in enumerate(visible)
    ]
    secret = [upsert(f"secret/h{i}", title=f"h{i}", text=text(i, k)) for i, k in enumerate(hidden)]
    mixed = [e for pair in zip(secret, shown, strict=False) for e in pair]
    mixed += shown[len(secret) :] + secret[len(shown) :]
    answers = []
    with tempfile.TemporaryDirectory() as folder:
        for events, rules in ((mixed, INFRA_ONLY), (shown, None)):
            store = Store(Path(folder) / f"{rules is None}.db")
            store.append(KB, events)
            p = Projections(store, embedder=Counting())
            p.load()
            p.fill_vectors()
            with p.get(KB).read() as snap:
                view = snap.view(rules)
                meaning = retrieval.embed_now(snap.vectors, "text 1 kind 0")
                out = [
                    tools.status(snap, view, KB),
                    tools.search(snap, view, "text kind", 10, "vector", meaning),
                    tools.search(snap, view, "text kind", 10, "hybrid", meaning),
                    tools.graph_context(
                        snap, view, msgspec.convert({"query": "text 1"}, tools.GraphContextRequest)
                    ),
                ]
            answers.append([msgspec.json.encode(a) for a in out])
            store.close()
    assert answers[0] == answers[1]


# --- case 5: no shared query cache -----------------------------------------------------------


def test_two_tokens_asking_the_same_question_share_nothing(tmp_path: Path) -> None:
    """The provider is asked for each question, by each caller: nothing one caller asked is
    kept where another could observe it (the process-wide cache is gone)."""
    server = FakeServer()
    server.start()
    extra = (
        f'[embeddings]\nprovider = "openai"\nurl = "{server.url}"\nretries = 0\n'
        "query_timeout_seconds = 120\n"
    )
    try:
        with TestClient(create_app(load_config(write_config(tmp_path, extra)))) as client:
            s = Service(client)
            seq = s.write(KB, concepts(3))
            s.write("elsewhere", [upsert("a/b", title="b")])
            wait_complete(s, seq)
            asked = len(server.requests)
            question = "which disks fail first"
            for token, kb in ((ADMIN, KB), (INFRA, KB), (OTHER, "elsewhere"), (INFRA, KB)):
                answer = s.call(token, "GET", f"/v1/kbs/{kb}/search?q={question}")
                assert answer.status_code == 200 and answer.json()["mode"] == "hybrid"
            questions = [r["input"] for r in server.requests[asked:]]
            assert questions == [[question]] * 4
    finally:
        server.stop()
    assert not hasattr(retrieval, "_cache")


# --- case 9: the provider's address -----------------------------------------------------------


def test_a_provider_url_with_credentials_is_refused_at_load() -> None:
    base = '[embeddings]\nprovider = "openai"\nurl = "{}"\n'
    for url in ("http://user:pass@127.0.0.1:1/v1", "https://key@example.com/v1"):
        with pytest.raises(ConfigError, match=r"embeddings\.url: credentials") as caught:
            parse_config(base.format(url))
        assert "pass" not in str(caught.value) and "key@" not in str(caught.value)
    assert parse_config(base.format("http://127.0.0.1:1/v1?api-version=1")).embeddings.url


def test_the_embedders_name_in_checkpoints_holds_no_query_or_credentials(tmp_path: Path) -> None:
    embedder = OpenAIEmbedder(config("http://127.0.0.1:9/v1?key=sk-secret#frag"))
    assert embedder.name == "openai:http://127.0.0.1:9/v1:m"
    store = Store(tmp_path / "kb.db")
    store.append(KB, concepts(2))
    p = Projections(store, checkpoints=tmp_path / "ckpt", embedder=embedder)
    p.load()
    with p.get(KB).lock.write():  # a vector as the filler would install it
        p.get(KB).vectors.install([0], np.ones((1, 8), np.float32) / np.sqrt(8))
    path = p.write_checkpoint()
    assert path is not None and b"sk-secret" not in path.read_bytes()
    assert checkpoint.newest_usable(tmp_path / "ckpt", lambda header: None) is not None
    store.close()


def test_concept_text_is_what_is_hashed_and_cut() -> None:
    text = concept_text("T", ["a"], ["t"], "body")
    assert text == "T\na\nt\nbody"
