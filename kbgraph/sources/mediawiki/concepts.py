"""Pages as concepts: the one rule both the dump import and the live follower apply.

- A page that is not a redirect is a concept (``titles``: id ``{namespace}/{text}``, the
  namespace its collection, the full title its title); a redirect is not one.
- Its ``aliases``: the full titles of the redirects to it (one hop, as MediaWiki follows
  redirects: a redirect to a redirect gives nothing), so a page moved with a redirect left
  behind is found by its old name too.
- ``tags``: its categories. ``text``: its plain text (``wikitext``). ``links``: the concept ids
  of its links, each through a redirect when the target is one (one hop: a reader following
  ``[[NYC]]`` lands on "New York City"), without itself; a link to a page that does not exist
  keeps that page's id, so it becomes an edge when the page is made.
- What would break a bound of the events (docs/operations.md) is cut and said so: more than
  64 aliases or 256 categories, more than 10,000 links, a text over 1 MiB (cut at a character),
  a title whose id breaks the id rules (a page ``A//B``) is no concept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from kbgraph.events import (
    MAX_ALIAS_CHARS,
    MAX_ALIASES,
    MAX_LINKS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TEXT_BYTES,
    MAX_TITLE_CHARS,
    UpsertData,
)
from kbgraph.names import concept_id_problem
from kbgraph.sources.deliver import SourceConcept
from kbgraph.sources.mediawiki.titles import Namespaces, Title
from kbgraph.sources.mediawiki.wikitext import PageFields

SOURCE: Final = "kbgraph-mediawiki"  # the events' CloudEvents source


def concept_of(
    title: Title,
    fields: PageFields,
    aliases: Iterable[Title],
    resolve: Callable[[Title], Title],
    namespaces: Namespaces,
    warnings: list[str],
) -> SourceConcept | None:
    """The concept of page ``title`` (not a redirect), or None when its id breaks the id
    rules; ``resolve`` follows a link's target through a redirect (one hop). Each cut made to
    fit the bounds is added to ``warnings``."""
    cid = namespaces.concept_id(title)
    shown = namespaces.display(title)
    problem = concept_id_problem(cid)
    if problem:
        warnings.append(f"{shown}: {problem}: not imported")
        return None
    links: dict[str, None] = {}
    for target in fields.links:
        linked = namespaces.concept_id(resolve(target))
        if linked != cid and concept_id_problem(linked) is None:
            links.setdefault(linked, None)
    alias_titles = sorted({namespaces.display(a) for a in aliases} - {shown})
    tags = fields.categories
    text = fields.text
    if len(alias_titles) > MAX_ALIASES or any(len(a) > MAX_ALIAS_CHARS for a in alias_titles):
        warnings.append(f"{shown}: redirects cut to {MAX_ALIASES} aliases")
        alias_titles = [a for a in alias_titles if len(a) <= MAX_ALIAS_CHARS][:MAX_ALIASES]
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS for t in tags):
        warnings.append(f"{shown}: categories cut to {MAX_TAGS} tags")
        tags = [t for t in tags if len(t) <= MAX_TAG_CHARS][:MAX_TAGS]
    if len(links) > MAX_LINKS or fields.links_cut:
        warnings.append(f"{shown}: links cut to {MAX_LINKS}")
    if len(text) > MAX_TEXT_BYTES // 4 and len(text.encode()) > MAX_TEXT_BYTES:
        warnings.append(f"{shown}: text cut to 1 MiB")
        text = text.encode()[:MAX_TEXT_BYTES].decode("utf-8", "ignore")
    data = UpsertData(
        version=0,
        title=shown[:MAX_TITLE_CHARS],
        aliases=alias_titles,
        tags=tags,
        text=text,
        links=list(links)[:MAX_LINKS],
    )
    return SourceConcept.of(cid, data)
