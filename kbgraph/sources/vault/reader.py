"""A folder of markdown notes read into concept states (docs/sources.md).

- A note is a ``.md`` file; its id is its path relative to the folder without ``.md``, in NFC
  (so an NFD file name from macOS gives the same id). A path that breaks the id rules, or
  whose id another file already took (NFC and NFD twins), is reported and skipped.
- Skipped without a word: dot files and dot folders (``.obsidian/``, ``.trash/``, ``.git/``,
  ``.kbgraph/``, editors' ``.#x.md`` and ``.x.md.swp``), and files not ending in ``.md``
  (``x.md~`` backups included), which are attachments for link resolution.
- title: front-matter ``title``, else the file name; ``aliases`` (``alias``), ``tags``
  (``tag``; a list, or a string split on commas and spaces; a leading ``#`` dropped) plus the
  inline ``#tags`` outside code; ``type``; ``status`` (one of the five of docs/events.md,
  else reported and left empty); text: the body without the front matter.
- A file that cannot be read (vanished, no permission, not UTF-8) is reported as unreadable:
  sync leaves what it sent for it alone, it is not a deletion.
- Only what lies inside the vault is read (issue 28): a symlinked note whose real path leaves
  the vault, a symlinked folder (never followed), anything but a regular file (a named pipe,
  a device), a note over the size bound (checked with ``fstat`` before a byte is read, and the
  read stops past it) and a file or folder whose name is not valid UTF-8 are skipped, each
  with the reason in the report. Such a note previously sent is deleted, as a removed one.
- A regular file with more than one name (a hard link) is skipped the same way unless
  ``allow_hardlinks`` (``--allow-hardlinks``) says the vault's hard links are meant (issue 34):
  its other name may be a file outside the vault, which no path check can see.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import os
import stat
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeGuard, get_args

import msgspec

from kbgraph.events import MAX_ALIAS_CHARS, MAX_ALIASES, MAX_TEXT_BYTES, Status, UpsertData
from kbgraph.names import concept_id_problem
from kbgraph.sources.vault.markdown import LinkRef, parse
from kbgraph.sources.vault.resolve import Resolver

STATUSES: Final = frozenset(get_args(Status))


def _is_status(value: str) -> TypeGuard[Status]:
    """Whether ``value`` is one of the statuses a concept may have."""
    return value in STATUSES


PROGRESS_EVERY: Final = 250
PARSER_VERSION: Final = b"3\0"  # part of the parse cache key: raise it when parsing changes
# a note's file may be larger than its text (CRLF line ends, a BOM, front matter), not more so
MAX_NOTE_BYTES: Final = 2 * MAX_TEXT_BYTES + 4096
_hash_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class NoteState:
    """One note as a concept: its data without a version, and the hash of that data."""

    id: str
    path: str  # relative to the vault, as on disk
    data: UpsertData  # version 0; the sender sets the real one
    digest: str
    unresolved: int


@dataclass(slots=True)
class VaultRead:
    notes: dict[str, NoteState] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why), not sent
    unreadable: set[str] = field(default_factory=set)  # ids whose file could not be read
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (path, what), still sent
    attachments: int = 0
    content_keys: set[str] = field(default_factory=set)  # the parse cache keys of this read
    resolved_by: dict[str, int] = field(default_factory=dict)  # a Logseq graph's: rule -> refs

    @property
    def links(self) -> int:
        """Pairs of notes linked either way: a note's links to itself or to no note of the
        vault not counted, a pair linked both ways counted once. The one meaning of a link
        count, as ``/status`` and ``GET /v1/kbs`` give it for a KB of these notes."""
        notes = self.notes
        pairs = {
            (a, b) if a < b else (b, a)
            for a, note in notes.items()
            for b in note.data.links
            if b != a and b in notes
        }
        return len(pairs)

    @property
    def unresolved(self) -> int:
        return sum(note.unresolved for note in self.notes.values())


def is_ignored(relative: str) -> bool:
    """Dot files and anything under a dot folder (``.obsidian``, ``.trash``, ``.kbgraph``)."""
    return any(part.startswith(".") for part in relative.split("/"))


def _shown(relative: str) -> str:
    """A path for the report, its bytes that are not UTF-8 shown as ``\\xNN``."""
    return os.fsencode(relative).decode("utf-8", "backslashreplace")


def _valid_name(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.walk's surrogate escapes of bytes that are not UTF-8
        return False
    return True


def walk(root: Path, skipped: list[tuple[str, str]] | None = None) -> tuple[list[str], list[str]]:
    """(markdown paths, other file paths) under ``root``, relative, ``/``-separated, sorted.

    Symlinked folders are never entered; names that are not UTF-8 are left out. Both are
    added to ``skipped`` (path, why) when given.
    """
    notes: list[str] = []
    files: list[str] = []
    refused: list[tuple[str, str]] = []
    for folder, dirs, names in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()

        def rel(name: str, base: str = base) -> str:
            return name if base == "." else f"{base}/{name}"

        kept = []
        for d in dirs:
            if d.startswith("."):
                continue
            if not _valid_name(d):
                refused.append((_shown(rel(d)), "folder name is not valid UTF-8"))
            elif os.path.islink(os.path.join(folder, d)):
                refused.append((rel(d), "symlinked folder: not followed"))
            else:
                kept.append(d)
        dirs[:] = sorted(kept)
        for name in names:
            if name.startswith("."):
                continue
            if not _valid_name(name):
                refused.append((_shown(rel(name)), "file name is not valid UTF-8"))
                continue
            (notes if name.endswith(".md") else files).append(rel(name))
    if skipped is not None:
        skipped.extend(sorted(refused))
    return sorted(notes), sorted(files)


# O_NONBLOCK: opening a named pipe must not wait for a writer; O_NOFOLLOW: a symlink is not
# opened (ELOOP), only the real path it was checked to have
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_OPEN_FLAGS: Final = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _NOFOLLOW
_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)


def read_note(
    root: Path, real_root: str, path: str, limit: int, allow_hardlinks: bool = False
) -> bytes | str:
    """The bytes of note ``path`` (found by ``walk``), or why it is not read: a symlink whose
    real path leaves the vault, not a regular file, a hard link (unless ``allow_hardlinks``),
    or over ``limit`` bytes (never read whole). Only a symlinked note has its real path
    resolved and checked; any other is opened folder by folder (``_open_unless_symlink``)."""
    fd = _open_unless_symlink(root, path)
    if fd is None:
        real = os.path.realpath(os.path.join(root, path))
        if os.path.commonpath([real, real_root]) != real_root:
            return "symlink to a file outside the vault: not read"
        fd = os.open(real, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file: not read"
        if info.st_nlink > 1 and not allow_hardlinks:
            return (
                f"hard link ({info.st_nlink} names, one may be outside the vault): not read"
                " (--allow-hardlinks reads it)"
            )
        if info.st_size > limit:
            return f"over {limit} bytes: not read"
        raw = _read_upto(fd, info.st_size, limit)
        if len(raw) > limit:
            return f"over {limit} bytes: not read"
        return raw
    finally:
        os.close(fd)


def _open_unless_symlink(root: Path, path: str) -> int | None:
    """Note ``path`` opened from ``root`` one folder at a time, each with ``O_NOFOLLOW``: a
    folder swapped for a symlink since the walk raises (``ELOOP``, the note is unreadable),
    never followed. None when the note itself is a symlink (or might be: no ``O_NOFOLLOW``)."""
    if not _NOFOLLOW:
        return None
    folder, _, name = path.rpartition("/")
    dir_fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for part in folder.split("/") if folder else ():
            inner = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = inner
        try:
            return os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            raise
    finally:
        os.close(dir_fd)


def _read_upto(fd: int, size: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``fd``, asked for as the file's ``size`` and one more
    byte (a file that grew since is read on): a buffer sized by ``limit`` (2 MiB) cost each
    note far more than its reading."""
    parts: list[bytes] = []
    got, want = 0, size + 1
    while got <= limit:
        part = os.read(fd, min(want, limit + 1 - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
        want = 1 << 16
    return b"".join(parts)


class NoteFields(msgspec.Struct, frozen=True, array_like=True):
    """What one file's content says, before link resolution: cached by the content's hash."""

    title: str  # "" = the file name
    aliases: list[str]
    tags: list[str]
    type: str
    status: Status
    body_start: int
    links: list[LinkRef]
    warnings: list[str]


class NoteRead(msgspec.Struct, frozen=True):
    """What reading one note gave: its concept state, or why it was skipped."""

    index: int  # the note's place in path order (the report keeps that order)
    id: str
    path: str
    skipped: str = ""  # why it was not read ("" = read)
    unreadable: bool = False  # skipped because it could not be read: not a deletion
    key: str = ""  # the parse cache key of its content
    fields: NoteFields | None = None  # parsed here (a cache miss), else None
    state: NoteState | None = None
    warnings: list[str] = []
    attachments: int = 0


@dataclass(frozen=True, slots=True)
class ReadContext:
    """What reading any one note needs: the vault, the resolver of every id, the parse cache."""

    root: Path
    real_root: str
    resolver: Resolver
    cache: dict[str, NoteFields]
    allow_hardlinks: bool = False


def read_chunk(ctx: ReadContext, jobs: list[tuple[int, str, str]]) -> list[NoteRead]:
    """Read each job's note ``(index, id, path)`` (bounded, as ``read_note`` says), parse it
    unless ``ctx.cache`` knows its content, resolve its links and hash its state. A pure
    function of the files and the context: it gives the same in any process. Done in three
    passes over the chunk (read all, parse all, resolve all): a quarter less CPU here than
    note by note, each pass's code and data staying in the CPU's caches."""
    loaded = [_load(ctx, *job) for job in jobs]
    fresh: dict[str, NoteFields] = {}
    for item in loaded:
        if not isinstance(item, NoteRead) and item[4] not in ctx.cache:
            key, source = item[4], item[3]
            if key not in fresh:
                fresh[key] = note_fields(source)
    out: list[NoteRead] = []
    for item in loaded:
        if isinstance(item, NoteRead):
            out.append(item)
            continue
        index, nid, path, source, key = item
        fields = ctx.cache.get(key) or fresh[key]
        warnings = list(fields.warnings)
        state, attachments = _note(nid, path, source, fields, ctx.resolver, warnings)
        new = fresh.get(key)
        out.append(NoteRead(index, nid, path, "", False, key, new, state, warnings, attachments))
    return out


def _load(
    ctx: ReadContext, index: int, nid: str, path: str
) -> NoteRead | tuple[int, str, str, str, str]:
    """The note's (index, id, path, text, cache key), or why it is skipped."""
    try:
        raw = read_note(ctx.root, ctx.real_root, path, MAX_NOTE_BYTES, ctx.allow_hardlinks)
        if isinstance(raw, str):
            return NoteRead(index, nid, path, skipped=raw)
        source = raw.decode("utf-8").removeprefix("\ufeff")
    except (OSError, UnicodeDecodeError) as exc:
        why = f"unreadable: {exc.__class__.__name__}"
        return NoteRead(index, nid, path, skipped=why, unreadable=True)
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    if len(source) > MAX_TEXT_BYTES // 4 and len(source.encode()) > MAX_TEXT_BYTES:
        return NoteRead(index, nid, path, skipped="longer than 1 MiB")
    return index, nid, path, source, hashlib.sha256(PARSER_VERSION + raw).hexdigest()


@dataclass(slots=True)
class VaultScan:
    """A vault walked, its notes not read yet: ``reads`` reads them into ``out``."""

    root: Path
    ids: dict[str, str]  # id -> path, in path order
    files: list[str]  # the other files (attachments), NFC
    out: VaultRead
    allow_hardlinks: bool = False  # read notes with more than one name (see the module)

    @classmethod
    def of(cls, root: Path, allow_hardlinks: bool = False) -> VaultScan:
        """Walk ``root``: the notes' ids (a path breaking the id rules, or an NFC/NFD twin,
        is reported and skipped) and the other files."""
        out = VaultRead()
        paths, files = walk(root, out.skipped)
        ids: dict[str, str] = {}
        for path in paths:
            nid = unicodedata.normalize("NFC", path[:-3])
            problem = concept_id_problem(nid)
            if problem:
                out.skipped.append((path, problem.replace("concept id", "id from path")))
            elif nid in ids:
                out.skipped.append((path, f"same id {nid!r} as {ids[nid]!r} (NFC/NFD twins)"))
            else:
                ids[nid] = path
        files = [unicodedata.normalize("NFC", f) for f in files]
        return cls(root, ids, files, out, allow_hardlinks)

    def reads(
        self,
        cache: dict[str, NoteFields] | None = None,
        progress: Callable[[int, int], None] | None = None,
        workers: int | None = None,
    ) -> Iterator[NoteState]:
        """Read every note (``read_chunk``) in id order, on ``workers`` processes when there
        are many (``kbgraph.sources.vault.pool``), yielding each note's state as it comes; once all
        are read, ``out`` holds the notes, skips and warnings in path order.

        ``cache`` maps a file content's sha256 to its parsed fields: hits skip parsing,
        misses are added (the caller may persist it, see ``Manifest.parse_cache``)."""
        from kbgraph.sources.vault.pool import read_all  # the pool's workers import this module

        order = sorted(self.ids.items())  # the order sync sends in
        index = {path: i for i, path in enumerate(self.ids.values())}
        jobs = [(index[path], nid, path) for nid, path in order]
        real_root = os.path.realpath(self.root)
        context = (self.root, real_root, self.files, cache or {}, self.allow_hardlinks)
        results: list[NoteRead | None] = [None] * len(jobs)
        for done, result in enumerate(read_all(context, list(self.ids), jobs, workers), 1):
            results[result.index] = result
            if progress is not None and (done % PROGRESS_EVERY == 0 or done == len(jobs)):
                progress(done, len(jobs))
            if result.key:
                self.out.content_keys.add(result.key)
            if cache is not None and result.fields is not None:
                cache[result.key] = result.fields
            if result.state is not None:
                yield result.state
        out = self.out
        for note in results:
            assert note is not None
            if note.state is None:
                out.skipped.append((note.path, note.skipped))
                if note.unreadable:
                    out.unreadable.add(note.id)
                continue
            out.warnings.extend((note.path, warning) for warning in note.warnings)
            out.attachments += note.attachments
            out.notes[note.id] = note.state


def read_vault(
    root: Path,
    cache: dict[str, NoteFields] | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
    allow_hardlinks: bool = False,
) -> VaultRead:
    """Every note of the vault at ``root`` as a concept state, links resolved, in path order:
    the same whatever the number of workers (see ``VaultScan.reads``)."""
    scan = VaultScan.of(root, allow_hardlinks)
    for _ in scan.reads(cache, progress, workers):
        pass
    return scan.out


def note_fields(source: str) -> NoteFields:
    """Parse one note and read Obsidian's keys from its front matter."""
    parsed = parse(source)
    warnings = list(parsed.problems)
    fm = parsed.front_matter
    said = _scalar(fm.get("status"))
    status: Status = ""
    if _is_status(said):
        status = said
    else:
        warnings.append(f"status {said!r} is not one of {', '.join(sorted(STATUSES - {''}))}")
    aliases = _strings(fm.get("aliases", fm.get("alias")), split_spaces=False)
    if len(aliases) > MAX_ALIASES or any(len(a) > MAX_ALIAS_CHARS for a in aliases):
        warnings.append(f"aliases cut to {MAX_ALIASES} of at most {MAX_ALIAS_CHARS} characters")
        aliases = [a[:MAX_ALIAS_CHARS] for a in aliases[:MAX_ALIASES]]
    tags = _strings(fm.get("tags", fm.get("tag")), split_spaces=True) + parsed.tags
    return NoteFields(
        title=_scalar(fm.get("title")),
        aliases=aliases,
        tags=list(dict.fromkeys(tag.lstrip("#") for tag in tags if tag.lstrip("#"))),
        type=_scalar(fm.get("type")),
        status=status,
        body_start=parsed.body_start,
        links=parsed.links,
        warnings=warnings,
    )


def _note(
    nid: str, path: str, source: str, fields: NoteFields, resolver: Resolver, warnings: list[str]
) -> tuple[NoteState, int]:
    """The note's concept state and how many attachment links it has; a dropped link's
    warning is added to ``warnings``."""
    links: dict[str, None] = {}
    unresolved = 0
    attachments = 0
    for ref in fields.links:
        found = resolver.resolve(ref, nid)
        if found.attachment or found.target is None:
            attachments += found.attachment
            if found.problem:
                warnings.append(f"link {ref.target!r} dropped: {found.problem}")
            continue
        if found.target != nid:
            links.setdefault(found.target, None)
            unresolved += not found.resolved
    data = UpsertData(
        version=0,
        title=fields.title or nid.rsplit("/", 1)[-1],
        aliases=fields.aliases,
        type=fields.type,
        status=fields.status,
        tags=fields.tags,
        text=source[fields.body_start :],
        links=list(links),
    )
    digest = hashlib.sha256(_hash_encoder.encode(data)).hexdigest()
    return NoteState(nid, path, data, digest, unresolved), attachments


_SCALARS: Final = (str, int, float, bool, datetime.date)


def _scalar(value: Any) -> str:
    """A front-matter scalar as text (numbers and dates too); lists, mappings give "" (a YAML
    structure is never turned into text: shared by aliases, its text can be exponential)."""
    if value is None or not isinstance(value, _SCALARS):
        return ""
    return str(value).strip()


def _strings(value: Any, *, split_spaces: bool) -> list[str]:
    """A front-matter list of scalars, or a string of comma (and for tags space) separated
    items; anything else (a mapping, a list's nested lists) gives nothing."""
    if value is None:
        return []
    items = value if isinstance(value, list) else _scalar(value).split(",")
    out: list[str] = []
    for item in items:
        text = _scalar(item)
        out.extend(text.split() if split_spaces else [text] if text else [])
    return [unicodedata.normalize("NFC", item) for item in out if item]
