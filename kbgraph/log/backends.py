"""The one place a delivery log is chosen: ``[log] kind`` names a backend, a package under
``kbgraph/log/`` behind the ``DeliveryLog`` protocol.

``open_log`` opens the process's log; ``serving_problem`` and ``start_helpers`` are what
``kbgraph serve`` asks of the backend before it starts its workers. A backend's package is
imported only when its kind is chosen (nats-py for ``jetstream``), so its optional extra
(``kbgraph.extras``, named as the kind) is needed only then.

A new backend (Kafka, say) is its own package here plus three existing files: this one (its
branch in each function), ``kbgraph/config.py`` (its kind in ``[log]`` and its settings) and
``kbgraph/extras.py`` (its extra's packages).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kbgraph.config import Config
from kbgraph.log import DeliveryLog
from kbgraph.log.sqlite import StoreLog
from kbgraph.projection import Projections
from kbgraph.store import Store


def open_log(
    config: Config, store: Store, projections: Projections, *, read_only: bool = False
) -> DeliveryLog:
    """The one delivery log of this process (a read-only process reads the store alone)."""
    if read_only or config.log.kind == "sqlite":
        return StoreLog(store, projections.kick)
    from kbgraph.log.jetstream import backend as jetstream

    return jetstream.open_log(config, store, projections)


def serving_problem(config: Config) -> str | None:
    """Why ``kbgraph serve`` cannot start with this log (checked before the store), or None."""
    if config.log.kind == "sqlite":
        return None
    from kbgraph.log.jetstream import backend as jetstream

    return jetstream.serving_problem(config)


def start_helpers(
    config: Config, config_path: Path, workers: int, log_level: str
) -> Callable[[], None] | None:
    """What must run beside ``kbgraph serve``'s workers, started; its stop (else None)."""
    if config.log.kind == "sqlite":
        return None
    from kbgraph.log.jetstream import backend as jetstream

    return jetstream.start_applier(config_path, workers, log_level)


def writes_locally(config: Config) -> bool:
    """May a source write this process's store directly (``kbgraph import --config``)? Only
    beside the store's own log: a store that follows a stream would fork from it."""
    return config.log.kind == "sqlite"
