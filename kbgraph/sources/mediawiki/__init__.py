"""MediaWiki in (docs/mediawiki.md): a dump imported, or a live wiki followed, as concept events.

``titles`` names pages as the wiki does (namespaces, first-letter case) and maps them to
concept ids, ``wikitext`` reads a page's links, categories and plain text with
mwparserfromhell, ``concepts`` turns pages into concept states (sent, when they changed, by
``kbgraph.sources.deliver`` through the sources' manifest and sinks), ``dump`` reads
an XML dump (mwxml), ``api`` asks a wiki's Action API
(``answers``: the shapes of its answers), ``follow`` follows its recent changes,
``command`` is the CLI.
"""
