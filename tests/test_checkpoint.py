"""Checkpoints and the log cut: a restart from a checkpoint plus the log after it equals a build
from the store, before and after more events; a torn, corrupt, foreign or stale checkpoint is
never trusted; a crash between writing a checkpoint and cutting the log loses nothing; dedupe
of an event older than the cut still answers ``duplicates``."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbgraph.access import Rule, RuleSet, canonical
from kbgraph.projection import Projections, checkpoint
from kbgraph.search import index as search_index
from kbgraph.store import LogCut, Store
from tests import checkpoint_fixture
from tests.checkpointed import everything, filled, projections, written
from tests.histories import KB, deliveries_st, dump, rules_st
from tests.kb_events import upsert


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries_st, st.data(), st.lists(rules_st, max_size=2, unique=True))
def test_restart_from_checkpoint_equals_a_build_from_the_store(deliveries, data, rules) -> None:
    views: list[RuleSet | None] = [None, *rules]
    first = data.draw(st.integers(0, len(deliveries)))
    second = data.draw(st.integers(first, len(deliveries)))
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "kb.db") as store:
        folder = Path(tmp) / "ckpt"
        for delivery in deliveries[:first]:
            store.append(KB, delivery)
        writer = projections(store, folder, log_retain=0)
        everything(writer, views)  # masks cached before the checkpoint: patched, not stored
        writer.write_checkpoint()
        for delivery in deliveries[first:second]:
            store.append(KB, delivery)
        restarted = projections(store, folder)
        assert restarted.loaded_from is not None
        assert restarted.gid == writer.gid
        while restarted.follow_once():
            pass
        fresh = Projections(store)
        fresh.load()
        assert everything(restarted, views) == everything(fresh, views)
        for delivery in deliveries[second:]:  # the mapped arrays take patches as any others
            store.append(KB, delivery)
        while restarted.follow_once():
            pass
        fresh = Projections(store)
        fresh.load()
        assert everything(restarted, views) == everything(fresh, views)
        restarted.write_checkpoint()  # a checkpoint of a restarted projection loads too
        again = projections(store, folder)
        assert again.loaded_from is not None and again.gid == restarted.gid
        assert everything(again, views) == everything(fresh, views)


def refused_each(
    store: Store,
    path: Path,
    cases: dict[str, bytes],
    want: dict[str, Any] | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each of ``cases`` (the reason logged: the checkpoint's bytes) written at ``path`` is
    refused with that reason, and the start falls back to a build answering ``want``."""
    for why, content in cases.items():
        path.write_bytes(content)
        caplog.clear()
        restarted = projections(store, path.parent)
        assert restarted.loaded_from is None, why
        assert why in caplog.text
        assert everything(restarted, [None]) == want, why


def test_corrupt_torn_and_foreign_checkpoints_are_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, path, want = written(tmp_path)
    good = path.read_bytes()
    header, start = checkpoint.read_header(path)
    flipped = bytearray(good)
    flipped[start + header.payload_bytes // 2] ^= 0xFF
    cases = {
        "payload CRC-32 mismatch": bytes(flipped),
        "bytes, the header promises": good[: len(good) - 100],  # torn in the payload
        "header cut short": good[: len(checkpoint.MAGIC) + 20],  # torn in the header
        "not a checkpoint file": b"garbage" + good[7:],
    }
    refused_each(store, path, cases, want, caplog)
    path.write_bytes(good)
    assert projections(store, path.parent).loaded_from == path
    with Store(tmp_path / "other.db") as other:  # same folder, another store
        caplog.clear()
        foreign = projections(other, path.parent)
        assert foreign.loaded_from is None and foreign.get(KB) is None
        assert "made from another store" in caplog.text
    store.close()


def test_a_store_restored_from_an_older_copy_ignores_newer_checkpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = filled(tmp_path, 10)
    store.close()
    backup = (tmp_path / "kb.db").read_bytes()
    store, p = filled(tmp_path, 20)  # 10 more upserts of c0..c19 (c0..c9 again)
    assert p.write_checkpoint() is not None
    store.close()
    for name in ("kb.db-wal", "kb.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / "kb.db").write_bytes(backup)
    with Store(tmp_path / "kb.db") as older:
        caplog.clear()
        restarted = projections(older, tmp_path / "ckpt")
        assert restarted.loaded_from is None
        assert "beyond the log's last" in caplog.text
        for i in range(40):  # written again past the checkpoint's gid, other records
            older.append(KB, [upsert(f"d{i}", title="other")])
        caplog.clear()
        restarted = projections(older, tmp_path / "ckpt")
        assert restarted.loaded_from is None
        assert "is not the one it was made at" in caplog.text
        fresh = Projections(older)
        fresh.load()
        assert everything(restarted, [None]) == everything(fresh, [None])


def test_log_cut_keeps_dedupe_and_a_follower_behind_the_cut_loads_again(tmp_path: Path) -> None:
    store, writer = filled(tmp_path)
    behind = projections(store, tmp_path / "ckpt")
    delivery = [upsert("late", title="Late", text="dns")]
    first = store.append(KB, delivery)
    assert first.applied == 1
    for i in range(3):
        store.append(KB, [upsert(f"later{i}", links=["late"])])
    while writer.follow_once():
        pass
    writer.write_checkpoint()
    assert store.log_start() == writer.gid  # log_retain=0: everything before it is cut
    assert store.read_log(store.log_start() - 1) != []
    with pytest.raises(LogCut):
        store.read_log(0)
    again = store.append(KB, delivery)  # its key was accepted before the cut
    assert (again.applied, again.duplicates, again.seq) == (0, 1, first.seq + 3)
    with pytest.raises(LogCut):
        behind.follow_once()
    behind.reload()
    assert behind.loaded_from is not None
    fresh = Projections(store)
    fresh.load()
    assert everything(behind, [None]) == everything(fresh, [None])
    store.close()


def test_a_crash_between_checkpoint_and_cut_loses_nothing(tmp_path: Path) -> None:
    store, p = filled(tmp_path)
    while p.follow_once():
        pass

    def crash(before_gid: int) -> int:
        raise KeyboardInterrupt("killed between the checkpoint and the cut")

    store.cut_log = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        p.write_checkpoint()
    store.close()
    with Store(tmp_path / "kb.db") as reopened:
        assert reopened.log_start() == 1  # nothing was cut
        for i in range(5):
            reopened.append(KB, [upsert(f"after{i}", links=["c1"])])
        restarted = projections(reopened, tmp_path / "ckpt")
        assert restarted.loaded_from is not None
        while restarted.follow_once():
            pass
        fresh = Projections(reopened)
        fresh.load()
        got = everything(restarted, [None])
        assert got == everything(fresh, [None])
        assert {f"c{i}" for i in range(30)} | {f"after{i}" for i in range(5)} == set(
            got["graph"]["nodes"]
        )


def disk(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("kb.db*"))


def test_cut_frees_disk(tmp_path: Path) -> None:
    store, p = filled(tmp_path, 10)
    text = "words " * 2000
    for round_ in range(10):
        for i in range(20):
            store.append(KB, [upsert(f"c{i}", round_ + 2, text=text)])
    with store.reading() as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all in the main file
    before = disk(tmp_path)
    while p.follow_once():
        pass
    p.write_checkpoint()
    assert disk(tmp_path) < before / 2
    store.close()


def test_postings_of_a_loaded_checkpoint_are_mapped_not_copied(tmp_path: Path) -> None:
    store, p = filled(tmp_path)
    p.write_checkpoint()
    restarted = projections(store, tmp_path / "ckpt")
    index = restarted.get(KB).index
    assert isinstance(index.terms.post_node.base, np.ndarray | memoryview) or not (
        index.terms.post_node.flags.owndata
    )
    store.close()


def test_a_kb_remembers_its_last_dedupe_keys_and_the_cut_forgets_the_rest(tmp_path: Path) -> None:
    with Store(tmp_path / "kb.db", dedupe_keys=3) as store:
        sent = [upsert(f"c{i}", i + 1) for i in range(6)]
        for event in sent:
            assert store.append(KB, [event]).applied == 1
        # keys 4, 5, 6 are the last three: duplicates; key 3 is past them: decided by version
        again = store.append(KB, [sent[3], sent[4], sent[5]])
        assert (again.applied, again.duplicates, again.stale) == (0, 3, 0)
        older = store.append(KB, [sent[2]])
        assert (older.applied, older.duplicates, older.stale) == (0, 0, 1)
        # accepted again just now: a duplicate once more, and key 4 fell out of the last three
        assert store.append(KB, [sent[2]]).duplicates == 1
        assert store.append(KB, [sent[3]]).stale == 1
        with store.reading() as conn:
            rows = conn.execute("SELECT count(*) FROM accepted").fetchone()[0]
        assert rows == 6
        store.cut_log(0)
        with store.reading() as conn:
            kept = conn.execute("SELECT id FROM accepted ORDER BY n").fetchall()
        assert [row[0] for row in kept] == [sent[5].id, sent[2].id, sent[3].id]
        assert store.append(KB, [sent[5], sent[3]]).duplicates == 2


FORMAT_1 = Path(__file__).parent / "data" / "checkpoint-format-1"


def test_a_checkpoint_written_before_the_projection_had_parts_loads_the_same(
    tmp_path: Path,
) -> None:
    """A store and its checkpoint written by the code before ``nodes``, ``links`` and
    ``masks`` were modules of their own (``tests/checkpoint_fixture.py``; the file format did
    not change, so it is still format 1, which carries no mentions: they are built from the
    texts): loaded, it answers as a build from the same store,
    before and after more events."""
    shutil.copytree(FORMAT_1, tmp_path / "old")
    narrowed = [canonical([Rule(frozenset({"infra", "net"}), frozenset())])]
    views: list[RuleSet | None] = [
        None,
        *narrowed,
        canonical([Rule(frozenset(), frozenset({"Note"}))]),
    ]
    with Store(tmp_path / "old" / "kb.db") as store:
        loaded = projections(store, tmp_path / "old" / "ckpt")
        assert loaded.loaded_from is not None
        assert loaded.loaded_from.name == checkpoint.file_name(27)
        built = Projections(store)
        built.load()
        assert loaded.names() == built.names() == sorted(checkpoint_fixture.KBS)
        for name in loaded.names():
            assert dump(loaded.get(name), views) == dump(built.get(name), views)
        for name, delivery in checkpoint_fixture.later():
            store.append(name, delivery)
        assert loaded.follow_once() == built.follow_once() > 0
        for name in loaded.names():
            assert dump(loaded.get(name), views) == dump(built.get(name), views)


def test_a_start_from_a_checkpoint_applies_the_log_past_it_before_it_returns(
    tmp_path: Path,
) -> None:
    """What the store acknowledged after the newest checkpoint is in the projection once
    ``start`` returns (the service answers then), not once the follower thread gets to it: the
    thread here waits a minute before its first poll, so only ``start`` itself can apply it."""
    store, p = filled(tmp_path)
    assert p.write_checkpoint() is not None
    for i in range(25):
        store.append(KB, [upsert(f"after{i}", links=[f"c{i}"])])
    restarted = Projections(store, checkpoints=tmp_path / "ckpt", poll_interval=60)
    try:
        restarted.start()
        assert restarted.loaded_from is not None
        fresh = Projections(store)
        fresh.load()
        assert everything(restarted, [None]) == everything(fresh, [None])
        assert restarted.gid == fresh.gid
    finally:
        restarted.stop()
        store.close()


def named_texts(store: Store, version: int) -> None:
    """Text changes that name concepts ("DNS 3"), one that names none any more, and a new
    name ("Fresh Name") a text then names: what the name trie is walked and patched for."""
    store.append(KB, [upsert("c1", version, title="DNS 1", text="see dns 3 and dns 7")])
    store.append(KB, [upsert("c2", version, title="DNS 2", text="nothing named")])
    store.append(KB, [upsert("c3", version, title="Fresh Name", text="resolver")])
    store.append(KB, [upsert("c4", version, title="DNS 4", text="the fresh name, dns 1")])


def test_a_restart_from_a_checkpoint_builds_no_name_trie(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint carries each KB's name trie: the first text changes after a restart walk
    and patch the loaded one (before, the trie of every name was built on the first, under
    the write lock: 2.75 s at a million concepts), with the mentions of a build."""
    store, p = filled(tmp_path)
    assert p.write_checkpoint() is not None
    built: list[object] = []
    real = search_index.NameTrie
    monkeypatch.setattr(search_index, "NameTrie", lambda *a: built.append(a) or real(*a))
    restarted = projections(store, tmp_path / "ckpt")
    assert restarted.loaded_from is not None
    named_texts(store, 2)
    while restarted.follow_once():
        pass
    assert built == []
    fresh = Projections(store)
    fresh.load()
    want = everything(fresh, [None])
    assert want is not None  # "dns 3" names none once c3 is renamed; "fresh name" comes
    assert want["mentions"] == [("c1", "c7"), ("c4", "c1"), ("c4", "c3")]
    assert everything(restarted, [None]) == want


def with_header(good: bytes, start: int, header: checkpoint.Header) -> bytes:
    """The checkpoint ``good`` (its payload at ``start``) with ``header`` instead of its own."""
    raw = msgspec.json.encode(header)
    head = checkpoint.MAGIC + len(raw).to_bytes(8, "little") + raw
    return head + bytes(-len(head) % checkpoint.ALIGN) + good[start:]


def test_a_torn_or_corrupt_name_trie_is_not_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The name trie's arrays are checked as every other part: a byte of them flipped fails the
    payload's CRC-32; a header whose trie arrays do not fit together (an edge table cut, an
    array missing) is refused by the trie itself. Each time the start falls back to a build."""
    store, path, want = written(tmp_path)
    good = path.read_bytes()
    header, start = checkpoint.read_header(path)
    (entry,) = header.kbs
    assert entry.name_trie
    arrays = {a.name: a for a in entry.arrays}
    edges = arrays["trie.edges"]
    flipped = bytearray(good)
    flipped[start + edges.offset + 8] ^= 0x01  # the first row's token
    cut = msgspec.structs.replace(edges, shape=(edges.shape[0] // 2 - 1, 4))

    def with_arrays(arrays: list[checkpoint.ArrayEntry]) -> bytes:
        kb_entry = msgspec.structs.replace(entry, arrays=arrays)
        return with_header(good, start, msgspec.structs.replace(header, kbs=[kb_entry]))

    cases = {
        "payload CRC-32 mismatch": bytes(flipped),
        "name trie: an edge table": with_arrays([cut if a is edges else a for a in entry.arrays]),
        "name trie: no through": with_arrays([a for a in entry.arrays if a.name != "trie.through"]),
    }
    refused_each(store, path, cases, want, caplog)
    path.write_bytes(with_header(good, start, header))  # the header written again: trusted
    assert projections(store, path.parent).loaded_from == path
    store.close()


FORMAT_2 = Path(__file__).parent / "data" / "checkpoint-format-2"


def test_a_format_2_checkpoint_loads_the_same_and_builds_its_trie_on_first_use(
    tmp_path: Path,
) -> None:
    """A checkpoint of the format before the name trie was carried (format 2: mentions, no
    trie; ``tests/checkpoint_fixture.py``'s history, written by that code) loads, answers as a
    build, builds its trie on the first text change and answers as a build after text changes
    that add and remove names; its next checkpoint carries the trie."""
    shutil.copytree(FORMAT_2, tmp_path / "old")
    folder = tmp_path / "old" / "ckpt"
    (path,) = checkpoint.candidates(folder)
    assert checkpoint.read_header(path)[0].format == 2 < checkpoint.FORMAT
    views: list[RuleSet | None] = [
        None,
        canonical([Rule(frozenset({"infra", "net"}), frozenset())]),
    ]

    def answers(p: Projections) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in p.names():
            kb = p.get(name)
            assert kb is not None and kb.mentions is not None
            with kb.read() as snap:
                n = len(snap.ids)
                seen = [kb.mentions.view(snap.view(rules).mask) for rules in views]
                edges = [
                    sorted((snap.ids[u], snap.ids[v]) for u in range(n) for v in m.out(u))
                    for m in seen
                ]
            out[name] = (dump(kb, views), edges)
        return out

    with Store(tmp_path / "old" / "kb.db") as store:
        loaded = projections(store, folder)
        assert loaded.loaded_from == path
        kb = loaded.get("kb")
        assert kb is not None and kb.index.built_trie() is None
        built = Projections(store)
        built.load()
        assert answers(loaded) == answers(built)
        for name, delivery in checkpoint_fixture.later():
            store.append(name, delivery)
        renamed = upsert("ops/n2", 30, title="Fresh Name", text="note 0 über infra")
        naming = upsert("net/n5", 30, text="the fresh name; note 2 über ops")
        for i, event in enumerate([renamed, naming]):  # ids the fixture's history never used
            store.append("kb", [msgspec.structs.replace(event, id=f"format-2-{i}")])
        assert loaded.follow_once() == built.follow_once() > 0
        assert kb.index.built_trie() is not None
        want = answers(built)
        assert answers(loaded) == want
        assert ("net/n5", "ops/n2") in want["kb"][1][0]
        again = loaded.write_checkpoint()
        assert again is not None and checkpoint.read_header(again)[0].kbs[0].name_trie
        restarted = projections(store, folder)
        assert restarted.loaded_from == again
        assert answers(restarted) == want


def test_the_same_state_gives_the_same_bytes(tmp_path: Path) -> None:
    """A checkpoint's bytes are a function of the state: written twice, and written again from
    its own load (the name trie mapped, its nodes' keys a lazy column), the same file."""
    store, p = filled(tmp_path)
    named_texts(store, 2)
    while p.follow_once():
        pass
    kbs = {KB: p.get(KB)}
    first = checkpoint.write(tmp_path / "a", "store", p.gid, None, kbs)
    second = checkpoint.write(tmp_path / "b", "store", p.gid, None, kbs)
    assert first.read_bytes() == second.read_bytes()
    header, start = checkpoint.read_header(first)
    assert header.kbs[0].name_trie
    loaded = checkpoint.load(first, header, start).kbs
    loaded[KB].attach_mentions(True)  # as a start does
    again = checkpoint.write(tmp_path / "c", "store", p.gid, None, loaded)
    assert again.read_bytes() == first.read_bytes()
    store.close()
