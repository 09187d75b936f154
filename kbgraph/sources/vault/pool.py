"""Reading a vault's notes on every core, the results in the order asked for (issue 26).

Reading a note (``notes.read_chunk``: read, hash, parse, resolve its links, hash its state) is
a pure function of its file, the vault's ids and files and the parse cache, so it runs on a
pool of spawned processes, each given those once when it starts: ``PARALLEL_CHUNK`` notes a
task, results yielded in job order as they come, so the caller sends the first notes while
the rest are still being read. Fewer than ``PARALLEL_MIN_NOTES`` notes are read in the calling
process (a worker costs its start). Spawned, not forked: the caller may hold threads (a local
store's writer).

The context (every id, file and parse-cache entry: megabytes for a large vault) reaches the
workers through a private temporary file, msgpack, read by each as it starts; as a pickled
argument of the pool it went down each worker's start-up pipe, and the caller's write waited
for that worker's interpreter to start and import its modules, one worker after the other.

On a large import the workers also make each note's analysis for the local store
(``kbgraph.sources.vault.ahead``), handed back with its note.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Final

import msgspec

from kbgraph.events import Status, UpsertData
from kbgraph.sources.vault.ahead import Ahead, Made, Maker
from kbgraph.sources.vault.notes import NoteFields, NoteRead, NoteState, ReadContext, read_chunk
from kbgraph.sources.vault.resolve import Resolver

PARALLEL_MIN_NOTES: Final = 256  # fewer notes are read here
PARALLEL_CHUNK: Final = 128  # notes read per task (in passes: see ``read_chunk``)

# root, real root, files, cache, allow_hardlinks, the bound of a note's bytes
Context = tuple[Path, str, list[str], dict[str, NoteFields], bool, int]
Job = tuple[int, str, str]  # (index in path order, id, path)

_context: ReadContext | None = None  # a worker's, set once when it starts
_maker: Maker | None = None  # a worker's, when it makes the store's analyses


class _Shipped(msgspec.Struct, array_like=True):
    """A ``Context`` and the ids, as the workers read them from the caller's temporary file."""

    root: str
    real_root: str
    files: list[str]
    cache: dict[str, NoteFields]
    allow_hardlinks: bool
    max_bytes: int
    ids: list[str]
    ahead: Ahead | None


def _make(context: Context, ids: list[str]) -> ReadContext:
    root, real_root, files, cache, allow_hardlinks, max_bytes = context
    return ReadContext(root, real_root, Resolver(ids, files), cache, allow_hardlinks, max_bytes)


def _start(shipped: str) -> None:
    global _context, _maker
    with open(shipped, "rb") as file:
        got = msgspec.msgpack.decode(file.read(), type=_Shipped)
    context = (
        Path(got.root),
        got.real_root,
        got.files,
        got.cache,
        got.allow_hardlinks,
        got.max_bytes,
    )
    _context = _make(context, got.ids)
    _maker = None if got.ahead is None else Maker(got.ahead)


class _Row(msgspec.Struct, array_like=True):
    """A ``NoteRead`` on its way back from a worker: msgpack, not pickle (a fraction of the
    cost); the state's data as plain values, made an ``UpsertData`` again as it was made."""

    index: int
    id: str
    path: str
    skipped: str
    unreadable: bool
    key: str
    fields: bytes
    data: tuple[str, list[str], str, Status, list[str], str, list[str]] | None
    digest: str
    unresolved: int
    warnings: list[str]
    attachments: int
    made: Made | None  # the store's analysis made ahead (``kbgraph.sources.vault.ahead``)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[_Row])


def _row(read: NoteRead, made: Made | None) -> _Row:
    state = read.state
    data = None if state is None else state.data
    return _Row(
        read.index, read.id, read.path, read.skipped, read.unreadable, read.key, read.fields,
        None if data is None
        else (data.title, data.aliases, data.type, data.status, data.tags, data.text, data.links),
        "" if state is None else state.digest,
        0 if state is None else state.unresolved,
        read.warnings, read.attachments, made,
    )  # fmt: skip


def _read(row: _Row) -> NoteRead:
    state = None
    if row.data is not None:
        title, aliases, kind, status, tags, text, links = row.data
        data = UpsertData(0, title, aliases, kind, status, tags, text, links)
        state = NoteState(row.id, row.path, data, row.digest, row.unresolved)
    return NoteRead(
        row.index, row.id, row.path, row.skipped, row.unreadable, row.key, row.fields, state,
        row.warnings, row.attachments,
    )  # fmt: skip


def _read_chunk(jobs: list[Job]) -> bytes:
    assert _context is not None
    reads = read_chunk(_context, jobs)
    made: list[Made | None] = [None] * len(reads)
    if _maker is not None:
        read = [i for i, r in enumerate(reads) if r.state is not None]
        states = [state for r in reads if (state := r.state) is not None]
        for i, one in zip(read, _maker.made(states), strict=True):
            made[i] = one
    return _encoder.encode([_row(r, m) for r, m in zip(reads, made, strict=True)])


def default_workers() -> int:
    """One per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def parallel(notes: int, workers: int) -> bool:
    """Whether ``notes`` notes are read on ``workers`` processes (else here, in one)."""
    return workers >= 2 and notes >= PARALLEL_MIN_NOTES


def read_all(
    context: Context,
    ids: list[str],
    jobs: list[Job],
    workers: int | None = None,
    ahead: Ahead | None = None,
) -> Iterator[tuple[NoteRead, Made | None]]:
    """``read_chunk`` of every job, in the order of ``jobs``: on ``workers`` processes (default
    one per core) when there are at least ``PARALLEL_MIN_NOTES`` jobs, else here; each with
    the store's analysis ``ahead`` asks for, made by the workers when it is worth their model
    (``Ahead.worth``), else None."""
    if workers is None:
        workers = default_workers()
    chunks = [jobs[i : i + PARALLEL_CHUNK] for i in range(0, len(jobs), PARALLEL_CHUNK)]
    if not parallel(len(jobs), workers):
        here = _make(context, ids)
        for chunk in chunks:
            yield from ((read, None) for read in read_chunk(here, chunk))
        return
    root, real_root, files, cache, allow_hardlinks, max_bytes = context
    if ahead is not None and not ahead.worth(workers, default_workers()):
        ahead = None
    shipped = _Shipped(str(root), real_root, files, cache, allow_hardlinks, max_bytes, ids, ahead)
    spawn = multiprocessing.get_context("spawn")
    # only this user may read it (mkstemp's 0600): it holds the vault's names and parse cache
    with tempfile.NamedTemporaryFile(prefix="kbgraph-vault-", suffix=".msgpack") as file:
        file.write(_encoder.encode(shipped))
        file.flush()
        with ProcessPoolExecutor(workers, spawn, _start, (file.name,)) as pool:
            for encoded in pool.map(_read_chunk, chunks):
                yield from ((_read(row), row.made) for row in _decoder.decode(encoded))
