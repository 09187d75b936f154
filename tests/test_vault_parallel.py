"""Reading on several processes (issue 26) changes nothing: the same notes, links, warnings
and skips, in the same order, as reading in the importing process; the parse cache is filled
alike; a sync that sends while it reads sends the same deliveries, in the same order."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.events import Event, UpsertData
from kbgraph.sources import sync as sync_module
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink
from kbgraph.sources.sync import sync_once
from kbgraph.sources.vault.pool import PARALLEL_MIN_NOTES
from kbgraph.sources.vault.reader import MAX_NOTE_BYTES, NoteState, read_vault
from kbgraph.store import DeliveryResult


def write_vault(root: Path, n: int) -> None:
    for i in range(n):
        folder = root / f"f{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        status = ["active", "draft", "bogus"][i % 3]
        body = (
            f"---\ntitle: Note {i}\nstatus: {status}\ntags: [t{i % 5}, shared]\n---\n"
            f"# Heading {i}\n\nSee [[Note {(i * 7) % n}]] and [[f{i % 3}/n{i + 1}|x]]"
            f" #inline{i % 4}"
            f" and [[missing {i % 9}]] ![[img{i % 2}.png]]\n"
        )
        if i % 50 == 0:
            body = "same content\n"  # identical files share one parse
        (folder / f"n{i}.md").write_text(body, encoding="utf-8")
    (root / "img0.png").write_bytes(b"png")
    (root / "bad.md").write_bytes(b"\xff\xfe not utf-8")


def test_parallel_read_equals_serial(tmp_path: Path) -> None:
    n = PARALLEL_MIN_NOTES + 60
    write_vault(tmp_path, n)
    serial = read_vault(tmp_path, {}, workers=1)
    parallel = read_vault(tmp_path, {}, workers=2)
    assert len(serial.notes) == n
    assert list(serial.notes) == list(parallel.notes)
    assert serial.notes == parallel.notes
    assert serial.skipped == parallel.skipped and serial.skipped  # bad.md is reported
    assert serial.warnings == parallel.warnings and serial.warnings
    assert serial.unreadable == parallel.unreadable
    assert serial.attachments == parallel.attachments
    assert serial.parsed == parallel.parsed and set(serial.parsed) == serial.content_keys


class RecordingSink(LocalSink):
    """A local store that also keeps every delivery, without versions and event ids (they
    come from the clock): what was sent, in which delivery, in which order."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.deliveries: list[list[tuple[str, str, bytes]]] = []

    def send(self, kb: str, events: list[Event]) -> DeliveryResult:
        self.deliveries.append([
            (type(e).__struct_config__.tag, e.subject, _bytes(e))
            for e in events
        ])  # fmt: skip
        return super().send(kb, events)


def test_parallel_sync_sends_what_a_serial_sync_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sending overlaps reading on the pool: the deliveries (cut into several), their order
    and their bytes are those of a sync on one process, in a first import and in a re-sync
    with deletes, edits, a note now too large (deleted last) and parse-cache hits."""
    monkeypatch.setattr(sync_module, "BATCH_EVENTS", 97)
    vault = tmp_path / "vault"
    n = PARALLEL_MIN_NOTES + 60
    write_vault(vault, n)
    runs: dict[int, list[list[list[tuple[str, str, bytes]]]]] = {}
    for workers in (1, 2):
        sink = RecordingSink(tmp_path / f"w{workers}.db")
        runs[workers] = []
        try:
            with Manifest(tmp_path / f"w{workers}.manifest") as manifest:
                sync_once(vault, "kb", sink, manifest, workers=workers)
                runs[workers].append(sink.deliveries)
                sink.deliveries = []
                edited = _edit(vault, workers)
                sync_once(vault, "kb", sink, manifest, workers=workers)
                runs[workers].append(sink.deliveries)
                _restore(vault, edited)
        finally:
            sink.close()
    assert runs[1] == runs[2]
    first, second = runs[2]
    assert sum(map(len, first)) == n and len(first) > 3  # every note, in several deliveries
    kinds = [kind for delivery in second for kind, _, _ in delivery]
    subjects = [subject for delivery in second for _, subject, _ in delivery]
    deleted = [s for kind, s in zip(kinds, subjects, strict=True) if kind == "concept.deleted"]
    assert deleted == ["f1/n1", "f2/n2", "f3/n3", "f0/n0"]  # gone first, then too large, last
    assert kinds[-1] == "concept.deleted" and kinds.count("concept.upserted") >= 20
    upserts = [s for kind, s in zip(kinds, subjects, strict=True) if kind == "concept.upserted"]
    assert upserts == sorted(upserts)


def _edit(vault: Path, workers: int) -> dict[Path, bytes]:
    """Delete three notes, edit twenty, make one too large; what to put back after."""
    saved = {p: p.read_bytes() for p in sorted(vault.rglob("*.md"))}
    for i in (1, 2, 3):
        (vault / f"f{i}" / f"n{i}.md").unlink()
    for i in range(10, 30):
        (vault / f"f{i % 7}" / f"n{i}.md").write_text(f"edited [[Note {i + 1}]]", encoding="utf-8")
    (vault / "f0" / "n0.md").write_bytes(b"x" * (MAX_NOTE_BYTES + 1))
    return saved


def _restore(vault: Path, saved: dict[Path, bytes]) -> None:
    for path, content in saved.items():
        path.write_bytes(content)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 5000), st.none()), max_size=60), st.integers(1, 6))
def test_deliveries_are_cut_as_the_bounds_say(items: list[int | None], most: int) -> None:
    """The deliveries cut as notes come: in order, each within both bounds unless a single
    item breaks the byte bound, and each as full as it may be."""
    work: list[str | NoteState] = [
        f"d{i}" if size is None else _state(f"n{i}", "x" * size) for i, size in enumerate(items)
    ]
    weight = {id(w): 200 if isinstance(w, str) else 400 + 2 * len(w.data.text) for w in work}
    bound = 3000
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sync_module, "BATCH_EVENTS", most)
        mp.setattr(sync_module, "BATCH_BYTES", bound)
        batcher = sync_module._Batcher()
        batches = [b for w in work for b in batcher.add(w)] + batcher.flush()
    assert [w for b in batches for w in b] == work
    for b, after in zip(batches, [*batches[1:], None], strict=False):
        size = sum(weight[id(w)] for w in b)
        assert len(b) <= most and (size <= bound or len(b) == 1)
        if after is not None:  # the next item did not fit
            assert len(b) == most or size + weight[id(after[0])] > bound


def _state(nid: str, text: str) -> NoteState:
    return NoteState(nid, nid + ".md", UpsertData(version=0, text=text), "d", 0)


def _bytes(event: Event) -> bytes:
    return msgspec.json.encode(msgspec.structs.replace(event.data, version=1))
