"""Markdown vaults in (docs/sources.md): a connector beside ``kbgraph.events``, producing events.

``markdown`` parses one note, ``resolve`` resolves link targets as Obsidian does, ``reader``
turns a folder into concept states, ``manifest`` remembers what was sent where, ``sinks``
deliver (local store or signed webhook), ``sync`` diffs and sends, ``command`` is the CLI.
"""
