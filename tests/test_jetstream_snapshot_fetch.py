"""A fresh node's fetch of a snapshot that the origin deletes while the node is reading it.

A real server cannot be made to delete an object between two of its chunks on cue (it pushes
a small object's chunks at once), so the bucket here is an in-memory one that behaves as
nats-py's Object Store does: ``get`` looks the object up, hands its chunks to ``writeinto``
in order, and, once the object is deleted and its chunks purged, waits for the rest without
end. The restore is the real one, over snapshots published by the real ``publish``."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import nats.js.errors
import pytest
from nats.js import api

from kbgraph.log.jetstream import snapshots, wire
from kbgraph.log.jetstream.snapshotfile import Packed, take
from kbgraph.store import Store
from tests.kb_events import upsert

pytestmark = pytest.mark.anyio

STREAM = "t-fetch"
RULES = "rules-of-this-cluster"
CHUNK = 1024
DEADLINE_SECONDS = 30.0
SIGNER = wire.Signer(b"s" * wire.MIN_SECRET_BYTES)


class Bucket:
    """An Object Store bucket as ``snapshots`` uses one. ``interrupt`` runs once, after the
    first chunk of the first fetch: the origin's work while the node reads."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.interrupt: Callable[[], Awaitable[None]] | None = None
        self.fetches: list[tuple[str, int]] = []  # (name, bytes handed over)

    def info(self, name: str) -> api.ObjectInfo:
        if name not in self.objects:
            raise nats.js.errors.NotFoundError
        data, headers = self.objects[name]
        return api.ObjectInfo(name=name, bucket="b", nuid=name, size=len(data), headers=headers)

    async def put(self, name: str, data: bytes, meta: api.ObjectMeta) -> None:
        self.objects[name] = (data, dict(meta.headers or {}))

    async def delete(self, name: str) -> None:
        del self.objects[name]

    async def list(self, ignore_deletes: bool) -> list[api.ObjectInfo]:
        assert ignore_deletes
        if not self.objects:
            raise nats.js.errors.NotFoundError
        return [self.info(name) for name in self.objects]

    async def get_info(self, name: str) -> api.ObjectInfo:
        return self.info(name)

    async def get(self, name: str, writeinto: Any) -> None:
        data = self.objects[self.info(name).name][0]
        self.fetches.append((name, 0))
        for at in range(0, len(data), CHUNK):
            if name not in self.objects:  # purged: nats-py's subscription waits on
                await anyio.sleep_forever()
            writeinto.write(data[at : at + CHUNK])
            self.fetches[-1] = (name, min(len(data), at + CHUNK))
            if self.interrupt is not None:
                interrupt, self.interrupt = self.interrupt, None
                await interrupt()


def jetstream(bucket: Bucket, first_seq: int) -> Any:
    """The few JetStream calls ``publish`` and ``restore`` make, over ``bucket``."""

    async def object_store(name: str) -> Bucket:
        assert name == snapshots.bucket(STREAM)
        return bucket

    async def stream_info(name: str) -> Any:
        assert name == STREAM
        return SimpleNamespace(state=SimpleNamespace(first_seq=first_seq))

    return SimpleNamespace(object_store=object_store, stream_info=stream_info)


def from_the_stream(store: Store, seq: int) -> None:
    """One delivery applied at stream position ``seq``, as a follower applies it."""
    done, errors = threading.Event(), []

    def resolve(result: object, error: BaseException | None) -> None:
        errors.append(error)
        done.set()

    store.submit_from_log("kb", [upsert(f"s/{seq}")], None, 0.0, (STREAM, seq), resolve)
    assert done.wait(DEADLINE_SECONDS) and errors == [None], errors


def packs(folder: Path, positions: list[int]) -> list[Packed]:
    """One store, packed at each of ``positions`` (consecutive, from 1)."""
    folder.mkdir()
    path, made = folder / "kb.db", []
    with Store(path) as store:
        texts = [upsert(f"c/{i}", text=f"words of concept {i} " * 50) for i in range(40)]
        store.append("kb", texts)
        for seq in positions:
            from_the_stream(store, seq)
            made.append(take(path, None, STREAM))
    return made


async def restored_fresh(js: Any, folder: Path) -> tuple[int | None, Path]:
    """A fresh node's restore into ``folder`` (no store there yet), within the test's deadline:
    the position restored, and the store's path."""
    folder.mkdir()
    store = folder / "kb.db"
    with anyio.fail_after(DEADLINE_SECONDS):
        return await snapshots.restore(js, STREAM, SIGNER, RULES, store, None), store


async def test_a_snapshot_deleted_while_it_is_fetched_is_given_up_and_the_newer_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The origin puts a newer snapshot and deletes the one being fetched after its first
    chunk (``snapshots_keep = 1``): the fetch stalls, the restore looks the object up, finds it
    gone, lists again and restores the newer one, well before the test's deadline (before the
    fix it waited for the purged chunks until ``RESTORE_SECONDS``)."""
    monkeypatch.setattr(snapshots, "FETCH_STALL_SECONDS", 0.2)
    older, newer = packs(tmp_path / "origin", [1, 2])
    assert len(older.data) > 2 * CHUNK  # more than one chunk, so there is a "mid-fetch"
    bucket = Bucket()
    js = jetstream(bucket, first_seq=5)  # a fresh store (position 0) needs a snapshot
    first = await snapshots.publish(js, STREAM, SIGNER, RULES, older, keep=1)

    async def replace() -> None:
        await snapshots.publish(js, STREAM, SIGNER, RULES, newer, keep=1)

    bucket.interrupt = replace
    restored, fresh = await restored_fresh(js, tmp_path / "fresh")
    assert restored == 2 and snapshots.store_position(fresh, STREAM) == 2
    second = snapshots.PREFIX + f"{2:020d}"
    assert bucket.fetches == [(first, CHUNK), (second, len(newer.data))]
    assert list(bucket.objects) == [second]
    assert not list(fresh.parent.glob(".*")), "a staging folder was left behind"


async def test_a_slow_fetch_of_a_snapshot_still_there_is_not_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No chunk for longer than ``FETCH_STALL_SECONDS`` while the snapshot is still in the
    bucket (a slow link): the lookup finds it, and the same fetch goes on to the end."""
    monkeypatch.setattr(snapshots, "FETCH_STALL_SECONDS", 0.1)
    (only,) = packs(tmp_path / "origin", [1])
    bucket = Bucket()
    js = jetstream(bucket, first_seq=5)
    name = await snapshots.publish(js, STREAM, SIGNER, RULES, only, keep=1)

    async def stall() -> None:
        await anyio.sleep(0.5)  # five stall periods with no chunk

    bucket.interrupt = stall
    restored, fresh = await restored_fresh(js, tmp_path / "fresh")
    assert restored == 1 and snapshots.store_position(fresh, STREAM) == 1
    assert bucket.fetches == [(name, len(only.data))]
