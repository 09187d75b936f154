"""Sources in (docs/sources.md): producers of concept events, beside ``kbgraph.events``.

What every source shares is here: ``manifest`` remembers what was sent where, ``sinks``
deliver (the local store or a signed webhook), ``sync`` diffs and sends, ``command`` is
``kbgraph import`` / ``sync``, ``demokb`` is the demo's data. One package per source:
``vault`` (a folder of markdown notes), ``logseq`` (a Logseq graph), ``mediawiki`` (a dump or
a live wiki).
"""
