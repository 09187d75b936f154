"""Snapshots in a JetStream Object Store bucket, the stream trimmed below them, and a fresh or
far-behind node restored from the newest one (a cluster runs for months: docs/operations.md).

A snapshot is a node's store at a stream position with the projection checkpoint it can be
followed from (``kbgraph.log.jetstream.snapshotfile``: one zstd'd tar), in the bucket
``<stream>-snapshots``, named by its position. Its headers carry the position, the decision
rules of the node that made it, its encoding and unpacked size, and a MAC (the cluster's
secret) over the name, the rules, the encoding, the size and the bytes; nats-py checks the
object's SHA-256 digest on the way back. A node that restores unpacks the snapshot into a
staging folder as it arrives and moves it into place only once the whole object has been
fetched and its digest, MAC and rules checked: it refuses a snapshot whose MAC or rules are
not its own (as a node with other rules follows nothing), and a refusal leaves nothing.

Trimming uses JetStream's own purge: every node reports its position in the key-value bucket
``<stream>-nodes`` (entries expire after ``POSITION_TTL_SECONDS``: a node that stops
reporting is no longer live), and the node that publishes a snapshot purges the stream below
the lowest of the retained snapshots' and the live nodes' positions. No consensus of our own:
a purge below a position everyone has covered is safe whoever does it, and redone it is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any, Final

import nats.js.errors
from nats.js import api

from kbgraph.log.jetstream import wire
from kbgraph.log.jetstream.snapshotfile import (
    ENCODING_ZSTD,
    UNPACKED,
    Packed,
    SnapshotRefused,
    Unpacker,
)
from kbgraph.store import positions

log = logging.getLogger("kbgraph.log.jetstream")

PREFIX: Final = "snapshot-"
RULES: Final = "Kbgraph-Rules"
POSITION: Final = "Kbgraph-Position"
POSITION_TTL_SECONDS: Final = 60.0
RESTORE_ATTEMPTS: Final = 3
FETCH_STALL_SECONDS: Final = 2.0  # no chunk for this long: is the snapshot still there?

__all__ = ["SnapshotRefused"]  # raised here, defined beside the unpacking


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
        return positions.position(conn, stream)
    finally:
        conn.close()


def _signed(name: str, headers: dict[str, str]) -> str:
    """What a snapshot's MAC covers besides its bytes (and wire.ENCODING): its name, rules
    and, where it declares one (every snapshot since zstd), its unpacked size."""
    signed = f"{name}\n{headers.get(RULES, '')}"
    return signed if UNPACKED not in headers else f"{signed}\n{headers[UNPACKED]}"


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
    packed: Packed,
    keep: int,
) -> str:
    """Put the snapshot, then keep the newest ``keep``; its name."""
    obs = await object_store(js, stream)
    name = f"{PREFIX}{packed.position:020d}"
    headers = {
        RULES: rules,
        POSITION: str(packed.position),
        wire.ENCODING: ENCODING_ZSTD,
        UNPACKED: str(packed.unpacked),
    }
    signer.sign(_signed(name, headers), packed.data, headers)
    await obs.put(name, packed.data, meta=api.ObjectMeta(name=name, headers=headers))
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
    for _ in range(RESTORE_ATTEMPTS):
        found = await snapshots(obs)
        if not found:
            return None
        restored = await _restore_from(obs, found[-1], signer, rules, stream, store, checkpoints)
        if restored is not None:
            at, took = restored
            log.warning("%s: this node was at %s, the stream starts at %s", took, position, first)
            return at
    return None  # each listed snapshot was replaced before it was fetched: the follower says why


async def _restore_from(
    obs: Any,
    info: Any,
    signer: wire.Signer,
    rules: str,
    stream: str,
    store: Path,
    checkpoints: Path | None,
) -> tuple[int, str] | None:
    """``store`` (and its checkpoints) replaced by snapshot ``info``: the position restored and
    what to log; None when ``info`` was deleted before it was fetched (a newer snapshot took its
    place, as the bucket keeps only the newest ``snapshots_keep``: list again)."""
    headers = info.headers or {}
    started = time.monotonic()
    unpacker = Unpacker(store, headers.get(wire.ENCODING, ""), headers.get(UNPACKED))
    try:
        sink = _Sink(signer.begin(_signed(info.name, headers), headers), unpacker)
        try:
            if not await _fetched(obs, info.name, sink):
                log.info("snapshot %s was deleted while it was fetched: listing again", info.name)
                return None
        except nats.js.errors.NotFoundError:
            log.info("snapshot %s was replaced before it was fetched: listing again", info.name)
            return None
        except nats.js.errors.DigestMismatchError:
            raise SnapshotRefused(
                f"snapshot {info.name}: its bytes do not match its digest"
            ) from None
        fetched = time.monotonic()
        if not signer.matches(sink.mac, headers):
            raise SnapshotRefused(f"snapshot {info.name}: no valid MAC (not made by this cluster)")
        if headers.get(RULES) != rules:
            raise SnapshotRefused(
                f"snapshot {info.name} was made by a node deciding with {headers.get(RULES)}, this"
                f" node decides with {rules}: every node must decide alike, so it is not restored"
            )
        try:
            await asyncio.to_thread(unpacker.finish)
        except SnapshotRefused as exc:
            raise SnapshotRefused(f"snapshot {info.name}: {exc}") from None
        unpacked = time.monotonic()
        unpacker.install(store, checkpoints)
    finally:
        unpacker.discard()
    restored = store_position(store, stream)
    took = (
        f"store restored from snapshot {info.name} at position {restored} in"
        f" {time.monotonic() - started:.1f} s ({sink.size / 2**20:.1f} MB fetched and unpacked as"
        f" they came in {fetched - started:.1f} s, the rest unpacked in {unpacked - fetched:.1f}"
        f" s, {headers.get(wire.ENCODING) or 'gzip'})"
    )
    return restored, took


async def _fetched(obs: Any, name: str, sink: _Sink) -> bool:
    """Object ``name`` fetched into ``sink``; False when it was deleted meanwhile (a newer
    snapshot took its place). nats-py's ``get`` waits for chunks without end, and a deleted
    object's chunks are purged: so whenever no chunk came for ``FETCH_STALL_SECONDS``, the
    object is looked up, and the fetch is given up once it is gone."""
    fetch = asyncio.ensure_future(obs.get(name, writeinto=sink))
    seen = -1
    while not (await asyncio.wait({fetch}, timeout=FETCH_STALL_SECONDS))[0]:
        if sink.size == seen:
            try:
                await obs.get_info(name)
            except nats.js.errors.NotFoundError:
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fetch
                return False
        seen = sink.size
    await fetch  # its own errors (a digest that does not match, say) to the caller
    return True


class _Sink:
    """Where nats-py writes the fetched chunks, in order: the MAC and the unpacking."""

    def __init__(self, mac: hmac.HMAC, unpacker: Unpacker) -> None:
        self.mac, self.unpacker, self.size = mac, unpacker, 0

    def write(self, chunk: bytes) -> int:
        self.mac.update(chunk)
        self.size += len(chunk)
        return self.unpacker.write(chunk)
