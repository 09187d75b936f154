"""Sources in (docs/sources.md): producers of concept events, beside ``kbgraph.events``.

What every source shares is here: ``manifest`` remembers what was sent where, ``sinks``
deliver (the local store or a signed webhook), ``sync`` diffs and sends, ``hook`` is how a
source plugs into ``command``, which is ``kbgraph import`` / ``sync``, ``demokb`` is the
demo's data. One package per source: ``vault`` (a folder of markdown notes), ``logseq`` (a
Logseq graph), ``mediawiki`` (a dump or a live wiki).
"""
