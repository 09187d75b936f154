"""Opening the store as the config says, and why it would not open: one line naming the
path and the cause (``kbgraph serve`` and ``kbgraph import --config`` stop with it, exit 2,
without a traceback), before anything is started.

``open_store`` is the one way a process opens its store (the service, the JetStream applier, a
source writing to the local store): the same KB limit, KB names and dedupe-key retention.
``store_problem`` opens it once as the service will (schema, WAL, lock file); kbgraph creates
the store file, never its folder (``store_folder_problem``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kbgraph.config import Config
from kbgraph.embeddings import Embedder
from kbgraph.embeddings.carried import Carrier
from kbgraph.embeddings.providers import local_model, make_embedder
from kbgraph.store.sqlite import Store


def open_store(
    config: Config, *, read_only: bool = False, embedder: Embedder | None = None
) -> Store:
    """The store as the config says (a read-only one for ``kbgraph mcp``). With the local
    model (``embedder``, else the config's), the store makes each upsert's vector once and
    carries it in the log (``kbgraph.embeddings.carried``); a remote provider's are not."""
    if read_only:
        return Store(config.store.path, read_only=True)
    if embedder is None and local_model(config.embeddings):
        embedder = make_embedder(config.embeddings)
    carrier = (
        Carrier(embedder, config.embeddings.max_chars)
        if embedder is not None and not embedder.remote
        else None
    )
    return Store(
        config.store.path,
        max_kbs=config.limits.max_kbs,
        named_kbs=frozenset(config.webhooks.kbs),
        dedupe_keys=config.store.dedupe_keys,
        carrier=carrier,
    )


def describe(exc: BaseException) -> str:
    """The cause of a store failure in a few words (no traceback, no repr)."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    return str(exc) or type(exc).__name__


def store_folder_problem(path: str) -> str | None:
    """Why the store at ``path`` has no folder to live in, or None: kbgraph creates the store
    file, never its folder (a mistyped path would quietly make a new, empty store)."""
    target = Path(path)
    for folder in target.parents:
        if folder.exists():
            if not folder.is_dir():
                return f"store {path}: {folder} is not a directory"
            break
    if not target.parent.is_dir():
        return f"store {path}: the folder {target.parent} does not exist (create it first)"
    return None


def store_problem(path: str) -> str | None:
    """None when the store at ``path`` opens for writing, else "store <path>: <cause>"."""
    if Path(path).is_dir():
        return f"store {path}: is a directory"
    problem = store_folder_problem(path)
    if problem:
        return problem
    try:
        Store(path).close()
    except (OSError, sqlite3.Error) as exc:
        return f"store {path}: {describe(exc)}"
    return None
