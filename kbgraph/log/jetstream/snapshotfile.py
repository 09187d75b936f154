"""A snapshot's bytes (``kbgraph.log.jetstream.snapshots`` puts and fetches them): a node's
store and the projection checkpoint it can follow from, as one tar compressed with zstd, and
their unpacking as they arrive.

Packed (``take``): SQLite's online backup of the store into a temp file (one consistent
transaction), and of the checkpoint folder only the newest checkpoint that copy's log can be
followed from (a newer one, written after the copy, and older ones are of no use to it), in a
tar compressed with zstd level 1, which packs and unpacks ~6x faster than gzip level 1 at the
same size (docs/dependencies.md); its headers say so (``ENCODING``, under the MAC). A snapshot
without that header, from an older node, is a gzip'd tar and still restores.

Unpacked (``Unpacker``) while it is fetched, in a thread, into a staging folder beside the
store: nothing is moved into place before the caller has checked the whole object (its
digest, MAC and rules) and called ``install``; a refusal removes the staging folder. Only a
regular file named ``kb.db`` or ``checkpoints/ckpt-<n>.kbg`` is written, under a name of ours,
and the bytes written stop at the size the snapshot declares (``UNPACKED``, or without it the
disk's free space less ``FREE_MARGIN_BYTES``): bytes from someone without the cluster's secret
are parsed (by zstd or zlib and tarfile) before the MAC says so, but never fill the disk nor
reach the store.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import queue
import re
import shutil
import sqlite3
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import IO, Final, cast

import zstandard

from kbgraph.projection import checkpoint
from kbgraph.store import logcut, positions

ENCODING_ZSTD: Final = "zstd"  # the value of wire.ENCODING on a snapshot packed here
UNPACKED: Final = "Kbgraph-Unpacked-Bytes"  # the header declaring the tar's unpacked size
ZSTD_LEVEL: Final = 1
FREE_MARGIN_BYTES: Final = 256 * 2**20  # left free when a snapshot declares no size
COPY_BYTES: Final = 2**20
_CHECKPOINT: Final = re.compile(r"checkpoints/(ckpt-[0-9]+\.kbg)")


class SnapshotRefused(RuntimeError):
    """The newest snapshot cannot be restored here (its MAC, its rules, its digest, its
    contents)."""


class Packed:
    """A snapshot's bytes, the stream position its store is at, and what it unpacks to."""

    def __init__(self, position: int, data: bytes, unpacked: int) -> None:
        self.position, self.data, self.unpacked = position, data, unpacked


def take(store: Path, checkpoints: Path | None, stream: str) -> Packed:
    """A consistent copy of the store and the checkpoint it can follow from, packed."""
    with tempfile.TemporaryDirectory(dir=store.parent, prefix=".snapshot-") as folder:
        copy = Path(folder) / "kb.db"
        source = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
        target = sqlite3.connect(copy)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode = DELETE")  # one file, no WAL beside it
            position = positions.position(target, stream)
            ship = _followable(target, checkpoints)
        finally:
            source.close()
            target.close()
        data = io.BytesIO()
        unpacked = 0
        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        with (
            compressor.stream_writer(data, closefd=False) as packed,
            tarfile.open(fileobj=packed, mode="w|") as tar,
        ):
            tar.add(copy, arcname="kb.db")
            unpacked += copy.stat().st_size
            if ship is not None:
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    size = ship.stat().st_size
                    tar.add(ship, arcname=f"checkpoints/{ship.name}")
                    unpacked += size
    return Packed(position, data.getvalue(), unpacked)


def _followable(conn: sqlite3.Connection, folder: Path | None) -> Path | None:
    """The newest checkpoint in ``folder`` whose follow-up the copy's log holds, if any."""
    for path in checkpoint.candidates(folder) if folder is not None else []:
        try:
            header, _ = checkpoint.read_header(path)
        except (checkpoint.Unusable, OSError):
            continue
        mark = header.mark
        at = None if mark is None else (mark.kb, mark.seq, mark.digest)
        if logcut.follow_problem(conn, header.gid, at) is None:
            return path
    return None


class _Chunks(io.RawIOBase):
    """The fetched chunks as one readable stream (``None`` in the queue: the end)."""

    def __init__(self, chunks: queue.SimpleQueue[bytes | None]) -> None:
        self._chunks = chunks
        self._left = memoryview(b"")
        self.ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._left and not self.ended:
            chunk = self._chunks.get()
            if chunk is None:
                self.ended = True
            else:
                self._left = memoryview(chunk)
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


class Unpacker:
    """Unpacks a snapshot fed chunk by chunk, in order (``write``), into a staging folder
    beside ``store``, in its own thread; ``finish`` waits for it (and raises its refusal),
    ``install`` moves the files into place, ``discard`` removes what is left."""

    def __init__(self, store: Path, encoding: str, declared: str | None) -> None:
        if encoding not in ("", ENCODING_ZSTD):
            raise SnapshotRefused(f"snapshot packed as {encoding!r}: this node reads zstd, gzip")
        store.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(store.parent).free - FREE_MARGIN_BYTES
        if declared is not None:
            if not declared.isdigit():
                raise SnapshotRefused(f"snapshot declares {declared!r} bytes unpacked")
            if int(declared) > free:
                raise SnapshotRefused(
                    f"snapshot unpacks to {declared} bytes, the disk of {store.parent} has"
                    f" {max(0, free)} free (past a margin of {FREE_MARGIN_BYTES})"
                )
        self.budget = int(declared) if declared is not None else max(0, free)
        self.staging = Path(tempfile.mkdtemp(dir=store.parent, prefix=".restore-"))
        self.files: dict[str, Path] = {}
        self._zstd = encoding == ENCODING_ZSTD
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kbgraph-unpack", daemon=True)
        self._thread.start()

    def write(self, chunk: bytes) -> int:
        self._chunks.put(bytes(chunk))
        return len(chunk)

    def finish(self) -> None:
        """Wait for the unpacking of everything written; raises ``SnapshotRefused`` when the
        snapshot is not a packed store."""
        self._chunks.put(None)
        self._thread.join()
        if self._error is not None:
            raise SnapshotRefused(f"snapshot unreadable: {self._error}") from None
        if "kb.db" not in self.files:
            raise SnapshotRefused("snapshot holds no store")

    def install(self, store: Path, checkpoints: Path | None) -> None:
        """The unpacked store in place of ``store`` (and its WAL), its checkpoint in place of
        the folder's (after ``finish``)."""
        for suffix in ("-wal", "-shm", ""):
            Path(f"{store}{suffix}").unlink(missing_ok=True)
        self.files.pop("kb.db").replace(store)
        if checkpoints is not None:
            if checkpoints.is_dir():
                for old in checkpoints.glob("ckpt-*.kbg"):
                    old.unlink()
            checkpoints.mkdir(parents=True, exist_ok=True)
            for path in self.files.values():
                path.replace(checkpoints / path.name)

    def discard(self) -> None:
        if self._thread.is_alive():  # stopped half-way (a refusal, a cancelled fetch)
            self._chunks.put(None)
            self._thread.join()
        shutil.rmtree(self.staging, ignore_errors=True)

    def _run(self) -> None:
        chunks = _Chunks(self._chunks)
        try:
            self._unpack(chunks)
        except (SnapshotRefused, OSError, EOFError, tarfile.TarError, zstandard.ZstdError) as exc:
            self._error = exc
        finally:  # what follows the tar's end (or a refusal) is taken and not read
            while not chunks.ended and self._chunks.get() is not None:
                pass

    def _unpack(self, chunks: _Chunks) -> None:
        raw = io.BufferedReader(chunks, COPY_BYTES)
        source = cast(  # both readers have a file's API
            IO[bytes],
            zstandard.ZstdDecompressor().stream_reader(raw)
            if self._zstd
            else gzip.GzipFile(fileobj=raw, mode="rb"),
        )
        left = self.budget
        with source, tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                match = _CHECKPOINT.fullmatch(member.name)
                if not member.isfile() or not (member.name == "kb.db" or match):
                    raise SnapshotRefused(f"an unexpected entry {member.name!r}")
                if member.name in self.files:
                    raise SnapshotRefused(f"{member.name!r} twice")
                if member.size > left:
                    raise SnapshotRefused(f"{member.name!r} unpacks past the declared size")
                left -= member.size
                target = self.staging / (match[1] if match else "kb.db")
                body = tar.extractfile(member)
                assert body is not None  # a regular file
                with open(target, "wb") as out:
                    shutil.copyfileobj(body, out, COPY_BYTES)
                self.files[member.name] = target
