"""Snapshots in a JetStream Object Store bucket, the stream trimmed below them, and a fresh or
far-behind node restored from the newest one (a cluster runs for months: docs/operations.md).

A snapshot is a node's store at a stream position (SQLite's online backup API into a temp
file: one consistent transaction) with its projection checkpoints, as one gzip'd tar in the
bucket ``<stream>-snapshots``, named by its position. Its headers carry the position, the
decision rules of the node that made it, and a MAC (the cluster's secret) over the name, the
rules and the bytes; nats-py checks the object's SHA-256 digest on the way back. A node that
restores refuses a snapshot whose MAC or rules are not its own, as a node with other rules
follows nothing.

Trimming uses JetStream's own purge: every node reports its position in the key-value bucket
``<stream>-nodes`` (entries expire after ``POSITION_TTL_SECONDS``: a node that stops
reporting is no longer live), and the node that publishes a snapshot purges the stream below
the lowest of the retained snapshots' and the live nodes' positions. No consensus of our own:
a purge below a position everyone has covered is safe whoever does it, and redone it is a no-op.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
import sqlite3
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import nats.js.errors
from nats.js import api

from kbgraph.log.jetstream import wire
from kbgraph.projection import checkpoint

log = logging.getLogger("kbgraph.log.jetstream")

PREFIX: Final = "snapshot-"
RULES: Final = "Kbgraph-Rules"
POSITION: Final = "Kbgraph-Position"
POSITION_TTL_SECONDS: Final = 60.0
RESTORE_ATTEMPTS: Final = 3
_CHECKPOINT: Final = re.compile(r"checkpoints/(ckpt-[0-9]+\.kbg)")


class SnapshotRefused(RuntimeError):
    """The newest snapshot cannot be restored here (its MAC, its rules, its digest)."""


def bucket(stream: str) -> str:
    return f"{stream}-snapshots"


def positions_bucket(stream: str) -> str:
    return f"{stream}-nodes"


def store_position(path: Path, stream: str) -> int:
    """The stream position a store file records (0: no file, or none recorded)."""
    if not path.is_file():
        return 0
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT seq FROM log_position WHERE stream = ?", (stream,)).fetchone()
    except sqlite3.OperationalError:  # no table yet
        return 0
    finally:
        conn.close()
    return 0 if row is None else int(row[0])


def take(store: Path, checkpoints: Path | None, stream: str) -> tuple[int, bytes]:
    """(position, tar) of a consistent copy of the store and its checkpoint files. A
    checkpoint newer than the copy is useless to it and skipped by the restored node's load."""
    with tempfile.TemporaryDirectory(dir=store.parent, prefix=".snapshot-") as folder:
        copy = Path(folder) / "kb.db"
        source = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
        target = sqlite3.connect(copy)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode = DELETE")  # one file, no WAL beside it
        finally:
            source.close()
            target.close()
        position = store_position(copy, stream)
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w:gz", compresslevel=1) as tar:
            tar.add(copy, arcname="kb.db")
            for path in checkpoint.candidates(checkpoints) if checkpoints else []:
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    tar.add(path, arcname=f"checkpoints/{path.name}")
    return position, data.getvalue()


def _signed(name: str, rules: str) -> str:
    return f"{name}\n{rules}"


async def object_store(js: Any, stream: str) -> Any:
    try:
        return await js.object_store(bucket(stream))
    except nats.js.errors.NotFoundError:
        return await js.create_object_store(bucket(stream))


async def snapshots(obs: Any) -> list[Any]:
    """The bucket's snapshots, oldest first."""
    try:
        found = await obs.list(ignore_deletes=True)
    except nats.js.errors.NotFoundError:
        return []
    return sorted((info for info in found if info.name.startswith(PREFIX)), key=lambda i: i.name)


async def publish(
    js: Any,
    stream: str,
    signer: wire.Signer,
    rules: str,
    position: int,
    data: bytes,
    keep: int,
) -> str:
    """Put the snapshot, then keep the newest ``keep``; its name."""
    obs = await object_store(js, stream)
    name = f"{PREFIX}{position:020d}"
    headers = {RULES: rules, POSITION: str(position)}
    signer.sign(_signed(name, rules), data, headers)
    await obs.put(name, data, meta=api.ObjectMeta(name=name, headers=headers))
    for old in (await snapshots(obs))[:-keep]:
        await obs.delete(old.name)
    return name


async def report(js: Any, stream: str, node: str, position: int) -> None:
    """This node is live at ``position`` (for ``POSITION_TTL_SECONDS``)."""
    try:
        kv = await js.key_value(positions_bucket(stream))
    except nats.js.errors.NotFoundError:
        kv = await js.create_key_value(
            bucket=positions_bucket(stream), history=1, ttl=POSITION_TTL_SECONDS
        )
    await kv.put(node, str(position).encode())


async def live_positions(js: Any, stream: str) -> dict[str, int]:
    """The live nodes' reported positions, by node name ({} when none has reported).

    Read from the bucket's stream (its subjects, then each key's last value), not with
    nats-py's ``KeyValue.keys()``: that watcher may signal "no more keys" before the entries
    the server already pushed reach it (the consumer's ``num_pending`` is 0 while the client
    has counted none delivered), and an empty answer would let a trim cut below a live node.
    """
    name = positions_bucket(stream)
    try:
        kv = await js.key_value(name)
        info = await js.stream_info(f"KV_{name}", subjects_filter=f"$KV.{name}.>")
    except nats.js.errors.NotFoundError:
        return {}
    found: dict[str, int] = {}
    for subject in sorted(info.state.subjects or {}):
        key = subject.removeprefix(f"$KV.{name}.")
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            found[key] = int((await kv.get(key)).value)
    return found


async def trim(js: Any, stream: str) -> int:
    """Purge the stream below what the retained snapshots and every live node have covered;
    the first sequence kept (0: nothing to trim by)."""
    covered = [
        int(info.headers[POSITION]) for info in await snapshots(await object_store(js, stream))
    ]
    if not covered:
        return 0
    covered.extend((await live_positions(js, stream)).values())
    keep_from = min(covered) + 1
    if keep_from > 1:
        await js.purge_stream(stream, seq=keep_from)
    return keep_from


async def prepare(
    js: Any,
    stream: str,
    signer: wire.Signer,
    rules: str,
    store: Path,
    checkpoints: Path | None,
    node: str,
) -> None:
    """Before a node serves: it is live from here on (its position reported, so no trim goes
    past it while it starts), and restored from the newest snapshot if the stream no longer
    holds what its store needs. A trim between the check and the report shows in the next
    check: restore again (a few times at most; then the follower says the stream starts past
    this store)."""
    for _ in range(RESTORE_ATTEMPTS):
        await report(js, stream, node, store_position(store, stream))
        if await restore(js, stream, signer, rules, store, checkpoints) is None:
            return


async def restore(
    js: Any, stream: str, signer: wire.Signer, rules: str, store: Path, checkpoints: Path | None
) -> int | None:
    """When the stream no longer holds the next message ``store`` needs, replace it with the
    newest snapshot (and its checkpoints); the position restored, or None (not needed, or no
    snapshot: the follower then says the stream starts past this store)."""
    position = store_position(store, stream)
    try:
        first = int((await js.stream_info(stream)).state.first_seq)
    except nats.js.errors.NotFoundError:
        return None
    if position + 1 >= first:
        return None
    try:
        obs = await js.object_store(bucket(stream))
    except nats.js.errors.NotFoundError:
        return None
    found = await snapshots(obs)
    if not found:
        return None
    info = found[-1]
    headers = info.headers or {}
    started = time.monotonic()
    into = io.BytesIO()  # written chunk by chunk (nats-py's own buffer grows by copying)
    try:
        await obs.get(info.name, writeinto=into)
        data = into.getvalue()
    except nats.js.errors.DigestMismatchError:
        raise SnapshotRefused(f"snapshot {info.name}: its bytes do not match its digest") from None
    if not signer.valid(_signed(info.name, headers.get(RULES, "")), data, headers):
        raise SnapshotRefused(f"snapshot {info.name}: no valid MAC (not made by this cluster)")
    if headers.get(RULES) != rules:
        raise SnapshotRefused(
            f"snapshot {info.name} was made by a node deciding with {headers.get(RULES)}, this"
            f" node decides with {rules}: every node must decide alike, so it is not restored"
        )
    _unpack(data, store, checkpoints)
    restored = store_position(store, stream)
    log.warning(
        "store restored from snapshot %s at position %s (%.1f s): this node was at %s, the"
        " stream starts at %s",
        info.name,
        restored,
        time.monotonic() - started,
        position,
        first,
    )
    return restored


def _unpack(data: bytes, store: Path, checkpoints: Path | None) -> None:
    """The snapshot's store in place of ``store`` (and its WAL), its checkpoints in place of
    the folder's; only the names a snapshot holds are written."""
    store.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=store.parent, prefix=".restore-") as folder:
        staged = Path(folder)
        files: dict[str, Path] = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                match = _CHECKPOINT.fullmatch(member.name)
                if not member.isfile() or not (member.name == "kb.db" or match):
                    raise SnapshotRefused(f"snapshot holds an unexpected entry {member.name!r}")
                target = staged / (match[1] if match else "kb.db")
                source = tar.extractfile(member)
                assert source is not None
                with open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
                files[member.name] = target
        if "kb.db" not in files:
            raise SnapshotRefused("snapshot holds no store")
        for suffix in ("-wal", "-shm", ""):
            Path(f"{store}{suffix}").unlink(missing_ok=True)
        files.pop("kb.db").replace(store)
        if checkpoints is not None:
            if checkpoints.is_dir():
                for old in checkpoints.glob("ckpt-*.kbg"):
                    old.unlink()
            checkpoints.mkdir(parents=True, exist_ok=True)
            for path in files.values():
                path.replace(checkpoints / path.name)
