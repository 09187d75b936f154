"""Vectors (issue 24): the scan against a float oracle on the visible rows, hidden rows never
deciding, determinism, the local model's bytes, checkpoints carrying vectors (a restart computes
none again), a provider failing mid-import (nothing lost, filled in later), search modes over
HTTP (409 without vectors)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from kbgraph.api import create_app
from kbgraph.config import load_config
from kbgraph.embeddings import EmbeddingUnavailable, concept_text
from kbgraph.embeddings.local import LocalEmbedder
from kbgraph.graphalgo.nearest import nearest, quantize, sign_codes
from kbgraph.projection import Projections, filler
from kbgraph.store import Store
from tests.embedders import LOCAL, vectors_of
from tests.kb_events import delete, upsert
from tests.support import ADMIN, Service, write_config

KB = "homelab"


class Counting:
    """The local model, counting the texts it embeds; ``down`` makes it fail."""

    def __init__(self) -> None:
        self.name = LOCAL.name
        self.remote = False
        self.texts = 0
        self.down = False

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.down:
            raise EmbeddingUnavailable("down for the test")
        self.texts += len(texts)
        return LOCAL.embed(texts)


def unit_rows(seed: int, n: int, dim: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 300),
    dim=st.sampled_from([64, 128, 256, 96]),
    share=st.floats(0.0, 1.0),
)
def test_nearest_equals_a_float_oracle_on_the_visible_rows(
    seed: int, n: int, dim: int, share: float
) -> None:
    rng = np.random.default_rng(seed)
    q8, scale, codes = quantize(unit_rows(seed, n, dim))
    mask = (rng.random(n) < share).astype(np.uint8)
    query = unit_rows(seed + 1, 1, dim)[0]
    rows, scores = nearest(q8, scale, codes, mask, query)
    # Oracle: every visible row (n <= the shortlist), float64 dot of the stored vectors.
    oracle = (q8.astype(np.float64) * scale[:, None].astype(np.float64)) @ query.astype(np.float64)
    visible = np.flatnonzero(mask)
    assert sorted(rows.tolist()) == visible.tolist()
    # The query is taken in 16 bits: each score within sqrt(dim) * 2**-16 of the oracle's.
    tolerance = np.sqrt(dim) / 65534
    assert np.allclose(scores, oracle[rows], rtol=0, atol=tolerance)
    ranked = oracle[rows]
    assert all(ranked[i] >= ranked[i + 1] - 2 * tolerance for i in range(len(rows) - 1))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(600, 1500), shortlist=st.integers(1, 700))
def test_hidden_rows_never_decide_a_visible_answer(seed: int, n: int, shortlist: int) -> None:
    """Past the shortlist too: rows outside the mask may hold anything, the answer is the same
    as on arrays holding only the visible rows (and the same bytes twice)."""
    rng = np.random.default_rng(seed)
    q8, scale, codes = quantize(unit_rows(seed, n, 128))
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    query = unit_rows(seed + 1, 1, 128)[0]
    rows, scores = nearest(q8, scale, codes, mask, query, shortlist)
    hidden = mask == 0
    q8b, scaleb, codesb = q8.copy(), scale.copy(), codes.copy()
    q8b[hidden] = rng.integers(-127, 128, (int(hidden.sum()), 128), dtype=np.int8)
    codesb[hidden] = ~codesb[hidden]
    scaleb[hidden] = 9.0
    rows2, scores2 = nearest(q8b, scaleb, codesb, mask, query, shortlist)
    assert rows.tobytes() == rows2.tobytes() and scores.tobytes() == scores2.tobytes()
    # Oracle: the visible rows within the Hamming distance of the shortlist-th nearest, every
    # row tied at that distance included (a cut by row would follow interning order).
    visible = np.flatnonzero(mask)
    distance = np.bitwise_count(codes[visible] ^ sign_codes(query[None, :])[0]).sum(axis=1)
    cut = np.sort(distance)[min(shortlist, len(visible)) - 1]
    assert sorted(rows.tolist()) == visible[distance <= cut].tolist()
    # The rows renumbered (another interning order): the same concepts with the same scores.
    order = rng.permutation(n)
    rows3, scores3 = nearest(q8[order], scale[order], codes[order], mask[order], query, shortlist)
    assert dict(zip(order[rows3].tolist(), scores3.tolist(), strict=True)) == dict(
        zip(rows.tolist(), scores.tolist(), strict=True)
    )


def test_the_local_model_is_deterministic_and_needs_no_network(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts = ["sync my vault between phone and laptop", "ZFS pool", "", "ü" * 5000]
    a = LocalEmbedder().embed(texts)
    b = LOCAL.embed(texts)
    assert a.tobytes() == b.tobytes() and a.shape == (4, 256) and a.dtype == np.float32
    norms = np.linalg.norm(a[[0, 1, 3]], axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5) and not a[2].any()  # no token: a zero vector
    near = LOCAL.embed(["Syncthing keeps folders the same on phone and laptop"])[0]
    far = LOCAL.embed(["replace a failed disk in the ZFS mirror"])[0]
    assert a[0] @ near > a[0] @ far


def _concepts(k: int) -> list:
    return [
        upsert(f"c/n{i}", title=f"note {i}", text=f"about disks and backups number {i}")
        for i in range(k)
    ]


def test_checkpoint_carries_vectors_and_a_restart_computes_none(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb.db")
    store.append(KB, _concepts(40))
    first = Counting()
    p = Projections(store, checkpoints=tmp_path / "ckpt", embedder=first)
    p.load()
    while p.follow_once() or p.fill_vectors():
        pass
    assert first.texts == 40
    before = vectors_of(p)
    assert len(before) == 40
    assert p.write_checkpoint() is not None
    again = Counting()
    q = Projections(store, checkpoints=tmp_path / "ckpt", embedder=again)
    q.load()
    assert q.loaded_from is not None
    q.fill_vectors()
    assert again.texts == 0  # nothing recomputed
    assert vectors_of(q) == before
    store.append(KB, [upsert("c/n1", 2, title="note 1", text="now about the router")])
    q.follow_once()
    # an in-process model: the follower settles the batch's vectors before its seq is
    # announced, only the changed concept's
    assert again.texts == 1 and q.get(KB).vectors.status() == "complete"
    assert q.fill_vectors() == 0 and again.texts == 1
    store.close()


def test_a_provider_down_mid_import_loses_nothing_and_fills_in_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "BACKOFF_START", 0.0)  # no pause before the next try
    store = Store(tmp_path / "kb.db")
    embedder = Counting()
    p = Projections(store, embedder=embedder)
    p.load()
    store.append(KB, _concepts(10))
    p.follow_once()
    p.fill_vectors()
    embedder.down = True
    seq = store.append(KB, [*_concepts(25)[10:], delete("c/n3", 2)]).seq
    p.follow_once()
    kb = p.get(KB)
    assert kb.seq == seq  # every event applied while the provider was down
    assert kb.vectors.status() == "filling"
    assert len(vectors_of(p)) == 9  # n3 deleted; n10..n24 wait
    assert p.fill_vectors() == 0
    embedder.down = False
    assert p.fill_vectors() == 15
    assert kb.vectors.status() == "complete"
    got = vectors_of(p)
    assert sorted(got) == sorted(f"c/n{i}" for i in range(25) if i != 3)
    with kb.read() as snap:
        u = snap.node("c/n20")
        want = LOCAL.embed([concept_text("note 20", [], [], "about disks and backups number 20")])
        from kbgraph.graphalgo.nearest import quantize as q

        assert got["c/n20"] == q(want)[0][0].tobytes() + q(want)[1][0].tobytes()
        assert snap.vectors.have[u]
    store.close()


@pytest.fixture
def vector_service(tmp_path: Path):
    app = create_app(load_config(write_config(tmp_path, '[embeddings]\nprovider = "local"\n')))
    with TestClient(app) as client:
        yield Service(client)


def test_search_modes_over_http(vector_service: Service, tmp_path: Path) -> None:
    s = vector_service
    seq = s.write(
        KB,
        [
            upsert("services/sync", title="Syncthing", text="keeps folders the same on devices"),
            upsert("infra/zfs", title="ZFS pool", text="mirrored disks, scrubs every month"),
        ],
    )
    url = f"/v1/kbs/{KB}/search?q=keep%20my%20phone%20and%20laptop%20the%20same"
    default = s.call(ADMIN, "GET", url, seq)
    hybrid = s.call(ADMIN, "GET", url + "&mode=hybrid", seq)
    assert default.status_code == 200 and default.content == hybrid.content
    vector = s.call(ADMIN, "GET", url + "&mode=vector", seq).json()
    assert [h["id"] for h in vector["hits"]] == ["services/sync", "infra/zfs"]
    assert s.call(ADMIN, "GET", url + "&mode=fuzzy", seq).json() == {
        "error": 'invalid mode "fuzzy": expected lexical, vector or hybrid'
    }
    kbs = s.call(ADMIN, "GET", "/v1/kbs").json()["kbs"]
    assert kbs[0]["vectors"] == "complete" and kbs[0]["vectors_missing"] == 0


def test_vector_mode_without_vectors_is_409(tmp_path: Path) -> None:
    app = create_app(load_config(write_config(tmp_path, '[embeddings]\nprovider = "none"\n')))
    with TestClient(app) as client:
        s = Service(client)
        seq = s.write(KB, [upsert("a/b", title="dns")])
        answer = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/search?q=dns&mode=vector", seq)
        assert answer.status_code == 409
        assert "[embeddings]" in answer.json()["error"]
        status = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/status", seq).json()
        assert status["vectors"] == "off"
        lexical = s.call(ADMIN, "GET", f"/v1/kbs/{KB}/search?q=dns", seq).json()
        assert [h["id"] for h in lexical["hits"]] == ["a/b"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*"ab zé\n\t.-_日🎉", "ing", "tion", "    ", "the", "▁"])).map("".join)
)
def test_tokens_by_piece_equal_the_whole_texts_tokens(text: str) -> None:
    """The local model tokenizes word by word (cached): the same tokens as the whole text."""
    whole = LOCAL.whole_tokens(text)
    assert sorted(LOCAL.tokens(text)) == sorted(whole)


def test_a_full_word_cache_starts_over_without_losing_a_word(monkeypatch) -> None:
    """When the cache fills, a text holding both cached and new words still gets every
    token (it was a KeyError that stopped the projection's follower at a million concepts)."""
    import kbgraph.embeddings.local as local

    model = LocalEmbedder()
    monkeypatch.setattr(local, "WORD_CACHE", 4)
    texts = ["Upgrade the DNS", "Upgrade routers and switches", "Upgrade the DNS again"]
    for text in texts:
        whole = model.whole_tokens(text)
        assert sorted(model.tokens(text)) == sorted(whole), text


def test_tokens_by_piece_on_the_example_vault() -> None:
    from kbgraph.sources.vault.reader import read_vault

    vault = Path(__file__).resolve().parent.parent / "examples" / "vault"
    for note in read_vault(vault).notes.values():
        d = note.data
        text = concept_text(d.title, d.aliases, d.tags, d.text)[:4000]
        whole = LOCAL.whole_tokens(text)
        assert sorted(LOCAL.tokens(text)) == sorted(whole), d.title


def test_a_row_of_negligible_components_quantises_as_zero_without_overflow() -> None:
    rows = np.array([[1.2e-38, 0.0, -1e-38], [0.0, 0.0, 0.0], [0.5, -0.25, 0.1]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 127 / 1.2e-38 overflows float32: no RuntimeWarning
        q8, scale, _codes = quantize(rows)
    assert q8[:2].tolist() == [[0, 0, 0], [0, 0, 0]]
    assert q8[2].tolist() == [127, -64, 25] and scale[2] == np.float32(0.5 / 127)


def test_an_in_process_model_is_settled_by_the_follower_and_its_rows_stored_after(
    tmp_path: Path,
) -> None:
    """The local model: the follower embeds a batch's texts before announcing its seq, and the
    filler's next round stores those rows, so a restart without a checkpoint embeds none."""
    store = Store(tmp_path / "kb.db")
    first = Counting()
    p = Projections(store, embedder=first)
    p.load()
    store.append(KB, _concepts(12))
    p.follow_once()
    assert first.texts == 12 and p.seq(KB) == 12
    assert p.get(KB).vectors.status() == "complete"
    assert store.read_vectors(KB, LOCAL.name, [f"c/n{i}" for i in range(12)]) == []
    p.fill_vectors()  # the filler's round stores what the follower computed
    again = Counting()
    q = Projections(store, embedder=again)
    q.load()  # built from the store: every vector waiting, the stored rows settle them
    q.fill_vectors()
    assert again.texts == 0 and vectors_of(q) == vectors_of(p)
    store.close()
