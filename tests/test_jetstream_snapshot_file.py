"""A snapshot's bytes without NATS (``kbgraph.log.jetstream.snapshotfile``): a store and the
checkpoint it can follow from, packed and unpacked chunk by chunk into place, the restored
node's projection loaded from that checkpoint; a gzip'd snapshot of an older node still
restores; whatever is not a packed store, or unpacks past its declared size, is refused and
leaves nothing in place. The MAC and rules checks over a real cluster:
``test_jetstream_snapshots.py``."""

from __future__ import annotations

import io
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard

from kbgraph.log.jetstream.snapshotfile import ENCODING_ZSTD, SnapshotRefused, Unpacker, take
from kbgraph.projection import Projections, checkpoint
from kbgraph.store import Store
from tests.kb_events import upsert

STREAM = "t-file"
KB = "kb"
CHUNK = 4096
WAIT_SECONDS = 30.0


def at_position(store: Store, seq: int) -> None:
    """One delivery applied as a follower of ``STREAM`` applies it, at ``seq``."""
    done = threading.Event()
    failed: list[BaseException] = []

    def resolve(result: object, error: BaseException | None) -> None:
        if error is not None:
            failed.append(error)
        done.set()

    store.submit_from_log(KB, [upsert(f"s/{seq}")], None, 0.0, (STREAM, seq), resolve)
    assert done.wait(WAIT_SECONDS) and not failed, failed


def filled(folder: Path) -> tuple[Path, Path, list[Path]]:
    """A store at stream position 2 with two checkpoints (the older one kept too), and a
    delivery past the newer; (store, checkpoint folder, checkpoints newest first)."""
    folder.mkdir()
    path, checkpoints = folder / "kb.db", folder / "ckpt"
    with Store(path) as store:
        for i in range(30):
            store.append(KB, [upsert(f"c/{i}", links=[f"c/{i - 1}"] if i else [])])
        p = Projections(store, checkpoints=checkpoints, log_retain=1000)
        p.load()
        assert p.write_checkpoint() is not None
        at_position(store, 1)
        while p.follow_once():
            pass
        assert p.write_checkpoint() is not None
        at_position(store, 2)
    return path, checkpoints, checkpoint.candidates(checkpoints)


def unpack(
    data: bytes, store: Path, checkpoints: Path, encoding: str, declared: str | None
) -> None:
    """``data`` fed chunk by chunk and moved into place, as a restore does after its checks."""
    unpacker = Unpacker(store, encoding, declared)
    try:
        for at in range(0, len(data), CHUNK):
            unpacker.write(data[at : at + CHUNK])
        unpacker.finish()
        unpacker.install(store, checkpoints)
    finally:
        unpacker.discard()
    assert not unpacker.staging.exists()


def concepts(path: Path) -> tuple[int, list[object]]:
    with Store(path) as store:
        state = store.load().kbs[KB]
        return state.seq, list(state.concepts)


def test_a_snapshot_restores_the_store_and_the_checkpoint_it_follows_from(tmp_path: Path) -> None:
    """Packed with zstd, only the newer checkpoint shipped (the older is of no use); unpacked
    chunk by chunk, the store is the original's, at its position, and a projection of it
    loads from the shipped checkpoint and equals one built from the store."""
    store, checkpoints, made = filled(tmp_path / "a")
    assert len(made) == 2
    packed = take(store, checkpoints, STREAM)
    assert packed.position == 2
    with (
        zstandard.ZstdDecompressor().stream_reader(io.BytesIO(packed.data)) as raw,
        tarfile.open(fileobj=raw, mode="r|") as tar,
    ):
        names = [m.name for m in tar]
    assert names == ["kb.db", f"checkpoints/{made[0].name}"]
    assert packed.unpacked > made[0].stat().st_size  # the store's copy, and the checkpoint

    target, target_checkpoints = tmp_path / "b" / "kb.db", tmp_path / "b" / "ckpt"
    unpack(packed.data, target, target_checkpoints, ENCODING_ZSTD, str(packed.unpacked))
    assert [p.name for p in checkpoint.candidates(target_checkpoints)] == [made[0].name]
    assert concepts(target) == concepts(store)
    with Store(target) as restored:
        assert restored.log_position(STREAM) == 2
        loaded = Projections(restored, checkpoints=target_checkpoints)
        loaded.load()
        assert loaded.loaded_from == target_checkpoints / made[0].name
        while loaded.follow_once():  # the delivery past the checkpoint
            pass
        built = Projections(restored)
        built.load()
        ours, theirs = loaded.get(KB), built.get(KB)
        assert ours is not None and theirs is not None
        with ours.read() as a, theirs.read() as b:
            assert sorted(a.ids) == sorted(b.ids) and len(a.ids) == 32


def test_a_gzipped_snapshot_of_an_older_node_still_restores(tmp_path: Path) -> None:
    store, _, made = filled(tmp_path / "a")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz", compresslevel=1) as tar:  # as nodes did
        tar.add(store, arcname="kb.db")
        for path in made:
            tar.add(path, arcname=f"checkpoints/{path.name}")
    target, target_checkpoints = tmp_path / "b" / "kb.db", tmp_path / "b" / "ckpt"
    unpack(data.getvalue(), target, target_checkpoints, "", None)
    assert concepts(target) == concepts(store)
    assert sorted(p.name for p in checkpoint.candidates(target_checkpoints)) == sorted(
        p.name for p in made
    )


def tar_of(entries: list[tarfile.TarInfo], body: bytes = b"x" * 100) -> bytes:
    data = io.BytesIO()
    with (
        zstandard.ZstdCompressor().stream_writer(data, closefd=False) as z,
        tarfile.open(fileobj=z, mode="w|") as tar,
    ):
        for info in entries:
            tar.addfile(info, io.BytesIO(body) if info.isfile() else None)
    return data.getvalue()


def entry(name: str, size: int = 100, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = (size if kind == tarfile.REGTYPE else 0), kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    return info


@pytest.mark.parametrize(
    ("data", "declared", "says"),
    [
        (tar_of([entry("kb.db"), entry("../kb.db")]), None, "unexpected entry '../kb.db'"),
        (tar_of([entry("kb.db", kind=tarfile.SYMTYPE)]), None, "unexpected entry 'kb.db'"),
        (tar_of([entry("kb.db"), entry("checkpoints/x.kbg")]), None, "unexpected entry"),
        (tar_of([entry("kb.db"), entry("kb.db")]), None, "'kb.db' twice"),
        (tar_of([entry("checkpoints/ckpt-1.kbg")]), None, "holds no store"),
        (tar_of([entry("kb.db")]), "99", "past the declared size"),
        (b"not a snapshot at all" * 100, None, "unreadable"),
    ],
)
def test_what_is_not_a_packed_store_is_refused_and_leaves_nothing(
    tmp_path: Path, data: bytes, declared: str | None, says: str
) -> None:
    store, checkpoints = tmp_path / "n" / "kb.db", tmp_path / "n" / "ckpt"
    store.parent.mkdir()
    store.write_bytes(b"the node's own store")
    with pytest.raises(SnapshotRefused, match=says.replace("(", r"\(")):
        unpack(data, store, checkpoints, ENCODING_ZSTD, declared)
    assert store.read_bytes() == b"the node's own store"
    assert not checkpoints.exists()
    assert sorted(p.name for p in store.parent.iterdir()) == ["kb.db"]  # no staging left


@pytest.mark.parametrize(
    ("encoding", "declared", "says"),
    [
        ("lz4", None, "packed as 'lz4'"),
        (ENCODING_ZSTD, "-1", "declares '-1' bytes"),
        (ENCODING_ZSTD, str(2**62), "the disk of"),
    ],
)
def test_a_snapshot_this_node_cannot_unpack_is_refused_before_it_is_fetched(
    tmp_path: Path, encoding: str, declared: str | None, says: str
) -> None:
    with pytest.raises(SnapshotRefused, match=says):
        Unpacker(tmp_path / "kb.db", encoding, declared)
    assert list(tmp_path.iterdir()) == []
