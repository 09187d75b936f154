"""kbgraph: graph retrieval for knowledge bases.

Events in (``events``) -> durable log and state (``store``) -> in-memory projection patched per
event (``projection``) -> pure graph algorithms (``graphalgo``) -> HTTP tools (``api``).
"""

__version__ = "0.1.0"
