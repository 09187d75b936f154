"""A Logseq graph folder read into concept states with Logseq's own rules (docs/logseq.md).

A folder holding ``logseq/config.edn`` beside ``pages/`` or ``journals/`` is a Logseq graph:
``kbgraph import`` and ``sync`` read it with this module instead of as an Obsidian vault.

- A page's name is its ``title::`` property, else its file name decoded by the graph's
  ``:file/name-format`` (config.edn, read with edn_format): ``:triple-lowbar`` turns ``___``
  into ``/`` and decodes each ``%XX`` escape alone; ``:legacy`` (the default when the key is
  missing) turns ``.`` into ``/`` and then percent-decodes the whole name. A page's concept id
  is its name; a journal's is ``journals/YYYY-MM-DD``, its title the date written in
  ``:journal/page-title-format`` and its type ``journal``.
- Names are case-insensitive (Logseq lower-cases them): ``[[foo]]`` finds the page ``Foo``.
  ``alias::`` names a page too; ``tags::`` are its tags; ``type::`` its type.
- ``[[links]]``, ``#tag`` and ``#[[tag]]`` anywhere (blocks and property values, never code)
  are references to pages. One to a page with a file is a link; one to a page without a file
  (Logseq makes an empty page for it) is a tag of the referring page, under the name as first
  written. ``{{embed [[page]]}}`` is a reference like any other.
- ``((uuid))`` (and ``{{embed ((uuid))}}``, ``[label](((uuid)))``) refers to the block that
  carries ``id:: uuid``: a link to that block's page.
- Property lines (``key:: value``) are kept out of the text; those before the first block
  are the page's.

Files are read within the same bounds as a vault's notes (``reader.read_note``): symlinks out,
non-regular files, hard links and oversized files are skipped and reported. Only Markdown
pages are read; an Org-mode page is reported as skipped.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

import edn_format  # type: ignore[import-untyped]  # ships no type hints
import msgspec

from kbgraph.events import (
    ECHO_CHARS,
    MAX_ALIAS_CHARS,
    MAX_ALIASES,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TEXT_BYTES,
    MAX_TYPE_CHARS,
    UpsertData,
)
from kbgraph.names import concept_id_problem
from kbgraph.sources.vault.markdown import OUTLINE_PARSER, parse
from kbgraph.sources.vault.reader import (
    MAX_NOTE_BYTES,
    NoteState,
    VaultRead,
    VaultScan,
    read_note,
    walk,
)

CONFIG_PATH: Final = "logseq/config.edn"
PAGE_FOLDERS: Final = ("pages", "journals")
MAX_CONFIG_BYTES: Final = 256 << 10  # Logseq's own is ~20 KB; EDN soup this size parses in ~5 s
NAME_FORMATS: Final = ("legacy", "triple-lowbar")
DEFAULT_TITLE_FORMAT: Final = "MMM do, yyyy"  # Logseq's :journal/page-title-format
DEFAULT_FILE_FORMAT: Final = "yyyy_MM_dd"  # Logseq's :journal/file-name-format
JOURNAL_TYPE: Final = "journal"
# what resolved a reference, as the import summary names it
BY_FILE_NAME: Final = "file name"
BY_NAMESPACE: Final = "namespace or encoded file name"
BY_TITLE: Final = "title"
BY_JOURNAL: Final = "journal date"
BY_ALIAS: Final = "alias"
BY_CASE: Final = "case"
BY_BLOCK: Final = "block reference"
TO_NO_PAGE: Final = "to a page without a file (a tag)"
TO_NO_BLOCK: Final = "to no block (dropped)"
RULES: Final = (BY_FILE_NAME, BY_NAMESPACE, BY_TITLE, BY_JOURNAL, BY_ALIAS, BY_CASE, BY_BLOCK)

_hash_encoder = msgspec.msgpack.Encoder()


def is_graph(root: Path) -> bool:
    """Whether ``root`` is a Logseq graph: ``logseq/config.edn`` beside pages or journals."""
    return (root / CONFIG_PATH).is_file() and any((root / f).is_dir() for f in PAGE_FOLDERS)


# ---------------------------------------------------------------- config.edn


@dataclass(frozen=True, slots=True)
class GraphConfig:
    name_format: str = "legacy"  # Logseq reads a config without the key as legacy
    journal_title: str = DEFAULT_TITLE_FORMAT
    journal_file: str = DEFAULT_FILE_FORMAT


def parse_config(text: str) -> GraphConfig | str:
    """The keys kbgraph reads from a config.edn's text, or why it cannot be read."""
    try:
        data = edn_format.loads(text)
    except Exception as exc:  # edn_format evaluates as it reads: ``1/0`` raises
        # ZeroDivisionError, a bad ``#inst`` ValueError, an unknown tag NotImplementedError;
        # any of them means a config Logseq could not use either
        said = str(exc).strip()
        first = f": {said.splitlines()[0][:ECHO_CHARS]}" if said else ""
        return f"not valid EDN ({type(exc).__name__}{first})"
    if not isinstance(data, edn_format.ImmutableDict):
        return "not an EDN map"
    name = data.get(edn_format.Keyword("file/name-format"))
    title = data.get(edn_format.Keyword("journal/page-title-format"))
    file = data.get(edn_format.Keyword("journal/file-name-format"))
    return GraphConfig(
        name.name if isinstance(name, edn_format.Keyword) and name.name in NAME_FORMATS
        else "legacy",
        title if isinstance(title, str) and title.strip() else DEFAULT_TITLE_FORMAT,
        file if isinstance(file, str) and file.strip() else DEFAULT_FILE_FORMAT,
    )  # fmt: skip


# ---------------------------------------------------------------- names and dates

_PERCENT: Final = re.compile(r"%[0-9a-fA-F]{2}")
_BAD_PERCENT: Final = re.compile(r"%(?![0-9a-fA-F]{2})")


def _decode_one(escape: re.Match[str]) -> str:
    """One ``%XX`` decoded alone, as JavaScript's decodeURIComponent would: an escape of a
    byte past ASCII is half a character, which it refuses, so it stays as written."""
    byte = int(escape[0][1:], 16)
    return chr(byte) if byte < 0x80 else escape[0]


def page_name(stem: str, name_format: str) -> str:
    """The page name a file name (without ``.md``) gives, by the graph's name format."""
    if name_format == "triple-lowbar":
        name = _PERCENT.sub(_decode_one, stem.replace("___", "/"))
    else:
        name = stem.replace(".", "/")
        if not _BAD_PERCENT.search(name):  # decodeURIComponent throws on a malformed one
            with contextlib.suppress(UnicodeDecodeError):
                name = unquote(name, errors="strict")
    return sane(name)


def sane(name: str) -> str:
    """A page name as Logseq keeps it: NFC, trimmed, no empty namespace (``a//b``, ``/a/``)."""
    name = unicodedata.normalize("NFC", name.strip())
    return "/".join(part for part in name.split("/") if part) if "/" in name else name


def folded(name: str) -> str:
    """The case-insensitive key of a page name (Logseq's lower-cased ``:block/name``)."""
    return sane(name).lower()


_DATE_TOKEN: Final = re.compile(r"'[^']*'|yyyy|yy|MMMM|MMM|MM|M|do|dd|d|EEEE|EEE|E")
_MONTHS: Final = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_DAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def format_date(pattern: str, date: datetime.date) -> str:
    """``date`` written in a Logseq (date-fns) date pattern: the tokens Logseq's journal
    formats use (``yyyy yy MMMM MMM MM M do dd d EEEE EEE E``, ``'quoted'`` text), English
    names; any other character as written."""
    values = {
        "yyyy": f"{date.year:04d}", "yy": f"{date.year % 100:02d}",
        "MMMM": _MONTHS[date.month - 1], "MMM": _MONTHS[date.month - 1][:3],
        "MM": f"{date.month:02d}", "M": str(date.month),
        "do": _ordinal(date.day), "dd": f"{date.day:02d}", "d": str(date.day),
        "EEEE": _DAYS[date.weekday()], "EEE": _DAYS[date.weekday()][:3],
        "E": _DAYS[date.weekday()][:3],
    }  # fmt: skip

    def one(token: re.Match[str]) -> str:
        text = token[0]
        return text[1:-1] if text.startswith("'") else values[text]

    return _DATE_TOKEN.sub(one, pattern)


_FILE_FIELDS: Final = {"yyyy": r"(?P<y>\d{4})", "MM": r"(?P<m>\d{2})", "M": r"(?P<m>\d{1,2})",
                       "dd": r"(?P<d>\d{2})", "d": r"(?P<d>\d{1,2})"}  # fmt: skip


def journal_date(stem: str, file_format: str) -> datetime.date | None:
    """The date a journal's file name says in the graph's journal file name format, if any."""
    parts, at = [], 0
    for token in re.finditer(r"yyyy|MM|M|dd|d", file_format):
        parts.append(re.escape(file_format[at : token.start()]))
        parts.append(_FILE_FIELDS[token[0]])
        at = token.end()
    parts.append(re.escape(file_format[at:]))
    try:
        found = re.fullmatch("".join(parts), stem)
        if found is None:
            return None
        return datetime.date(int(found["y"]), int(found["m"]), int(found["d"]))
    except (IndexError, ValueError, re.error):  # a format without a field, a 31st of June
        return None


# ---------------------------------------------------------------- one page

# ``key:: value``: a property line (a first line ``- key:: value`` too); keys hold no space
_PROPERTY: Final = re.compile(r"[ \t]*(?:-[ \t]+)?([^\s:][^\s]*?)::(?:[ \t]+(.*?))?[ \t]*")
_FENCE: Final = re.compile(r"[ \t]*(?:-[ \t]+)?(```|~~~)")
# a property value's items: ``[[a, b]]``, ``#[[c]]``, ``#d`` or text between commas
_VALUE_ITEM: Final = re.compile(r"\s*(?:#?\[\[(.*?)\]\]|([^,]+))")
_UUID: Final = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def values(text: str) -> list[str]:
    """A property value's items: comma-separated, ``[[...]]`` kept whole, ``#`` dropped."""
    items = (a or b for a, b in _VALUE_ITEM.findall(text))
    out = (sane(item.strip().lstrip("#")) for item in items if item.strip())
    return list(dict.fromkeys(item for item in out if item))


@dataclass(slots=True)
class Page:
    """One page file as read, before its references are resolved."""

    id: str
    path: str
    name: str  # what the page is called: its title
    rule: str  # how its name was made (BY_TITLE, BY_FILE_NAME, BY_NAMESPACE, BY_JOURNAL)
    aliases: list[str]
    tags: list[str]
    type: str
    text: str
    refs: list[str]  # referenced page names, as written
    block_refs: list[str]
    block_ids: list[str]
    attachments: int
    warnings: list[str]


def file_id(path: str, config: GraphConfig) -> tuple[str, datetime.date | None]:
    """The id a page file's path gives (a ``title::`` may change a page's), and a journal's
    date: ``journals/YYYY-MM-DD`` for a journal, else the name its file name decodes to."""
    folder, stem = path.partition("/")[0], path.rpartition("/")[2].removesuffix(".md")
    date = journal_date(stem, config.journal_file) if folder == "journals" else None
    if date is not None:
        return f"journals/{date.isoformat()}", date
    return page_name(stem, config.name_format), None


def read_page(source: str, path: str, config: GraphConfig) -> Page:
    """Parse one page file's text (``path`` relative to the graph, ``pages/`` or
    ``journals/``) into its name, properties, text and references."""
    parsed = parse(source, OUTLINE_PARSER)
    warnings = list(parsed.problems)
    props: dict[str, str] = {}
    block_ids: list[str] = []
    kept: list[str] = []
    in_pre, in_fence = True, False
    for line in source[parsed.body_start :].split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
        prop = None if in_fence else _PROPERTY.fullmatch(line)
        if prop is None:
            in_pre = in_pre and not line.strip()
            kept.append(line)
            continue
        key, value = prop[1].lower(), prop[2] or ""
        if in_pre:
            props.setdefault(key, value)
        if key == "id" and _UUID.fullmatch(value):
            block_ids.append(value.lower())
    front = parsed.front_matter
    nid, date = file_id(path, config)
    title = sane(props.get("title", "")) or _text(front.get("title"))
    if date is not None:
        name, rule = format_date(config.journal_title, date), BY_JOURNAL
    elif title:
        nid, name, rule = title, title, BY_TITLE
    else:
        stem = path.rpartition("/")[2].removesuffix(".md")
        name, rule = (
            nid,
            BY_FILE_NAME if nid == unicodedata.normalize("NFC", stem) else BY_NAMESPACE,
        )
    aliases = values(props.get("alias", "")) + _list(front.get("alias", front.get("aliases")))
    aliases = [a for a in dict.fromkeys(aliases) if folded(a) != folded(name)]
    if len(aliases) > MAX_ALIASES or any(len(a) > MAX_ALIAS_CHARS for a in aliases):
        warnings.append(f"aliases cut to {MAX_ALIASES} of at most {MAX_ALIAS_CHARS} characters")
        aliases = [a[:MAX_ALIAS_CHARS] for a in aliases[:MAX_ALIASES]]
    tags = values(props.get("tags", "")) + _list(front.get("tags"))
    kind = JOURNAL_TYPE if date is not None else (values(props.get("type", "")) or [""])[0]
    attachments = sum(
        1 for ref in parsed.links if ref.markdown and "://" not in ref.target and "." in ref.target
    )
    return Page(
        id=nid, path=path, name=name, rule=rule, aliases=aliases,
        tags=list(dict.fromkeys(tags)), type=kind[:MAX_TYPE_CHARS],
        text="\n".join(kept).strip("\n"),
        refs=[ref.target for ref in parsed.links if not ref.markdown] + parsed.tags,
        block_refs=[ref.lower() for ref in parsed.block_refs],
        block_ids=block_ids, attachments=attachments, warnings=warnings,
    )  # fmt: skip


def _text(value: Any) -> str:
    return sane(value) if isinstance(value, str) else ""


def _list(value: Any) -> list[str]:
    """A front matter's list of strings, or comma-separated string (a YAML structure never
    turned into text)."""
    if isinstance(value, str):
        return values(value)
    if isinstance(value, list):
        return [item for item in (_text(v) for v in value) if item]
    return []


# ---------------------------------------------------------------- the graph's names


class Names:
    """Every page's name and aliases, case-insensitively, and every block id's page."""

    def __init__(self, pages: list[Page]) -> None:
        self.exact: dict[str, tuple[str, str]] = {}  # name as written -> (id, rule)
        self.folded: dict[str, str] = {}  # lower-cased name -> id
        self.blocks: dict[str, str] = {}  # block uuid -> id
        for page in pages:  # names first, then aliases: an alias never takes a page's name
            self.exact.setdefault(page.name, (page.id, page.rule))
            self.folded.setdefault(folded(page.name), page.id)
        for page in pages:
            for alias in page.aliases:
                self.exact.setdefault(alias, (page.id, BY_ALIAS))
                self.folded.setdefault(folded(alias), page.id)
            for block in page.block_ids:
                self.blocks.setdefault(block, page.id)

    def page(self, written: str) -> tuple[str | None, str]:
        """(the id, the rule that found it) of a referenced page; (None, TO_NO_PAGE) when no
        file makes that page."""
        name = sane(written)
        found = self.exact.get(name)
        if found is not None:
            return found
        nid = self.folded.get(name.lower())
        return (nid, BY_CASE) if nid is not None else (None, TO_NO_PAGE)


def page_state(page: Page, names: Names, counts: Counter[str]) -> NoteState:
    """The page's concept state, its references resolved; ``counts`` counts the rules."""
    links: dict[str, None] = {}
    tags: dict[str, str] = {folded(tag): tag for tag in page.tags}
    for ref in page.refs:
        if not sane(ref):
            continue
        target, rule = names.page(ref)
        counts[rule] += 1
        if target is None:
            tags.setdefault(folded(ref), sane(ref))
        elif target != page.id:
            links.setdefault(target, None)
    for block in page.block_refs:
        target = names.blocks.get(block)
        counts[TO_NO_BLOCK if target is None else BY_BLOCK] += 1
        if target is not None and target != page.id:
            links.setdefault(target, None)
    kept = list(tags.values())
    if len(kept) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS for t in kept):
        page.warnings.append(f"tags cut to {MAX_TAGS} of at most {MAX_TAG_CHARS} characters")
        kept = [t[:MAX_TAG_CHARS] for t in kept[:MAX_TAGS]]
    data = UpsertData(
        version=0, title=page.name, aliases=page.aliases, type=page.type, tags=kept,
        text=page.text, links=list(links),
    )  # fmt: skip
    digest = hashlib.sha256(_hash_encoder.encode(data)).hexdigest()
    return NoteState(page.id, page.path, data, digest, 0)


# ---------------------------------------------------------------- the folder


def _read_text(root: Path, real_root: str, path: str, limit: int, hardlinks: bool) -> str:
    """A file's text, as a vault's note is read (bounded, nothing followed out); raises
    ``ValueError`` with why it is skipped, ``OSError``/``UnicodeDecodeError`` if unreadable."""
    raw = read_note(root, real_root, path, limit, hardlinks)
    if isinstance(raw, str):
        raise ValueError(raw)
    text = raw.decode("utf-8").removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if len(text.encode()) > MAX_TEXT_BYTES:
        raise ValueError("longer than 1 MiB")
    return text


def read_config(root: Path, allow_hardlinks: bool = False) -> tuple[GraphConfig, str | None]:
    """The graph's config, or Logseq's defaults and why its config.edn could not be read."""
    try:
        text = _read_text(
            root, os.path.realpath(root), CONFIG_PATH, MAX_CONFIG_BYTES, allow_hardlinks
        )
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        return GraphConfig(), f"{exc}: Logseq's defaults used"
    config = parse_config(text)
    if isinstance(config, str):
        return GraphConfig(), f"{config}: Logseq's defaults used"
    return config, None


@dataclass(slots=True)
class LogseqScan:
    """A graph's pages read and parsed; ``reads`` resolves them (as ``VaultScan`` does)."""

    root: Path
    ids: dict[str, str]  # id -> path, in path order (an unread page under its file's name)
    out: VaultRead
    pages: list[Page] = field(default_factory=list)

    @classmethod
    def of(
        cls, root: Path, allow_hardlinks: bool = False, max_note_bytes: int = MAX_NOTE_BYTES
    ) -> LogseqScan:
        out = VaultRead()
        config, problem = read_config(root, allow_hardlinks)
        if problem:
            out.warnings.append((CONFIG_PATH, problem))
        scan = cls(root, {}, out)
        real_root = os.path.realpath(root)
        taken: dict[str, str] = {}  # folded id -> path
        for path in _page_paths(root, out.skipped):
            try:
                text = _read_text(root, real_root, path, max_note_bytes, allow_hardlinks)
            except (OSError, UnicodeDecodeError) as exc:  # before ValueError: a subclass
                nid = file_id(path, config)[0]
                if scan._claim(nid, path, taken, f"unreadable: {type(exc).__name__}"):
                    out.unreadable.add(nid)
                continue
            except ValueError as exc:
                scan._claim(file_id(path, config)[0], path, taken, str(exc))
                continue
            page = read_page(text, path, config)
            problem = concept_id_problem(page.id)
            if problem:
                out.skipped.append((path, problem.replace("concept id", "page name")))
            elif scan._claim(page.id, path, taken, ""):
                scan.pages.append(page)
        return scan

    def _claim(self, nid: str, path: str, taken: dict[str, str], skipped: str) -> bool:
        """Take id ``nid`` for ``path`` unless a page already has that name (in any case);
        a file that is ``skipped`` is reported, and its id kept so a page sent before is
        dealt with as sync says (deleted, or left alone when unreadable)."""
        if not nid or concept_id_problem(nid):
            self.out.skipped.append((path, skipped or "no valid page name"))
            return False
        key = folded(nid)
        if key in taken:
            why = f"same page name as {taken[key]!r} (names ignore case)"
            self.out.skipped.append((path, why))
            return False
        taken[key] = path
        self.ids[nid] = path
        if skipped:
            self.out.skipped.append((path, skipped))
        return True

    def reads(
        self,
        cache: object = None,
        progress: Callable[[int, int], None] | None = None,
        workers: int | None = None,
        ahead: object = None,
    ) -> Iterator[NoteState]:
        """Every page's state in id order, references resolved against every page's names.
        ``cache``, ``workers`` and ``ahead`` are the vault's (the parse cache, the pool, the
        store's analyses made there): a graph is read whole in this process, as its names
        come from every page's content."""
        names = Names(self.pages)
        counts: Counter[str] = Counter()
        out = self.out
        for page in sorted(self.pages, key=lambda p: p.id):
            state = page_state(page, names, counts)
            out.notes[page.id] = state
            out.attachments += page.attachments
            yield state
        if progress is not None:
            progress(len(self.pages), len(self.pages))
        for page in self.pages:
            out.warnings.extend((page.path, warning) for warning in page.warnings)
        out.resolved_by = {rule: counts[rule] for rule in (*RULES, TO_NO_PAGE, TO_NO_BLOCK)}


def _page_paths(root: Path, skipped: list[tuple[str, str]]) -> list[str]:
    """The Markdown files under ``pages/`` and ``journals/``, relative to ``root``."""
    paths: list[str] = []
    for folder in PAGE_FOLDERS:
        where = root / folder
        if os.path.islink(where):
            skipped.append((folder, "symlinked folder: not followed"))
            continue
        if not where.is_dir():
            continue
        refused: list[tuple[str, str]] = []
        notes, files = walk(where, refused)
        skipped.extend((f"{folder}/{path}", why) for path, why in refused)
        paths.extend(f"{folder}/{path}" for path in notes)
        skipped.extend(
            (f"{folder}/{path}", "Org-mode page: not read (only Markdown pages are)")
            for path in files
            if path.endswith(".org")
        )
    return paths


def open_scan(
    root: Path, allow_hardlinks: bool = False, max_note_bytes: int = MAX_NOTE_BYTES
) -> VaultScan | LogseqScan:
    """The folder's scan: a Logseq graph's (``is_graph``) or an Obsidian vault's."""
    if is_graph(root):
        return LogseqScan.of(root, allow_hardlinks, max_note_bytes)
    return VaultScan.of(root, allow_hardlinks, max_note_bytes)


def read_graph(
    root: Path, allow_hardlinks: bool = False, max_note_bytes: int = MAX_NOTE_BYTES
) -> VaultRead:
    """Every page of the graph at ``root`` as a concept state, references resolved."""
    scan = LogseqScan.of(root, allow_hardlinks, max_note_bytes)
    for _ in scan.reads():
        pass
    return scan.out
