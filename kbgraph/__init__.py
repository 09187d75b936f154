"""kbgraph: graph retrieval for knowledge bases.

Events in (``events``) -> durable log and state (``store``) -> in-memory projection patched per
event (``projection``) -> pure graph algorithms (``graphalgo``) -> HTTP tools (``api``).
"""

from importlib.metadata import version

__version__ = version("kbgraph")  # the one version string: pyproject.toml's, as installed
