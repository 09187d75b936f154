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
  a device), a note over the size bound (``max_note_bytes``, ``--max-page-bytes``: at most
  ``MAX_NOTE_BYTES``; checked with ``fstat`` before a byte is read, and the read stops past
  it) and a file or folder whose name is not valid UTF-8 are skipped, each with the reason in
  the report. Such a note previously sent is deleted, as a removed one.
- A regular file with more than one name (a hard link) is skipped the same way unless
  ``allow_hardlinks`` (``--allow-hardlinks``) says the vault's hard links are meant (issue 34):
  its other name may be a file outside the vault, which no path check can see.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from kbgraph.names import concept_id_problem
from kbgraph.sources.vault.ahead import Ahead, Made

# one note's reading lives in notes.py (the pool imports it); named here too, for the readers
# of a vault (sync, the Logseq reader) that import them with the vault's
from kbgraph.sources.vault.notes import MAX_NOTE_BYTES as MAX_NOTE_BYTES
from kbgraph.sources.vault.notes import NoteFields as NoteFields
from kbgraph.sources.vault.notes import NoteRead
from kbgraph.sources.vault.notes import NoteState as NoteState
from kbgraph.sources.vault.notes import note_fields as note_fields
from kbgraph.sources.vault.notes import read_note as read_note

PROGRESS_EVERY: Final = 250


@dataclass(slots=True)
class VaultRead:
    notes: dict[str, NoteState] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why), not sent
    unreadable: set[str] = field(default_factory=set)  # ids whose file could not be read
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (path, what), still sent
    attachments: int = 0
    content_keys: set[str] = field(default_factory=set)  # the parse cache keys of this read
    parsed: dict[str, bytes] = field(default_factory=dict)  # the cache's misses, as it keeps them
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


@dataclass(slots=True)
class VaultScan:
    """A vault walked, its notes not read yet: ``reads`` reads them into ``out``."""

    root: Path
    ids: dict[str, str]  # id -> path, in path order
    files: list[str]  # the other files (attachments), NFC
    out: VaultRead
    allow_hardlinks: bool = False  # read notes with more than one name (see the module)
    max_note_bytes: int = MAX_NOTE_BYTES  # a note's file over it is skipped (see the module)
    made: dict[str, Made] = field(default_factory=dict)  # id -> its analysis made ahead

    @classmethod
    def of(
        cls, root: Path, allow_hardlinks: bool = False, max_note_bytes: int = MAX_NOTE_BYTES
    ) -> VaultScan:
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
        return cls(root, ids, files, out, allow_hardlinks, max_note_bytes)

    def reads(
        self,
        cache: dict[str, NoteFields] | None = None,
        progress: Callable[[int, int], None] | None = None,
        workers: int | None = None,
        ahead: Ahead | None = None,
    ) -> Iterator[NoteState]:
        """Read every note (``read_chunk``) in id order, on ``workers`` processes when there
        are many (``kbgraph.sources.vault.pool``), yielding each note's state as it comes; once all
        are read, ``out`` holds the notes, skips and warnings in path order. The store's
        analyses the workers made (``ahead``: ``kbgraph.sources.vault.ahead``) wait in ``made``
        for the caller to take.

        ``cache`` maps a file content's sha256 to its parsed fields: hits skip parsing; the
        misses' fields are in ``out.parsed``, encoded as the manifest keeps them (the caller
        may persist them, see ``Manifest.update_parse_cache``): never decoded here."""
        from kbgraph.sources.vault.pool import read_all  # the pool's workers import this module

        order = sorted(self.ids.items())  # the order sync sends in
        index = {path: i for i, path in enumerate(self.ids.values())}
        jobs = [(index[path], nid, path) for nid, path in order]
        real_root = os.path.realpath(self.root)
        context = (
            self.root, real_root, self.files, cache or {}, self.allow_hardlinks,
            self.max_note_bytes,
        )  # fmt: skip
        results: list[NoteRead | None] = [None] * len(jobs)
        reads = read_all(context, list(self.ids), jobs, workers, ahead)
        for done, (result, made) in enumerate(reads, 1):
            results[result.index] = result
            if made is not None:
                self.made[result.id] = made
            if progress is not None and (done % PROGRESS_EVERY == 0 or done == len(jobs)):
                progress(done, len(jobs))
            if result.key:
                self.out.content_keys.add(result.key)
            if result.fields:
                self.out.parsed[result.key] = result.fields
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
    max_note_bytes: int = MAX_NOTE_BYTES,
) -> VaultRead:
    """Every note of the vault at ``root`` as a concept state, links resolved, in path order:
    the same whatever the number of workers (see ``VaultScan.reads``)."""
    scan = VaultScan.of(root, allow_hardlinks, max_note_bytes)
    for _ in scan.reads(cache, progress, workers):
        pass
    return scan.out
