"""Checkpoints: every KB's projection and search index in one file of flat arrays, tagged with
the log position it reflects, so that a restart maps the file and replays only the log after
it instead of rebuilding from the store (17-33 s and 1.6-2.5 GB at a million concepts).

File: ``ckpt-<gid>.kbg`` in the checkpoint folder: a magic line, the header's length (8 bytes,
little-endian), the header (JSON: format, the store's id, the ``gid``, the log record at that
``gid``, the CRC-32 and length of the payload, and per KB its scalars and the dtype, shape and
offset of each array), then the payload, every array aligned to 64 bytes. A KB that keeps
mentions carries them (``mentions.*``: each name occurrence's source, first and end token and
key's number, the keys, the plain edges) so that a restart restores them instead of scanning
every text (format 2; a format 1 file, which has none, loads with its mentions built from
the texts), and its name trie (``trie.*``: ``kbgraph.search.nametrie.NameTrie.saved``) so
that the first text change after a restart walks it instead of building it from every name
(format 3; a format 2 file, which has none, builds it on first use). A file is written
under a temporary name, fsynced, renamed and its folder fsynced, so a crash leaves either the
whole file or none under the final name.

Never trusted: a file is used only when its header parses, its format is this one, it was
made from this very store (``store_id``), its ``gid`` is not beyond the store's log, the log
still holds its ``gid`` record with the same KB, ``seq`` and event (a store restored from a backup
and written again diverges there) and no record before it was cut away that it lacks, and the
payload's CRC-32 matches. Anything else is logged and skipped, falling back to an older file
or to a build from the store.

Loading maps the file copy-on-write: the arrays the follower patches in place (adjacency, ids'
bytes, alive flags) become private pages only where they change; texts are read lazily
(``kbgraph.store.columns.StringColumn``).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec
import numpy as np

from kbgraph.projection.kb import KBProjection
from kbgraph.projection.links import Links
from kbgraph.projection.mentions import Saved
from kbgraph.projection.nodes import Nodes
from kbgraph.search import SearchIndex
from kbgraph.search.nametrie import NameTrie
from kbgraph.store.columns import (
    KeyIndex,
    StringColumn,
    decode_strings,
    encode_strings,
    key_hashes,
)

log = logging.getLogger(__name__)

MAGIC: Final = b"kbgraph checkpoint\n"
FORMAT: Final = 3  # 2: the mention occurrences; 3: the name trie
READS: Final = (1, 2, 3)  # 1: no mention state (built from the texts on attach); 2: no trie
ALIGN: Final = 64
KEEP: Final = 2  # checkpoint files kept (the newest and one before it)


class ArrayEntry(msgspec.Struct, array_like=True):
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the payload's start


class KBEntry(msgspec.Struct):
    name: str
    seq: int
    node_cap: int
    classes: list[tuple[str, str]]
    index_meta: dict[str, list[tuple[int, int]]]
    arrays: list[ArrayEntry] = []
    vector_model: str = ""  # the embedding model of the ``vec.*`` arrays ("" = none)
    vector_dim: int = 0
    mentions: bool = False  # the ``mentions.*`` arrays hold its occurrences (it kept mentions)
    name_trie: bool = False  # the ``trie.*`` arrays hold its search index's name trie


class LogMark(msgspec.Struct, array_like=True):
    """The log record at the checkpoint's ``gid``: what the store must still hold there."""

    kb: str
    seq: int
    digest: str  # of the record's event


class Header(msgspec.Struct):
    format: int
    store_id: str
    gid: int
    mark: LogMark | None
    payload_bytes: int
    crc32: int
    kbs: list[KBEntry]


@dataclass(frozen=True, slots=True)
class Loaded:
    gid: int
    kbs: dict[str, KBProjection]
    path: Path


class Unusable(Exception):
    """A checkpoint file that must not be trusted; the message says why."""


# --- a KB as arrays ----------------------------------------------------------------------


def _kb_arrays(kb: KBProjection) -> tuple[KBEntry, dict[str, np.ndarray]]:
    cap = kb.nodes.cap
    arrays = {**kb.nodes.arrays(), **kb.links.arrays(cap)}
    index_keys, index_arrays = kb.index.arrays()
    name_lengths = index_keys.pop("name_lengths")
    for part, values in index_keys.items():
        blob, off = encode_strings(values)
        arrays[f"index.{part}.keys.blob"], arrays[f"index.{part}.keys.off"] = blob, off
        hashes, order = key_hashes(values)
        arrays[f"index.{part}.keys.hash"], arrays[f"index.{part}.keys.order"] = hashes, order
    arrays.update({f"index.{name}": a for name, a in index_arrays.items()})
    entry = KBEntry(
        name=kb.name,
        seq=kb.seq,
        node_cap=cap,
        classes=list(kb.nodes.classes),
        index_meta={"name_lengths": name_lengths},
    )
    if kb.mentions is not None:
        arrays.update(_mention_arrays(kb.mentions.saved()))
        entry.mentions = True
        arrays.update(_trie_arrays(kb.index.name_trie()))  # built here if not yet used
        entry.name_trie = True
    if kb.vectors is not None and kb.vectors.cap:
        arrays.update({f"vec.{name}": a for name, a in kb.vectors.arrays().items()})
        entry.vector_model, entry.vector_dim = kb.vectors.model, kb.vectors.dim
    return entry, arrays


def _kb_from_arrays(entry: KBEntry, arrays: Mapping[str, np.ndarray]) -> KBProjection:
    kb = KBProjection(entry.name)
    kb.seq = entry.seq
    kb.nodes = Nodes.from_arrays(entry.node_cap, entry.classes, arrays)
    kb.links = Links.from_arrays(arrays)
    meta: dict[str, list[tuple[int, int]]] = {"name_lengths": entry.index_meta["name_lengths"]}
    index_arrays = {}
    for name, a in arrays.items():
        if name.startswith(("vec.", "mentions.")):
            continue
        if name.startswith("index.") and ".keys." not in name:
            index_arrays[name[len("index.") :]] = a
    vocabularies = {}
    for part in ("terms", "names", "tags"):
        keys = StringColumn(arrays[f"index.{part}.keys.blob"], arrays[f"index.{part}.keys.off"])
        found = KeyIndex(
            keys, arrays[f"index.{part}.keys.hash"], arrays[f"index.{part}.keys.order"]
        )
        vocabularies[part] = (keys, found)
    kb.index = SearchIndex.from_arrays(meta, vocabularies, index_arrays)
    if entry.vector_model:
        saved = {name[len("vec.") :]: a for name, a in arrays.items() if name.startswith("vec.")}
        kb.saved_vectors = (entry.vector_model, entry.vector_dim, saved)
    if entry.mentions:
        kb.saved_mentions = _saved_mentions(arrays)
    if entry.name_trie:
        kb.index.adopt_trie(_saved_trie(arrays))
    return kb


def _mention_arrays(saved: Saved) -> dict[str, np.ndarray]:
    blob, off = encode_strings(list(saved.keys))
    arrays = {f"mentions.{name}": a for name, a in saved._asdict().items() if name != "keys"}
    return {**arrays, "mentions.keys.blob": blob, "mentions.keys.off": off}


def _saved_mentions(arrays: Mapping[str, np.ndarray]) -> Saved:
    keys = StringColumn(arrays["mentions.keys.blob"], arrays["mentions.keys.off"])
    parts = {f: arrays[f"mentions.{f}"] for f in Saved._fields if f != "keys"}
    return Saved(keys=keys, **parts)


def _trie_arrays(trie: NameTrie) -> dict[str, np.ndarray]:
    node_keys, shared_keys, arrays = trie.saved()
    out = {f"trie.{name}": a for name, a in arrays.items()}
    for part, keys in (("node_keys", node_keys), ("shared_keys", shared_keys)):
        out[f"trie.{part}.blob"], out[f"trie.{part}.off"] = encode_strings(keys)
    return out


def _saved_trie(arrays: Mapping[str, np.ndarray]) -> NameTrie:
    """The trie over the mapped arrays, its nodes' keys read lazily."""
    parts = {name[len("trie.") :]: a for name, a in arrays.items() if name.startswith("trie.")}
    node_keys = StringColumn(parts["node_keys.blob"], parts["node_keys.off"])
    shared_keys = decode_strings(parts["shared_keys.blob"], parts["shared_keys.off"])
    return NameTrie.from_arrays(parts, node_keys, shared_keys)


# --- files -------------------------------------------------------------------------------


def file_name(gid: int) -> str:
    return f"ckpt-{gid:020d}.kbg"


def _padded(size: int) -> int:
    return -size % ALIGN


def write(
    folder: Path, store_id: str, gid: int, mark: LogMark | None, kbs: Mapping[str, KBProjection]
) -> Path:
    """Write every KB as one checkpoint at ``gid`` (call with the KBs not changing: from the
    follower thread, between batches); returns its path. Older files beyond ``KEEP`` go."""
    folder.mkdir(parents=True, exist_ok=True)
    entries: list[KBEntry] = []
    chunks: list[np.ndarray] = []
    offset = 0
    crc = 0
    for name in sorted(kbs):
        entry, arrays = _kb_arrays(kbs[name])
        for array_name, array in arrays.items():
            data = np.ascontiguousarray(array)
            entry.arrays.append(ArrayEntry(array_name, data.dtype.str, data.shape, offset))
            data = data.reshape(-1).view(np.uint8)
            chunks.append(data)
            crc = zlib.crc32(data.data, crc)
            pad = _padded(data.nbytes)
            crc = zlib.crc32(bytes(pad), crc)
            offset += data.nbytes + pad
        entries.append(entry)
    header = msgspec.json.encode(Header(FORMAT, store_id, gid, mark, offset, crc, entries))
    head = MAGIC + len(header).to_bytes(8, "little") + header
    final = folder / file_name(gid)
    temporary = folder / f".{final.name}.{os.getpid()}.tmp"
    with open(temporary, "wb") as f:
        f.write(head + bytes(_padded(len(head))))
        for data in chunks:
            f.write(data.data)
            f.write(bytes(_padded(data.nbytes)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, final)
    _fsync_folder(folder)
    for old in sorted(folder.glob("ckpt-*.kbg"))[:-KEEP]:
        with contextlib.suppress(OSError):
            old.unlink()
    return final


def remove_partial(folder: Path, pid: int) -> None:
    """Remove what a writer with this pid left half-written (it was killed)."""
    for partial in folder.glob(f".ckpt-*.kbg.{pid}.tmp"):
        with contextlib.suppress(OSError):
            partial.unlink()


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def candidates(folder: Path) -> list[Path]:
    """Checkpoint files, newest first."""
    return sorted(folder.glob("ckpt-*.kbg"), reverse=True) if folder.is_dir() else []


def read_header(path: Path) -> tuple[Header, int]:
    """The header and where the payload starts; ``Unusable`` when it does not parse."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise Unusable("not a checkpoint file (magic)")
        size = int.from_bytes(f.read(8), "little")
        raw = f.read(size)
    if len(raw) != size:
        raise Unusable("header cut short")
    try:
        header = msgspec.json.decode(raw, type=Header)
    except msgspec.DecodeError as exc:
        raise Unusable(f"header: {exc}") from None
    if header.format not in READS:
        raise Unusable(f"format {header.format}, this kbgraph reads {READS}")
    start = len(MAGIC) + 8 + size
    return header, start + _padded(start)


def _check_payload(path: Path, header: Header, start: int) -> None:
    size = path.stat().st_size
    if size != start + header.payload_bytes:
        raise Unusable(f"{size} bytes, the header promises {start + header.payload_bytes}")
    crc = 0
    with open(path, "rb") as f:
        f.seek(start)
        for block in iter(lambda: f.read(8 << 20), b""):
            crc = zlib.crc32(block, crc)
    if crc != header.crc32:
        raise Unusable("payload CRC-32 mismatch")


def load(path: Path, header: Header, start: int) -> Loaded:
    """Every KB of a checked checkpoint, its arrays mapped copy-on-write."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    kbs = {}
    for entry in header.kbs:
        arrays = {}
        for a in entry.arrays:
            dtype = np.dtype(a.dtype)
            count = int(np.prod(a.shape, dtype=np.int64))
            flat = np.frombuffer(mapped, dtype, count, start + a.offset)
            arrays[a.name] = flat.reshape(a.shape)
        kbs[entry.name] = _kb_from_arrays(entry, arrays)
    return Loaded(header.gid, kbs, path)


def newest_usable(folder: Path, accept: Callable[[Header], str | None]) -> Loaded | None:
    """The newest checkpoint that ``accept`` (the store's checks: None = fine, else why not)
    and the payload's CRC agree with, loaded; None when there is none."""
    for path in candidates(folder):
        try:
            header, start = read_header(path)
            problem = accept(header)
            if problem is not None:
                raise Unusable(problem)
            _check_payload(path, header, start)
            return load(path, header, start)
        except (Unusable, OSError, ValueError, KeyError) as exc:
            log.warning("checkpoint %s not used: %s", path.name, exc)
    return None


def iter_headers(folder: Path) -> Iterator[tuple[Path, Header]]:
    for path in candidates(folder):
        with contextlib.suppress(Unusable, OSError):
            yield path, read_header(path)[0]
