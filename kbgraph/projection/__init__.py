"""The in-memory projection of every KB's link graph, patched per log record.

The package, along its jobs (events in -> store/log -> projection -> graphalgo):

- ``follower``: ``Projections``, one thread per process following the store's log, batches,
  locks and waiters; ``hold``: when it waits for more commits before a read;
- ``kb``: ``KBProjection``, one KB's state and the semantics of each record as patches to
  its parts:
  - ``nodes``: ``Nodes``, the per-node columns, existence and classes;
  - ``links``: ``Links``, adjacency, the ids' bytes and links to missing concepts;
  - ``masks``: ``MaskCache``, visibility masks and their induced degrees;
  - ``mentions``: ``Mentions``, the edges of texts naming other concepts;
- ``bulk``: the first build from the store's columns;
- ``snapshot``: ``Snapshot``, what a request reads under the read lock;
- ``adjacency``: the flat id-sorted adjacency pools and their numba patch kernels;
- ``keys``: ids as UTF-8 bytes, so kernels compare ids in ``str`` order;
- ``checkpoint``: every KB's arrays in one file; ``vectors`` and ``filler``: concept vectors;
- ``arrays``: growing numpy arrays.
"""

from kbgraph.projection.follower import Projections
from kbgraph.projection.kb import KBProjection
from kbgraph.projection.snapshot import Snapshot
from kbgraph.projection.warmup import warm_up

__all__ = ["KBProjection", "Projections", "Snapshot", "warm_up"]
