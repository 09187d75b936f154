"""The one place the service is built from its config: the store, the delivery log, the
projections with their embedder, and the tool threads (``kbgraph serve``'s workers through
``kbgraph.api``, ``kbgraph mcp``, the JetStream applier's store).

The log is chosen here and nowhere else (``make_log``): ``[log] kind = "sqlite"`` is the
store's own table (``kbgraph.log.StoreLog``); ``kind = "jetstream"`` is a node's
``JetStreamLog``, or a ``WorkerLog`` in each worker of ``serve --workers N`` (``kbgraph
serve`` says so to its uvicorn workers in ``APPLIER_ENV``: an environment variable is what
reaches them). nats-py is imported only on the JetStream branch.
"""

from __future__ import annotations

import os
from typing import Final

from kbgraph import graphalgo, search
from kbgraph.agent import evidence
from kbgraph.config import Config
from kbgraph.embeddings import make_embedder
from kbgraph.graphalgo import nearest as vector_kernels
from kbgraph.log import DeliveryLog, StoreLog
from kbgraph.projection import Projections
from kbgraph.store import Store
from kbgraph.threads import ToolThreads

APPLIER_ENV: Final = "KBGRAPH_APPLIER"  # set by kbgraph serve: the workers publish, not apply
TOOL_THREADS: Final = 2  # one per core: the kernels run in parallel, the Python parts share the GIL


def open_store(config: Config, *, read_only: bool = False) -> Store:
    """The store as the config says (a read-only one for ``kbgraph mcp``)."""
    if read_only:
        return Store(config.store.path, read_only=True)
    return Store(
        config.store.path,
        max_kbs=config.limits.max_kbs,
        named_kbs=frozenset(config.webhooks.kbs),
        dedupe_keys=config.store.dedupe_keys,
    )


def make_log(config: Config, store: Store, projections: Projections) -> DeliveryLog:
    """The one delivery log of this process (see the module's text)."""
    if config.log.kind != "jetstream":
        return StoreLog(store, projections.kick)
    if os.environ.get(APPLIER_ENV):  # one of several workers: the node's applier applies
        from kbgraph.log.jetstream.worker import WorkerLog

        return WorkerLog(config.log, store, projections)
    from kbgraph.log.jetstream.node import JetStreamLog

    return JetStreamLog(
        config.log,
        store,
        on_applied=projections.kick,
        checkpoints=config.store.checkpoint_folder,
        vector_max_chars=config.embeddings.max_chars,
    )


def warm_up() -> None:
    """Compile (or load from the cache) every numba kernel a request may run."""
    graphalgo.warm_up()
    vector_kernels.warm_up()
    search.warm_up()
    evidence.warm_up()


class Service:
    """What one process serves from. ``Service(config)`` holds only the config; ``open``
    (blocking: the store, the projection's first build, the kernels) then ``await follow()``;
    ``await close()`` undoes both, in order."""

    store: Store
    projections: Projections
    log: DeliveryLog
    tool_threads: ToolThreads

    def __init__(self, config: Config, *, read_only: bool = False) -> None:
        self.config = config
        self.read_only = read_only

    def open(self) -> None:
        """Open the store, build the log and the projections, load or build them and start
        following the store; compile the kernels."""
        config = self.config
        self.store = open_store(config, read_only=self.read_only)
        self.projections = Projections(
            self.store,
            checkpoints=config.store.checkpoint_folder,
            checkpoint_every=config.store.checkpoint_every_events,
            log_retain=config.store.log_retain_events,
            embedder=make_embedder(config.embeddings),
            vector_max_chars=config.embeddings.max_chars,
        )
        self.log = (
            StoreLog(self.store, self.projections.kick)  # never appended to: reads only
            if self.read_only
            else make_log(config, self.store, self.projections)
        )
        self._share_embedder()
        self.tool_threads = ToolThreads(TOOL_THREADS)
        self.projections.start()
        warm_up()

    def _share_embedder(self) -> None:
        """With a provider outside the process, the log may say who embeds for several
        stores (a JetStream cluster: one process of all its nodes)."""
        filler = self.projections.filler
        if filler is not None and filler.embedder.remote:
            share = self.log.vector_share()
            if share is not None:
                filler.share_with(share)

    async def follow(self) -> None:
        await self.log.follow()

    async def close(self) -> None:
        await self.log.close()
        self.stop()

    def stop(self) -> None:
        """The synchronous part of ``close``: threads, projections, store."""
        self.tool_threads.close()
        self.projections.stop()
        self.store.close()
