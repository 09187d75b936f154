"""Markdown vaults in (docs/sources.md): a folder of notes turned into concept states.

``markdown`` parses one note, ``resolve`` resolves link targets as Obsidian does, ``reader``
turns a folder into concept states, ``pool`` reads the notes on every core (``ahead``: with the
local store's analyses on a large import); what is sent, and how, is ``kbgraph.sources``'
manifest, sinks and sync.
"""
