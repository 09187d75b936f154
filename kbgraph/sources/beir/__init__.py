"""A BEIR-format corpus in (docs/beir.md): ``corpus.jsonl``, one passage a line, each a concept.

``corpus`` reads and checks the file a line at a time, ``command`` is ``kbgraph import --beir``;
what changed is sent by ``kbgraph.sources.deliver`` through the sources' manifest and sinks.
"""
