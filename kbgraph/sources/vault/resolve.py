"""Link targets resolved as Obsidian resolves them, against the notes and files of one vault.

A wikilink target (or a markdown link's decoded path) names, in this order:
1. a note by its exact path relative to the vault (``folder/note``; case first kept, then
   ignored);
2. else the unique note of that name: the notes whose path ends with the target (``note``
   matches ``a/note`` and ``b/c/note``; ``c/note`` only the second), case-insensitively;
3. else, of several, the one with the shortest path: the fewest folders deep, then the
   smallest path by code point.
A Dendron target ``dendron://<vault>/<note>`` names ``<note>``.
Aliases are not link targets. A target naming a file that is not a note (an image, a pdf, a
canvas: any non-``.md`` file of the vault, or a target with an attachment's extension) is an
attachment, not a concept. Anything else is unresolved and kept as written, normalised like
an id (NFC, no ``.md``, no surrounding spaces or slashes), so it becomes an edge as soon as
such a note appears.
"""

from __future__ import annotations

import posixpath
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

from kbgraph.names import concept_id_problem
from kbgraph.sources.vault.markdown import DENDRON_SCHEME, LinkRef

# Extensions Obsidian opens as attachments (images, audio, video, pdf, canvas, bases).
ATTACHMENT_EXTENSIONS: Final = frozenset({
    "png", "jpg", "jpeg", "gif", "bmp", "svg", "webp", "avif", "heic", "tif", "tiff", "ico",
    "mp3", "wav", "m4a", "ogg", "oga", "3gp", "flac", "webm", "mp4", "ogv", "mov", "mkv",
    "pdf", "canvas", "base", "zip",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Resolved:
    """``target`` is the concept id linked to (None for an attachment or no target)."""

    target: str | None
    resolved: bool = True  # False: kept as written (no such note, yet)
    attachment: bool = False
    problem: str | None = None


def _fold(path: str) -> str:
    return path.casefold()


class Resolver:
    """The vault's notes (ids: paths without ``.md``) and other files, indexed by name."""

    def __init__(self, note_ids: Iterable[str], files: Iterable[str] = ()) -> None:
        self._notes = set(note_ids)
        self._folded: dict[str, list[str]] = {}
        self._by_name: dict[str, list[str]] = {}
        for nid in sorted(self._notes, key=lambda n: (n.count("/"), n)):  # shortest path first
            self._folded.setdefault(_fold(nid), []).append(nid)
            self._by_name.setdefault(_fold(posixpath.basename(nid)), []).append(nid)
        self._files = {_fold(f) for f in files}
        self._file_names = {_fold(posixpath.basename(f)) for f in files}
        self._wikilinks: dict[str, Resolved] = {}

    def resolve(self, link: LinkRef, source_id: str) -> Resolved:
        if link.markdown:
            return self._markdown(link.target, source_id)
        found = self._wikilinks.get(link.target)  # a wikilink's reading needs no source
        if found is None:
            found = self._wikilinks[link.target] = self._wikilink(link.target)
        return found

    def _wikilink(self, written: str) -> Resolved:
        target = unicodedata.normalize("NFC", written.strip())
        if target.startswith(DENDRON_SCHEME):  # dendron://<vault>/<note>: the vault's name
            target = target.removeprefix(DENDRON_SCHEME).partition("/")[2]  # carries nothing
        if not target:
            return Resolved(None)  # [[#heading]]: a link into the note itself
        if self._is_attachment(target):
            return Resolved(None, attachment=True)
        return self._by_path_or_name(_strip_md(target))

    def _markdown(self, href: str, source_id: str) -> Resolved:
        parts = urlsplit(href)
        if parts.scheme or parts.netloc:
            return Resolved(None)  # a URL, not a file of the vault
        path = unicodedata.normalize("NFC", unquote(parts.path)).strip()
        if not path:
            return Resolved(None)  # [x](#heading)
        if not path.lower().endswith(".md"):
            attachment = self._is_attachment(path) or "." in posixpath.basename(path)
            return Resolved(None, attachment=attachment)
        if path.startswith("/"):
            joined = path.lstrip("/")
        else:
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(source_id), path))
        if joined.startswith("../") or joined == "..":
            joined = path  # leaves the vault: read it as a name, as Obsidian does
        found = self._by_path_or_name(_strip_md(joined))
        if found.resolved or "/" not in path:
            return found
        return self._by_path_or_name(_strip_md(path))

    def _is_attachment(self, target: str) -> bool:
        folded = _fold(target.lstrip("/"))
        if folded in self._files or posixpath.basename(folded) in self._file_names:
            return True
        _, dot, ext = posixpath.basename(folded).rpartition(".")
        return bool(dot) and ext in ATTACHMENT_EXTENSIONS

    def _by_path_or_name(self, target: str) -> Resolved:
        target = target.strip().strip("/").strip()
        if target in self._notes:
            return Resolved(target)
        folded = _fold(target)
        exact = self._folded.get(folded)
        if exact:
            return Resolved(exact[0])
        name = posixpath.basename(folded)
        suffix = "/" + folded
        candidates = [
            nid
            for nid in self._by_name.get(name, ())
            if "/" not in folded or _fold(nid).endswith(suffix)
        ]
        if candidates:
            return Resolved(candidates[0])  # unique, else the shortest path
        problem = concept_id_problem(target)
        if problem:
            return Resolved(None, resolved=False, problem=problem)
        return Resolved(target, resolved=False)


def _strip_md(path: str) -> str:
    return path[:-3] if path.lower().endswith(".md") else path
