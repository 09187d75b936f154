"""Terms: how a text or a question becomes the words search matches.

Tokens are runs of letters and digits after NFKD, dropping combining marks and case folding
(``Café`` = ``cafe``); English stop words are dropped (a question's "how do I" matches nothing,
and a query of stop words alone matches nothing); every other token is reduced to its Snowball
English stem (PyStemmer), so "backups" finds "backup", "working" finds "works". Stems are
cached per token, so indexing pays the stemmer once per distinct word; the cache is filled by
indexing only (a query's words are stemmed and forgotten, so no request can grow it), and an
answer never depends on what it holds. A query is only ever split into terms, so no
character in it is syntax.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from typing import Final

import Stemmer

STEM_CACHE_MAX: Final = 1 << 20
MARKS_MAX: Final = 1 << 16  # code points whose combining class fold() remembers
MAX_QUERY_TERMS: Final = 32  # distinct terms of a query used for ranking and snippets

# Snowball's English stop word list, folded as tokens are (apostrophes split words, so the
# contractions' parts are listed), plus words of questions that name nothing.
STOP_WORDS: Final = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could d did do does doing don down during each few for
    from further had has have having he her here hers herself him himself his how i if in into
    is it its itself just ll m me more most my myself no nor not now of off on once only or
    other ought our ours ourselves out over own re s same shall she should so some such t than
    that the their theirs them themselves then there these they this those through to too under
    until up ve very was we were what when where which while who whom why will with won would
    you your yours yourself yourselves""".split()  # noqa: SIM905 (easier to read)
)

ASCII_TOKEN = re.compile(r"[a-z0-9]+")
ASCII_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN = re.compile(r"[^\W_]+")
_COMPOUND = re.compile(r"[^\W_]+(?:-[^\W_]+)+")


class _Marks(dict[int, int | None]):
    """``str.translate``'s table dropping combining marks: each code point looked up once
    (``unicodedata.combining``), then in C; a char-by-char loop cost ~0.3 µs a character."""

    def __missing__(self, code: int) -> int | None:
        kept = None if unicodedata.combining(chr(code)) else code
        if len(self) < MARKS_MAX:  # bounded: a text of every code point grows it no further
            self[code] = kept
        return kept


_MARKS = _Marks()
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_COMMON_MARKS = re.compile(  # the combining diacritics block's marks (U+034F is none)
    "[" + "".join(chr(c) for c in range(0x300, 0x370) if unicodedata.combining(chr(c))) + "]"
)


def fold(text: str) -> str:
    """Case folded, compatibility-decomposed, combining marks (accents) dropped."""
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKD", text).translate(_MARKS).casefold()


# ASCII text, as bytes: letters to lower case, digits kept, every other byte a space (the
# upper half is never used, bytes.translate wants 256 entries); then
# ``str.split`` finds exactly the runs ``[a-z0-9]+`` of the lower-cased text, ~2x faster.
_ASCII_FOLD = bytes(ord(chr(c).lower()) if chr(c).isalnum() else 32 for c in range(128)) * 2


def tokenize(text: str) -> list[str]:
    """The folded tokens of ``text``, in order, stop words included (names are matched so)."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_FOLD).decode("ascii").split()
    folded = fold(text)
    if folded.isascii():
        return ASCII_TOKEN.findall(folded)
    return TOKEN.findall(folded)


def folded(text: str) -> bytes:
    """``tokenize(text)`` as UTF-8 bytes, the tokens parted by one space or more (an ASCII
    text folded in one translation, no string per token): what the name trie walks. A text
    that is ASCII once decomposed, rid of the common accents and of the characters that only
    part tokens (dashes, quotes: most Latin text) is folded so too: ``fold``'s per-character
    translation and the Unicode token pattern cost ~60 µs a passage."""
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_FOLD)
    plain = _COMMON_MARKS.sub("", unicodedata.normalize("NFKD", text))
    if not plain.isascii():  # every mark dropped was one ``fold`` drops
        if not all(map(_parts_only, set(_NON_ASCII.findall(plain)))):
            return " ".join(tokenize(text)).encode()
        plain = _NON_ASCII.sub(" ", plain)
    return plain.encode("ascii").translate(_ASCII_FOLD)


@functools.lru_cache(maxsize=1 << 12)
def _parts_only(c: str) -> bool:
    """Whether ``c``, folded, only parts tokens: no letter, digit or combining mark."""
    return not unicodedata.combining(c) and not TOKEN.search(c.casefold())


def tokens_with_offsets(text: str) -> tuple[list[str], list[int]]:
    """The folded tokens of ``text`` (as ``tokenize`` makes them) and where each starts."""
    tokens: list[str] = []
    starts: list[int] = []
    if text.isascii():
        for match in ASCII_TOKEN.finditer(text.lower()):
            tokens.append(match.group())
            starts.append(match.start())
        return tokens, starts
    for match in TOKEN.finditer(text):
        for token in tokenize(match.group()):
            tokens.append(token)
            starts.append(match.start())
    return tokens, starts


class _Stemmers(threading.local):
    """PyStemmer objects are not thread-safe: one per thread."""

    def __init__(self) -> None:
        self.stemmer = Stemmer.Stemmer("english", 0)


_stemmers = _Stemmers()
# token -> its term; "" for a stop word. Filled by indexing on first sight of a token (up to
# STEM_CACHE_MAX tokens), never changed: a speed-up only, every answer is the same without it.
_terms: dict[str, str] = dict.fromkeys(STOP_WORDS, "")


def stems_cached() -> int:
    """How many tokens the stem cache holds (it only grows, up to STEM_CACHE_MAX)."""
    return len(_terms)


def term(token: str) -> str:
    """The term of one folded token: its stem, or "" for a stop word (cached: indexing)."""
    found = _terms.get(token)
    if found is None:
        found = _stemmers.stemmer.stemWord(token)
        if len(_terms) < STEM_CACHE_MAX:
            _terms[token] = found
    return found


def stem(token: str) -> str:
    """``term`` without adding to the cache: for what a request brings."""
    found = _terms.get(token)
    return _stemmers.stemmer.stemWord(token) if found is None else found


def terms_of(tokens: list[str]) -> list[str]:
    """``term`` of each token, without adding to the cache (a first build stems each distinct
    token once in a dict of its own)."""
    stems = _stemmers.stemmer.stemWords(tokens)
    return ["" if token in STOP_WORDS else t for token, t in zip(tokens, stems, strict=True)]


def compounds(text: str) -> list[str]:
    """The joined form of each hyphenated word of ``text`` ("Wi-Fi" gives "wifi")."""
    return ["".join(tokenize(word)) for word in _COMPOUND.findall(fold(text))]


def analyze(text: str, remember: bool = True) -> list[str]:
    """The terms of ``text`` in order: folded tokens without stop words, stemmed; then the
    joined form of each hyphenated word ("Wi-Fi" also gives "wifi", "e-mail" "email").
    ``remember=False`` (a query) leaves the stem cache as it is."""
    return _terms_of(text, tokenize(text), remember)


def analyze_tokens(text: str, tokens: list[str]) -> list[str]:
    """``analyze(text)`` when ``tokens`` is ``tokenize(text)``, already made (indexing a name:
    its tokens are its name key too)."""
    return _terms_of(text, tokens, True)


def _terms_of(text: str, tokens: list[str], remember: bool) -> list[str]:
    if "-" in text:
        tokens = tokens + compounds(text)
    found = list(map(_terms.get, tokens))
    if None in found:  # a token seen for the first time
        of = term if remember else stem
        found = [of(token) if t is None else t for token, t in zip(tokens, found, strict=True)]
    return list(filter(None, found))


def query_terms(query: str) -> list[str]:
    """The first ``MAX_QUERY_TERMS`` distinct terms of a query, in order of first appearance
    (bounding the work of one query: postings and snippet scans are per term).

    ``analyze(query)``'s terms, stemmed only until that many are found: a query of 20,000
    words costs its tokenising, not 20,000 stems."""
    found: dict[str, None] = {}
    for tokens in (tokenize(query), None):
        if tokens is None:  # then the joined forms of hyphenated words, as ``analyze`` adds
            if "-" not in query:
                break
            tokens = ["".join(tokenize(word)) for word in _COMPOUND.findall(fold(query))]
        for token in tokens:
            t = stem(token)
            if t:
                found[t] = None
                if len(found) == MAX_QUERY_TERMS:
                    return list(found)
    return list(found)
