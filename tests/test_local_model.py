"""The local model's vectors (``kbgraph.embeddings.local``) against an oracle written from its
definition: the sum of the token table's rows of the text's tokens (``tokens``: piece by piece,
each piece's tokens as the tokenizer gives them alone), one float32 add at a time in token
order, scaled to unit length. The same bytes whichever texts a call holds, however the word
cache was filled, started over or shared between threads."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

local = pytest.importorskip("kbgraph.embeddings.local")
MODEL = local.LocalEmbedder()


def table() -> np.ndarray:
    """The token table, read from the wheel the way its own loader would."""
    from safetensors.numpy import load_file

    spec = importlib.util.find_spec("wordllama")
    assert spec is not None and spec.origin is not None
    folder = Path(spec.origin).parent / "weights"
    weights = load_file(str(folder / f"{local.MODEL}_{local.DIM}.safetensors"))
    return np.ascontiguousarray(weights["embedding.weight"], np.float32)


TABLE = table()


def oracle(text: str) -> bytes:
    acc = np.zeros(TABLE.shape[1], np.float32)
    for token in MODEL.tokens(text):
        acc = acc + TABLE[min(max(token, 0), len(TABLE) - 1)]
    norm = 0.0
    for square in (acc * acc).tolist():  # float32 products, summed in float64, in order
        norm += square
    if norm > 0:
        acc = acc * np.float32(1.0 / np.sqrt(norm))
    return acc.astype(np.float32).tobytes()


text = st.lists(
    st.sampled_from(
        [*"ab zé\n\t.-日🎉<>/", "ing", "tion", "  ", "the", "Router", "▁", "\n\n", "<s", "unk>"]
    )
).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(text, max_size=6))
def test_a_calls_vectors_are_the_oracles(texts: list[str]) -> None:
    got = MODEL.embed(texts)
    assert got.dtype == np.float32 and got.shape == (len(texts), local.DIM)
    assert [row.tobytes() for row in got] == [oracle(t) for t in texts]


@settings(max_examples=200, deadline=None)
@given(text)
def test_a_texts_tokens_piece_by_piece_are_the_whole_texts(one: str) -> None:
    """The pieces' tokens (the normaliser, then the BPE model) are those of the whole text
    tokenized at once."""
    assert sorted(MODEL.tokens(one)) == sorted(MODEL.whole_tokens(one))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["<s>", "</s>", "<unk>", "a<s>b", "x<", "b>", "word"]), min_size=1))
def test_pieces_holding_added_tokens_are_tokenized_alone(words: list[str]) -> None:
    """A piece that may hold one of the tokenizer's added tokens (``<s>``, matched before its
    normaliser) is tokenized alone by the tokenizer itself: a text of words and single spaces
    gets each word's own tokens, in order (the whole text's differ around the added tokens:
    the normaliser's mark is prepended after each)."""
    want = [token for word in words for token in MODEL.whole_tokens(word)]
    assert MODEL.tokens(" ".join(words)) == want


def test_a_full_word_cache_starts_over_with_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = local.LocalEmbedder()
    texts = ["Upgrade the DNS", "routers and switches", "Upgrade the DNS again", "the ▁ mark"]
    want = [oracle(t) for t in texts]
    monkeypatch.setattr(local, "WORD_CACHE", 5)
    for _ in range(2):
        assert [row.tobytes() for row in model.embed(texts)] == want
        assert [model.embed([t])[0].tobytes() for t in texts] == want


def test_threads_sharing_the_cache_get_the_oracles_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads embed texts of new words at once, the cache filling and starting over
    under them: each text's bytes are the oracle's."""
    monkeypatch.setattr(local, "WORD_CACHE", 300)
    model = local.LocalEmbedder()
    texts = [f"word{i} shared{i % 7} note {i * 31} routers" for i in range(400)]
    want = {t: oracle(t) for t in texts}
    wrong: list[str] = []

    def work(k: int) -> None:
        for at in range(k, len(texts), 40):
            part = texts[at : at + 40]
            rows = model.embed(part)
            wrong.extend(t for t, row in zip(part, rows, strict=True) if row.tobytes() != want[t])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert wrong == []
