"""The local store's analyses made in the vault's parse workers (``kbgraph.sources.vault.ahead``):
the store runs its model for none of the notes made ahead, and it ends with the bytes of a
store that analysed every note itself (the log's analyses, the vector rows, the state), in a
first import and in a re-sync; an analysis of another key is never taken."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from kbgraph.config import Config, EmbeddingsConfig, StoreConfig
from kbgraph.embeddings.carried import Carrier
from kbgraph.embeddings.providers import make_embedder
from kbgraph.events import ConceptUpserted, UpsertData, decode_from_log
from kbgraph.search import document
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import SyncReport, sync_once
from kbgraph.sources.vault import ahead
from kbgraph.sources.vault.ahead import Ahead, Maker
from kbgraph.sources.vault.pool import PARALLEL_MIN_NOTES
from kbgraph.sources.vault.reader import NoteState, VaultScan
from kbgraph.store import MadeAhead, Store
from kbgraph.store.opening import open_store
from tests.kb_events import upsert

pytest.importorskip("kbgraph.embeddings.local")


class Counting:
    """The local model, counting the texts the store asks it for (same name: same key)."""

    def __init__(self) -> None:
        inner = make_embedder(EmbeddingsConfig("local"))
        assert inner is not None
        self.inner, self.name, self.remote, self.texts = inner, inner.name, False, 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return self.inner.embed(texts)


def write_vault(root: Path, n: int) -> None:
    for i in range(n):
        folder = root / f"f{i % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        body = (
            f"---\ntitle: Note {i}\naliases: [n{i}]\ntags: [t{i % 3}]\n---\n# Note {i}\n\n"
            f"Words {i % 11} about [[Note {(i * 7) % n}]] and [[missing {i % 4}]] #inline{i % 2}\n"
        )
        if i % 40 == 0:
            body = "same content in several files\n"
        (folder / f"n{i}.md").write_text(body, encoding="utf-8")
    (root / "bad.md").write_bytes(b"\xff\xfe not utf-8")


def stored(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The log's (seq, subject, an upsert's data without its version, analysis) and the
    vector rows."""
    conn = sqlite3.connect(path)
    try:
        log = []
        for seq, payload, analysis in conn.execute(
            "SELECT seq, event, analysis FROM log ORDER BY gid"
        ):
            event = decode_from_log(payload)  # its version and id come from the clock
            data = None
            if isinstance(event, ConceptUpserted):
                data = msgspec.structs.replace(event.data, version=0)
            log.append((seq, event.subject, data, analysis))
        vectors = conn.execute(
            "SELECT kb, concept, model, text_hash, vec, problem FROM vector"
            " ORDER BY kb, model, concept"
        ).fetchall()
    finally:
        conn.close()
    return log, vectors


READS = VaultScan.reads  # the method itself, before a test wraps it


def run(
    vault: Path, work: Path, provider: str, per_worker: int, mp: pytest.MonkeyPatch
) -> tuple[list[SyncReport], list[int], list[Ahead | None]]:
    """A first import and a re-sync after edits, into a fresh store; the reports, the texts
    the store's model embedded in each, and what each told the parse workers to make."""
    mp.setattr(ahead, "AHEAD_NOTES_PER_WORKER", per_worker)
    mp.setattr(ahead, "AHEAD_MIN_CORES", 1)  # whatever cores the machine running the test has
    told: list[Ahead | None] = []

    def reads_told(scan: VaultScan, *args: Any) -> Iterator[NoteState]:
        told.append(args[3])  # cache, progress, workers, ahead
        return READS(scan, *args)

    mp.setattr(VaultScan, "reads", reads_told)
    embedder = Counting() if provider == "local" else None
    config = Config(StoreConfig(str(work / "kb.db")), EmbeddingsConfig(provider))
    sink = LocalSink(open_store(config, embedder=embedder))
    reports, texts = [], []
    try:
        with Manifest(work / "kb.manifest") as manifest:
            for edit in (False, True):
                if edit:
                    for i in range(10, 20):
                        note = vault / f"f{i % 5}" / f"n{i}.md"
                        note.write_text(f"edited {i} [[Note {i + 1}]]", encoding="utf-8")
                    for i in range(3):
                        (vault / f"new{i}.md").write_text(f"new {i} [[n{i}]]", encoding="utf-8")
                    (vault / "f1" / "n1.md").unlink()
                before = 0 if embedder is None else embedder.texts
                reports.append(sync_once(vault, "kb", sink, manifest, workers=2))
                texts.append(0 if embedder is None else embedder.texts - before)
    finally:
        sink.close()
    return reports, texts, told


@pytest.mark.parametrize("provider", ["local", "none"])
def test_analyses_made_ahead_equal_the_stores_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: str
) -> None:
    n = PARALLEL_MIN_NOTES + 40
    results = {}
    for name, per_worker in (("ahead", 1), ("store", 10**9)):
        vault = tmp_path / name / "vault"
        write_vault(vault, n)
        (tmp_path / name / "work").mkdir()
        reports, texts, told = run(
            vault, tmp_path / name / "work", provider, per_worker, monkeypatch
        )
        results[name] = (stored(tmp_path / name / "work" / "kb.db"), reports, texts, told)
    (made, made_reports, made_texts, made_told), (own, own_reports, own_texts, own_told) = (
        results.values()
    )
    # the workers told to make analyses only when they will, with the digests sent before
    assert own_told == [None, None]
    first, again = made_told
    assert first is not None and (first.sent, first.new_notes) == ([], n + 1)  # bad.md too
    assert again is not None and again.new_notes == 3 + 1  # the three new notes, bad.md
    assert len(again.sent) == made_reports[0].upserted  # every note the first import sent
    assert made == own
    log, vectors = made
    assert len(log) == n + 1 + 10 + 3  # the notes; one deleted, ten edited, three new
    assert all(analysis for _, _, data, analysis in log if data is not None)
    assert len(vectors) == (n + 3 if provider == "local" else 0)  # one per note sent
    for one, other in zip(made_reports, own_reports, strict=True):
        assert one.summary() == other.summary()
        assert (one.upserted, one.deleted, one.unchanged) == (
            other.upserted,
            other.deleted,
            other.unchanged,
        )
    assert "skipped bad.md: unreadable" in made_reports[0].summary()
    if provider == "local":
        assert own_texts[0] > 0 and own_texts[1] == 13  # the store embedded each note itself
        assert made_texts == [0, 0]  # the workers made every analysis, the edited notes' too


def test_an_analysis_made_ahead_is_taken_under_the_stores_key_only(tmp_path: Path) -> None:
    """Taken as it is under the store's key (a marker shows it); under another key, or with a
    vector the store's key needs missing, the store analyses the event itself."""
    embedder = Counting()
    carrier = Carrier(embedder, 8000)
    events = [upsert(f"c{i}", title=f"Concept {i}", text=f"text {i}", version=1) for i in range(4)]
    own = [document.encode(e.data.title, e.data.text, e.data.aliases, e.data.tags) for e in events]
    marker = MadeAhead(carrier.key, b"marker", b"h" * 16, np.ones(256, "<f4").tobytes())
    ahead_of = [
        marker,
        MadeAhead("other|8000", b"never"),
        MadeAhead(carrier.key, b"no vector"),
        None,
    ]
    with Store(tmp_path / "kb.db", carrier=carrier) as store:
        store.append("kb", list(events), ahead=ahead_of)
    log, vectors = stored(tmp_path / "kb.db")
    analyses = [analysis for *_, analysis in log]
    assert analyses[0] == b"marker"
    assert all(a not in (b"never", b"no vector") and a for a in analyses[1:])
    assert embedder.texts == 3  # the three not taken
    rows = {concept: (text_hash, vec) for _, concept, _, text_hash, vec, _ in vectors}
    assert rows["c0"] == (b"h" * 16, np.ones(256, "<f4").tobytes()) and len(rows) == 4
    with Store(tmp_path / "bare.db") as store:  # no model: key ""
        store.append("kb", list(events), ahead=[MadeAhead("", b"bare"), marker, None, None])
    analyses = [analysis for *_, analysis in stored(tmp_path / "bare.db")[0]]
    assert analyses[0] == b"bare" and analyses[1:] == own[1:]


def test_a_worker_makes_nothing_sent_before_nor_for_a_key_it_has_no_model_of() -> None:
    data = [UpsertData(0, f"T{i}", [], "", "", [], f"text {i}", []) for i in range(3)]
    states = [NoteState(f"n{i}", f"n{i}.md", d, f"digest{i}", 0) for i, d in enumerate(data)]
    key = Carrier(Counting(), 8000).key
    made = Maker(Ahead(key, 8000, ["digest1"], 2)).made(states)
    assert made[1] is None and made[0] is not None and made[2] is not None
    analysis, text_hash, vector = made[0]
    assert len(text_hash) == 16 and len(vector) == 256 * 4
    assert document.decode(analysis) is not None
    assert Maker(Ahead("other|8000", 8000, [], 3)).made(states) == [None] * 3
    assert Maker(Ahead(key, 4000, [], 3)).made(states) == [None] * 3  # another cut: no key
    enough = Ahead(key, 8000, [], 2 * ahead.AHEAD_NOTES_PER_WORKER)
    assert enough.worth(2, ahead.AHEAD_MIN_CORES) and not enough.worth(2, ahead.AHEAD_MIN_CORES - 1)
    assert not Ahead(key, 8000, [], 2 * ahead.AHEAD_NOTES_PER_WORKER - 1).worth(2, 64)
