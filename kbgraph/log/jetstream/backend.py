"""The JetStream backend's face to ``kbgraph.log.backends``: the log a process opens, what
``kbgraph serve`` checks and starts before its workers.

With ``serve --workers N``, one applier process applies the stream (``applier.Supervisor``) and
each worker publishes (``WorkerLog``): ``start_applier`` says so to uvicorn's workers in
``APPLIER_ENV``, an environment variable being what reaches them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from kbgraph.config import Config
from kbgraph.log import DeliveryLog
from kbgraph.projection import Projections
from kbgraph.store import Store

APPLIER_ENV: Final = "KBGRAPH_APPLIER"  # set by kbgraph serve: the workers publish, not apply


def open_log(config: Config, store: Store, projections: Projections) -> DeliveryLog:
    """A node's ``JetStreamLog``, or a ``WorkerLog`` in a worker beside the node's applier."""
    if os.environ.get(APPLIER_ENV):  # one of several workers: the node's applier applies
        from kbgraph.log.jetstream.worker import WorkerLog

        return WorkerLog(config.log.jetstream, store, projections)
    from kbgraph.log.jetstream.node import JetStreamLog

    return JetStreamLog(
        config.log.jetstream,
        store,
        on_applied=projections.kick,
        checkpoints=config.store.checkpoint_folder,
        vector_max_chars=config.embeddings.max_chars,
    )


def serving_problem(config: Config) -> str | None:
    """Why ``kbgraph serve`` cannot start (a secret unreadable, a restore failed), or None;
    restores a snapshot into an empty store first."""
    from kbgraph.log.jetstream.connect import secrets_problem

    problem = secrets_problem(config.log.jetstream)
    if problem:
        return problem
    from kbgraph.log.jetstream.admin import restore_before_serving

    return restore_before_serving(config)


def start_applier(config_path: Path, workers: int, log_level: str) -> Callable[[], None] | None:
    """With several workers, the node's one applier process, started; its stop (else None)."""
    if workers <= 1:
        return None
    from kbgraph.log.jetstream.applier import Supervisor

    supervisor = Supervisor(config_path, log_level)
    supervisor.start()
    os.environ[APPLIER_ENV] = "1"
    return supervisor.stop
