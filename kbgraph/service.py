"""The one place the service is built from its config: the store, the delivery log, the
projections with their embedder, and the tool threads (``kbgraph serve``'s workers through
``kbgraph.api``, ``kbgraph mcp``).

The store is opened as every process opens it (``kbgraph.store.opening.open_store``), the log
as ``[log] kind`` says (``kbgraph.log.backends.open_log``, the one place it is chosen).
"""

from __future__ import annotations

import gc
from typing import Final

from kbgraph import graphalgo, search
from kbgraph.agent import evidence
from kbgraph.config import Config
from kbgraph.embeddings.providers import make_embedder
from kbgraph.graphalgo import nearest as vector_kernels
from kbgraph.log import DeliveryLog
from kbgraph.log.backends import open_log
from kbgraph.projection import Projections
from kbgraph.projection.hold import HOLD_SECONDS
from kbgraph.store import Store
from kbgraph.store.opening import open_store
from kbgraph.threads import ToolThreads

TOOL_THREADS: Final = 2  # one per core: the kernels run in parallel, the Python parts share the GIL


def warm_up() -> None:
    """Compile (or load from the cache) every numba kernel a request may run."""
    graphalgo.warm_up()
    vector_kernels.warm_up()
    search.warm_up()
    evidence.warm_up()


def settle_heap() -> None:
    """For a serving process, once it is ready: what start-up made (the modules, the kernels,
    the model's tables, the projection's first build) is collected once and then frozen out of
    the cyclic collector's walks (``gc.freeze``). Without it each full collection walked the
    whole start-up heap (130-250 ms on an empty store, every few seconds of ingest, every
    thread paused). Frozen objects are still freed by their reference counts; only a cycle
    among them is never collected."""
    gc.collect()
    gc.freeze()


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
        embedder = make_embedder(config.embeddings)  # one model for the store and projections
        self.store = open_store(config, read_only=self.read_only, embedder=embedder)
        self.projections = Projections(
            self.store,
            checkpoints=config.store.checkpoint_folder,
            checkpoint_every=config.store.checkpoint_every_events,
            log_retain=config.store.log_retain_events,
            embedder=embedder,
            vector_max_chars=config.embeddings.max_chars,
            mentions=config.mentions.on_for,
            # over JetStream a delivery's 200 waits for this follower: no hold there
            hold=HOLD_SECONDS if config.log.kind == "sqlite" else 0.0,
        )
        self.log = open_log(config, self.store, self.projections, read_only=self.read_only)
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

    def settle(self) -> None:
        """Once a serving process is ready: its heap settled (``settle_heap``) now, and again
        after each reload of the projections, whose new KBs every full collection would
        otherwise walk. The collection runs in the follower thread, after the reload; it
        pauses every thread as any full collection does, once a reload instead of every time
        the collector's oldest generation grows by a quarter."""
        self.projections.add_reload_listener(settle_heap)  # first: a reload meanwhile is settled
        settle_heap()

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
