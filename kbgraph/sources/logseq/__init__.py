"""Logseq graphs in (docs/logseq.md): ``reader`` reads a graph folder with Logseq's names,
journals and references, in place of the markdown vault's scan."""
