"""Sync a vault into a destination: send only what changed since the manifest's record.

One run: read the vault (``reader``), compare each note's digest with what the manifest says
was sent, and send deletes (a note gone, or renamed away) and upserts (new or changed), in
deliveries of at most ``BATCH_EVENTS`` events and about ``BATCH_BYTES`` bytes. Per delivery:
reserve its versions in the manifest (durable), send, record. Event ids are derived from
(kb, path, version, digest), so a delivery re-sent after a lost answer is all duplicates.

A note's digest covers its whole concept state, resolved links included: a new note that
changes how another note's ``[[name]]`` resolves re-sends that other note too, so the state
after any sequence of syncs equals a fresh import of the final folder.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

import msgspec

from kbgraph.events import ConceptDeleted, ConceptUpserted, DeleteData, Event
from kbgraph.sources.logseq.reader import LogseqScan, open_scan
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import LocalSink, Sink
from kbgraph.sources.vault.ahead import Ahead, Made, worth
from kbgraph.sources.vault.pool import default_workers, parallel
from kbgraph.sources.vault.reader import (
    MAX_NOTE_BYTES,
    NoteState,
    VaultRead,
    VaultScan,
    is_ignored,
)
from kbgraph.store import DeliveryResult, MadeAhead

SOURCE: Final = "kbgraph-vault"
BATCH_EVENTS: Final = 500
BATCH_BYTES: Final = 4 << 20
WATCH_DEBOUNCE_MS: Final = 1600  # the longest burst one save is grouped over
WATCH_STEP_MS: Final = 100  # a quiet gap this long ends a burst


@dataclass(slots=True)
class SyncReport:
    read: VaultRead
    upserted: int = 0
    deleted: int = 0
    unchanged: int = 0
    reset: bool = False  # the destination was behind the manifest: everything sent again
    results: list[tuple[int, int, int]] = field(default_factory=list)  # applied, dup, stale

    def summary(self) -> str:
        r = self.read
        lines = [
            f"{len(r.notes)} notes, {r.links} links between them (a pair linked both ways"
            f" counts once), {r.unresolved} unresolved links, {r.attachments} attachment links;"
            f" sent {self.upserted} upserts and "
            f"{self.deleted} deletes, {self.unchanged} notes unchanged"
        ]
        if r.resolved_by:
            counts = ", ".join(f"{rule} {n}" for rule, n in r.resolved_by.items())
            lines.append(f"references resolved by {counts}")
        if self.reset:
            lines.append("the KB was behind this vault's manifest (a new store?): sent every note")
        lines += [f"skipped {printable(path)}: {printable(why)}" for path, why in r.skipped]
        lines += [f"warning {printable(path)}: {printable(what)}" for path, what in r.warnings]
        return "\n".join(lines)

    def details(self) -> str:
        """``--report``'s file: a tab-separated line per link to no note (the note, the link
        as written), per file skipped and per warning (the path, why), names escaped as in
        the summary."""
        notes = self.read.notes
        rows = [("kind", "where", "what")]
        rows += [
            ("unresolved", note.id, target)
            for note in notes.values()
            for target in note.data.links
            if target not in notes
        ]
        rows += [("skipped", path, why) for path, why in self.read.skipped]
        rows += [("warning", path, what) for path, what in self.read.warnings]
        return "".join("\t".join(printable(cell) for cell in row) + "\n" for row in rows)


def printable(text: str) -> str:
    """``text`` on one line of the report as it is: a character that is not printable (a
    newline, a terminal escape, a bidi override in a file name could forge or hide lines)
    written as its Python escape (``\\n``, ``\\x1b``, ``\\u202e``)."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def event_id(kb: str, path: str, version: int, digest: str) -> str:
    key = f"{kb}\0{path}\0{version}\0{digest}".encode()
    return hashlib.sha256(key).hexdigest()[:40]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """CPython's cycle collector paused for one run. A run keeps every note it read (states,
    parsed fields, the report) until it ends, and the collector went over that growing heap
    again and again: 40% of the importing process's CPU at 20,000 notes. A run makes next to
    no reference cycles (5 objects at 20,000 notes): they wait for the collector's first pass
    after the run, when it is switched back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def sync_once(
    root: Path,
    kb: str,
    sink: Sink,
    manifest: Manifest,
    progress: Callable[[str, int, int], None] | None = None,
    workers: int | None = None,
    allow_hardlinks: bool = False,
    max_note_bytes: int = MAX_NOTE_BYTES,
) -> SyncReport:
    """One pass: read the vault, send what changed, record it. Raises SyncError on refusal.

    Sending overlaps reading: the notes come in id order from ``VaultScan.reads`` (on
    ``workers`` processes) and each delivery goes as soon as it is full. The deliveries are
    the notes gone from the folder, then the changed notes in id order, then the notes that
    are still there but can no longer be read as notes (too large, a symlink out): a
    deterministic order, decided by the folder and the manifest alone.
    ``progress(stage, done, total)`` is called as notes are read (``"read"``) and sent.
    ``allow_hardlinks``: read notes with more than one name (``reader`` skips them else);
    ``max_note_bytes``: a note's file over it is skipped (``--max-page-bytes``).
    """
    with _collector_paused():
        return _sync_once(
            root, kb, sink, manifest, progress, workers, allow_hardlinks, max_note_bytes
        )


def _sync_once(
    root: Path,
    kb: str,
    sink: Sink,
    manifest: Manifest,
    progress: Callable[[str, int, int], None] | None,
    workers: int | None,
    allow_hardlinks: bool,
    max_note_bytes: int,
) -> SyncReport:
    cache = manifest.parse_cache()
    scan = open_scan(root, allow_hardlinks, max_note_bytes)  # a Logseq graph, else a vault
    report = SyncReport(scan.out)
    seq = sink.kb_seq(kb)
    report.reset = seq is not None and manifest.forget_if_behind(sink.dest, kb, seq)
    sent = manifest.sent(sink.dest, kb)
    batches = _Batcher()
    # a delivery holds the deletes first, then the upserts: for the total shown as progress
    todo = len(scan.ids) + sum(cid not in scan.ids for cid in sent)

    def sent_so_far(done: int) -> None:
        if progress is not None:
            progress("sent", done, todo)

    ahead = _ahead(sink, scan, sent, default_workers() if workers is None else workers)
    made = scan.made if ahead is not None and isinstance(scan, VaultScan) else {}
    key = None if ahead is None else ahead.key
    with _Sender(kb, sink, manifest, report, sent_so_far, key, made) as sender:
        send = sender.send
        # gone from the folder: deleted
        for cid in sorted(cid for cid in sent if cid not in scan.ids):
            for batch in batches.add(cid):
                send(batch)
        on_read = None if progress is None else partial(progress, "read")
        for note in scan.reads(cache, on_read, workers, ahead):
            if sent.get(note.id, ("",))[0] == note.digest:
                report.unchanged += 1
                todo -= 1
                continue
            for batch in batches.add(note):
                send(batch)
        read = scan.out
        gone = cache.keys() - read.content_keys
        if gone or read.parsed:
            manifest.update_parse_cache(read.parsed, gone)
        # still in the folder, but skipped (and not merely unreadable right now): deleted
        for cid in sorted(cid for cid in scan.ids if cid in sent and cid not in read.notes):
            if cid not in read.unreadable:
                for batch in batches.add(cid):
                    send(batch)
            else:
                todo -= 1
        todo -= sum(cid not in sent for cid in scan.ids if cid not in read.notes)
        for batch in batches.flush():
            send(batch)
    return report


def _ahead(
    sink: Sink, scan: VaultScan | LogseqScan, sent: dict[str, tuple[str, int]], workers: int
) -> Ahead | None:
    """What the parse workers need to make a local store's analyses of the notes
    (``kbgraph.sources.vault.ahead``), or None: another destination, a Logseq graph (read in
    this process), or a sync the ``workers`` would make none for (too few notes never sent, too
    few cores, or no workers), decided before the digests sent before are listed."""
    if not isinstance(sink, LocalSink) or not isinstance(scan, VaultScan):
        return None
    new_notes = sum(nid not in sent for nid in scan.ids)
    if not (parallel(len(scan.ids), workers) and worth(new_notes, workers, default_workers())):
        return None
    carrier = sink.store.carrier
    key, cut = ("", 0) if carrier is None else (carrier.key, carrier.max_chars)
    return Ahead(key, cut, [digest for digest, _ in sent.values()], new_notes)


_InFlight = tuple[Future[DeliveryResult], list[tuple[str, str, int]], list[str]]


class _Sender:
    """Deliveries sent one at a time on a thread of their own while the caller reads on.

    Per delivery: its versions reserved in the manifest (durable) before it is sent, then
    sent, then recorded once acknowledged, as one after another; only the sending itself (the
    store's commit and fsync, a webhook's round trip) runs beside the reading, and at most one
    delivery is in flight: the next is sent only after the last was acknowledged and recorded,
    and after a refusal none is. A run that fails with a delivery in flight waits for it
    and does not record it: the next run sends those notes again (see ``manifest``). A local
    store is handed the analyses the parse workers made under its ``key`` (``made``, by id,
    taken out as they are sent: ``kbgraph.sources.vault.ahead``).
    """

    def __init__(
        self,
        kb: str,
        sink: Sink,
        manifest: Manifest,
        report: SyncReport,
        on_sent: Callable[[int], None],
        key: str | None = None,
        made: dict[str, Made] | None = None,
    ) -> None:
        self.kb, self.sink, self.manifest, self.report = kb, sink, manifest, report
        self.on_sent = on_sent
        self.key, self.made = key, {} if made is None else made  # the analyses made ahead
        self.done = 0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kbgraph-sync-send")
        self._in_flight: _InFlight | None = None

    def send(self, batch: list[str | NoteState]) -> None:
        """Reserve the versions of ``batch`` and send it once the last delivery is recorded."""
        kb = self.kb
        first = self.manifest.reserve(self.sink.dest, kb, len(batch))
        events: list[Event] = []
        upserted: list[tuple[str, str, int]] = []
        deleted: list[str] = []
        ahead: list[MadeAhead | None] = []
        for offset, item in enumerate(batch):
            version = first + offset
            if isinstance(item, str):
                events.append(delete_event(kb, item, version))
                deleted.append(item)
                ahead.append(None)
            else:
                events.append(upsert_event(kb, item, version))
                upserted.append((item.id, item.digest, version))
                made = self.made.pop(item.id, None)
                key = self.key
                ahead.append(None if made is None or key is None else MadeAhead(key, *made))
        self.wait()
        sink = self.sink
        if isinstance(sink, LocalSink) and any(ahead):
            future = self._thread.submit(sink.send, kb, events, ahead)
        else:
            future = self._thread.submit(sink.send, kb, events)
        self._in_flight = (future, upserted, deleted)

    def wait(self) -> None:
        """Wait for the delivery in flight, if any, and record it (raises its refusal)."""
        if self._in_flight is None:
            return
        future, upserted, deleted = self._in_flight
        self._in_flight = None
        result = future.result()
        self.manifest.record(self.sink.dest, self.kb, upserted, deleted, result.seq)
        report = self.report
        report.upserted += len(upserted)
        report.deleted += len(deleted)
        report.results.append((result.applied, result.duplicates, result.stale))
        self.done += len(upserted) + len(deleted)
        self.on_sent(self.done)

    def __enter__(self) -> _Sender:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None:
                self.wait()
        finally:
            self._thread.shutdown(wait=True)


class _Batcher:
    """Deliveries of at most ``BATCH_EVENTS`` events and about ``BATCH_BYTES`` bytes, cut as
    the items come: a delivery is full when the next item would break a bound."""

    def __init__(self) -> None:
        self.current: list[str | NoteState] = []
        self.size = 0

    def add(self, item: str | NoteState) -> list[list[str | NoteState]]:
        """The deliveries ``item`` completes (none or one)."""
        weight = 200 if isinstance(item, str) else 400 + 2 * len(item.data.text)
        full: list[list[str | NoteState]] = []
        if self.current and (len(self.current) >= BATCH_EVENTS or self.size + weight > BATCH_BYTES):
            full.append(self.current)
            self.current, self.size = [], 0
        self.current.append(item)
        self.size += weight
        return full

    def flush(self) -> list[list[str | NoteState]]:
        """The last delivery, if any."""
        full, self.current, self.size = [self.current] if self.current else [], [], 0
        return full


def upsert_event(kb: str, note: NoteState, version: int) -> ConceptUpserted:
    return ConceptUpserted(
        specversion="1.0",
        id=event_id(kb, note.path, version, note.digest),
        source=SOURCE,
        subject=note.id,
        data=msgspec.structs.replace(note.data, version=version),
    )


def delete_event(kb: str, concept_id: str, version: int) -> ConceptDeleted:
    return ConceptDeleted(
        specversion="1.0",
        id=event_id(kb, concept_id, version, "deleted"),
        source=SOURCE,
        subject=concept_id,
        data=DeleteData(version=version),
    )


def watch(
    root: Path,
    run: Callable[[], object],
    on_error: Callable[[Exception], None],
    stop_event: threading.Event | None = None,
) -> None:
    """Run ``run`` after every burst of changes under ``root`` until ``stop_event`` is set.

    watchfiles groups a burst (an editor's temp file + rename, several writes) into one
    batch: it waits until nothing changed for ``WATCH_STEP_MS``, at most ``WATCH_DEBOUNCE_MS``.
    Every run re-reads the vault, so a half-written note read now is sent again once its last
    write lands. An error is reported and watching goes on, an error of the watcher itself too
    (it cannot name a file whose name is not UTF-8): then it starts again after one run.
    The first (possibly empty) batch of a new watcher runs too: a note written after the
    caller's last run and before the watcher was armed is sent then, not lost until the next
    change.
    """
    import watchfiles

    resolved = Path(os.path.realpath(root))

    def relevant(_change: watchfiles.Change, path: str) -> bool:
        # the folder resolved, not the file: a note may be a symlink (even a loop), which the
        # reader judges; Path.resolve() raises on a loop
        where = Path(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        try:
            relative = where.relative_to(resolved).as_posix()
        except ValueError:
            return False
        return not is_ignored(relative)

    def run_reporting() -> None:
        try:
            run()
        except Exception as exc:
            on_error(exc)

    while stop_event is None or not stop_event.is_set():
        armed = False
        try:
            for changes in watchfiles.watch(
                root,
                watch_filter=relevant,
                debounce=WATCH_DEBOUNCE_MS,
                step=WATCH_STEP_MS,
                stop_event=stop_event,
                rust_timeout=500,
                yield_on_timeout=True,
                raise_interrupt=False,
            ):
                if changes or not armed:  # the first yield: a change made before it was armed
                    run_reporting()
                armed = True
            return
        except RuntimeError as exc:  # watchfiles' Rust side, e.g. a name that is not UTF-8
            on_error(exc)
            time.sleep(WATCH_STEP_MS / 1000)
            run_reporting()  # the changes of the lost batch: a run reads the whole vault
