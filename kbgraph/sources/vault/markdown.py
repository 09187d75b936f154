"""One note's markdown, parsed with markdown-it-py: front matter, links, embeds, inline tags.

Nothing is found by a regex over the raw note. markdown-it-py splits the note into blocks and
inline tokens; code blocks, fenced code, inline code and raw HTML never reach the inline text
we read, so link-like text inside them yields nothing. Wikilinks are an inline rule of the
parser (``[[t]]``, ``[[t|label]]``, ``[[t#heading]]``, ``[[t#^block]]``, ``![[t]]``), markdown
links come from its ``link_open`` tokens, front matter from mdit-py-plugins' front_matter
plugin read by PyYAML's ``safe_load``, and ``#tags`` from the text tokens only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import yaml
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token
from mdit_py_plugins.front_matter import front_matter_plugin

# Obsidian's inline tag: after a line start or whitespace, letters, digits, _ - /, not all digits.
# Written to open with its "#" (the lookbehind after it checks what precedes it), so the regex
# engine jumps from "#" to "#" instead of trying the lookbehind at every character of a text.
_TAG = re.compile(r"#(?<!\S#)([\w/-]+)")
# Dendron's target of a note in a named vault: dendron://<vault>/<note>
DENDRON_SCHEME: Final = "dendron://"
# A Logseq block reference, ``((uuid))``: the uuid of a block that carries ``id:: uuid``
_BLOCK_REF: Final = re.compile(
    r"\(\(([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\)\)"
)


class LinkRef(msgspec.Struct, frozen=True, array_like=True):
    """A link as written: ``target`` without heading, block ref or label."""

    target: str
    markdown: bool = False  # a markdown link (a path, maybe percent-encoded) vs a wikilink
    embed: bool = False


@dataclass(slots=True)
class ParsedNote:
    front_matter: dict[str, Any]
    body_start: int  # the body (the note without its front matter) is source[body_start:]
    links: list[LinkRef] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    block_refs: list[str] = field(default_factory=list)  # ((uuid)), found by OUTLINE_PARSER
    problems: list[str] = field(default_factory=list)


def _next(state: StateInline, needle: str, start: int) -> int:
    """``state.src.find(needle, start)``, remembered per inline source: the rule runs at every
    ``[`` and ``!``, and a fresh scan to the end from each made ``"![[a" * 80000`` quadratic.
    A scan from ``p`` that found ``f`` answers every start in ``[p, f]`` (no match between)."""
    memo: dict[str, tuple[str, int, int]] = state.env.setdefault("wikilink_next", {})
    src = state.src
    seen = memo.get(needle)
    if (
        seen is not None
        and seen[0] is src
        and seen[1] <= start
        and (seen[2] < 0 or start <= seen[2])
    ):
        return seen[2]
    found = src.find(needle, start)
    memo[needle] = (src, start, found)
    return found


def _wikilink_rule(state: StateInline, silent: bool) -> bool:
    """``[[...]]`` or ``![[...]]`` on one line: one ``wikilink`` token, target in ``meta``."""
    src, pos = state.src, state.pos
    embed = src.startswith("![[", pos)
    if not embed and not src.startswith("[[", pos):
        return False
    start = pos + (3 if embed else 2)
    end = _next(state, "]]", start)
    if end < 0:
        return False
    # no line break and no other "[[" inside (one can end at end - 1 only if src[end] == "[")
    if 0 <= _next(state, "\n", start) < end or 0 <= _next(state, "[[", start) < end:
        return False
    inner = src[start:end]
    if not silent:
        token = state.push("wikilink", "", 0)
        # in a table cell the label's pipe is escaped: [[target\|label]]; Dendron writes
        # [[label|target]], known by its target's dendron:// scheme
        target, _, after = inner.replace("\\|", "|").partition("|")
        if after.lstrip().startswith(DENDRON_SCHEME):
            target = after
        token.meta = {"target": target.split("#", 1)[0], "embed": embed}
        token.content = inner
    state.pos = end + 2
    return True


# A character without which an inline run holds no link and no tag: ``[`` opens wikilinks,
# links and images (``![``), ``<`` autolinks, ``#`` a tag (``\#`` too), ``&`` an entity that
# may read ``#`` (``&num;``, ``&#35;``). Linkify (bare URLs) is off.
_MAY_HOLD_LINK_OR_TAG: Final = re.compile(r"[\[<#&]")


def _inline_rule(state: StateCore) -> None:
    """markdown-it's core ``inline`` rule, skipping the inline runs that cannot hold a link or
    a tag (their children stay empty): nothing read from a note comes from them, and a
    heading or a paragraph of plain prose is parsed no further than its block."""
    md = state.md
    for token in state.tokens:
        if token.type == "inline":
            if token.children is None:
                token.children = []
            if _MAY_HOLD_LINK_OR_TAG.search(token.content):
                md.inline.parse(token.content, md, state.env, token.children)


def _parser(*, every_inline: bool = False) -> MarkdownIt:
    """The parser of notes; ``every_inline`` parses every inline run, as markdown-it does
    (``OUTLINE_PARSER``: Logseq's pages, and what the tests hold the skip to)."""
    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    md.use(front_matter_plugin)
    md.inline.ruler.before("link", "wikilink", _wikilink_rule)
    if not every_inline:
        md.core.ruler.at("inline", _inline_rule)
    return md


_MD = _parser()
# Logseq pages: every inline run read, since a block reference ``((uuid))`` holds none of the
# characters the vault's fast path looks for
OUTLINE_PARSER: Final = _parser(every_inline=True)
# ``yaml.safe_load``'s loader, in C when PyYAML was built with libyaml (~10x faster)
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# YAML aliases (``*name``) a front matter may use: a few share a value; many build an "alias
# bomb" whose structure, walked or turned into text, is exponentially large
MAX_YAML_ALIASES: Final = 32


def load_front_matter(text: str) -> Any:
    """The front matter's YAML, safely loaded, after PyYAML's own event stream showed it uses
    at most ``MAX_YAML_ALIASES`` aliases (else ``yaml.YAMLError``). An alias is written
    ``*name``: text without a ``*`` has none, and its events are not read."""
    aliases = 0
    for event in yaml.parse(text, Loader=_SafeLoader) if "*" in text else ():
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_YAML_ALIASES} aliases (*name)")
    return yaml.load(text, Loader=_SafeLoader)


def parse(source: str, parser: MarkdownIt = _MD) -> ParsedNote:
    """Parse one note. Never raises on bad markdown or YAML: problems are listed instead.
    A note with no front matter (which opens with ``---``) and none of ``[ < # &`` is not
    given to markdown-it at all: it would skip every inline run of it (``_inline_rule``) and
    find nothing, as a note of plain prose (a journal's day, say) is."""
    if parser is _MD and not source.startswith("---") and not _MAY_HOLD_LINK_OR_TAG.search(source):
        return ParsedNote(front_matter={}, body_start=0)
    tokens = parser.parse(source)
    note = ParsedNote(front_matter={}, body_start=0)
    if tokens and tokens[0].type == "front_matter":
        fm = tokens[0]
        note.body_start = _line_start(source, fm.map[1]) if fm.map else len(source)
        try:
            loaded = load_front_matter(fm.content) if fm.content.strip() else {}
        except yaml.YAMLError as exc:
            note.problems.append(f"front matter is not valid YAML ({_first_line(exc)})")
            loaded = {}
        if isinstance(loaded, dict):  # keys that are not text (numbers, dates) name no field
            note.front_matter = {k: v for k, v in loaded.items() if isinstance(k, str)}
        elif loaded is not None:
            note.problems.append("front matter is not a mapping")
    for token in tokens:
        if token.type == "inline" and token.children:
            _read_inline(token.children, note)
    return note


def _read_inline(children: list[Token], note: ParsedNote) -> None:
    for child in children:
        if child.type == "wikilink":
            note.links.append(LinkRef(child.meta["target"], embed=child.meta["embed"]))
        elif child.type == "link_open":
            href = child.attrGet("href")
            if isinstance(href, str):
                if ref := _BLOCK_REF.fullmatch(href):  # [label](((uuid))), Logseq's
                    note.block_refs.append(ref[1])
                else:
                    note.links.append(LinkRef(href, markdown=True))
        elif child.type == "image":
            src = child.attrGet("src")
            if isinstance(src, str):
                note.links.append(LinkRef(src, markdown=True, embed=True))
        elif child.type == "text":
            if "#" in child.content:
                note.tags.extend(inline_tags(child.content))
            if "((" in child.content:
                note.block_refs.extend(_BLOCK_REF.findall(child.content))


def inline_tags(text: str) -> list[str]:
    """Obsidian's inline tags of a run of text, in order: a ``#`` at its start or after
    whitespace, then letters, digits, ``_ - /``; a run of digits alone is no tag."""
    return [tag for tag in _TAG.findall(text) if not tag.isdigit()]


def _line_start(source: str, line: int) -> int:
    """Where line ``line`` (from 0) starts, lines ended by \\n as markdown-it counts them."""
    at = 0
    for _ in range(line):
        found = source.find("\n", at)
        if found < 0:
            return len(source)
        at = found + 1
    return at


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
