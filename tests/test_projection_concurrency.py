"""Projection under threads and processes: whole-delivery snapshots, waiters, a second follower."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from kbgraph.access import Rule, canonical
from kbgraph.projection import KBProjection, Projections
from kbgraph.projection.rwlock import RWLock
from kbgraph.store import Store
from tests.kb_events import delete, link_added, upsert

KB = "kb"
GROUP = 6  # concepts per delivery, all linking each other
GROUPS = 5


def group_delivery(k: int, d: int) -> list:
    members = [f"g{k}/m{i}" for i in range(GROUP)]
    return [upsert(m, version=d + 1, title=f"d{d}", tags=[f"d{d}"], links=members) for m in members]


def group_delete(k: int, d: int) -> list:
    return [delete(f"g{k}/m{i}", version=d + 1) for i in range(GROUP)]


def check_whole(snap, rules) -> None:
    """Every group is wholly present (one delivery's title, a clique) or wholly absent."""
    assert snap.seq % GROUP == 0, f"seq {snap.seq} is inside a delivery"
    admin = snap.view(None)
    view = snap.view(rules)  # collection g0 only
    alive_groups = 0
    for k in range(GROUPS):
        nodes = [snap.node(f"g{k}/m{i}") for i in range(GROUP)]
        present = [u for u in nodes if u is not None]
        assert len(present) in (0, GROUP), f"group {k}: {len(present)} of {GROUP} present"
        if not present:
            continue
        alive_groups += 1
        assert len({snap.titles[u] for u in present}) == 1, f"group {k}: mixed deliveries"
        for u in present:
            assert admin.deg[u] == GROUP - 1
            assert view.deg[u] == (GROUP - 1 if k == 0 else 0)
    assert snap.counts(admin) == (GROUP * alive_groups, alive_groups * GROUP * (GROUP - 1) // 2)


def test_readers_only_see_whole_deliveries(tmp_path: Path) -> None:
    rules = canonical([Rule(frozenset({"g0"}), frozenset())])
    with Store(tmp_path / "kb.db") as store:
        store.append(KB, group_delivery(0, 0))
        p = Projections(store, poll_interval=0.001)
        p.start()
        kb = p.get(KB)
        done = threading.Event()
        failures: list[BaseException] = []
        seen: list[set[int]] = [set() for _ in range(3)]

        def reader(slot: int) -> None:
            try:
                while not done.is_set():
                    with kb.read() as snap:
                        check_whole(snap, rules)
                        seen[slot].add(snap.seq)
                    time.sleep(0)  # let the writer have the GIL between reads, as requests do
            except BaseException as exc:
                failures.append(exc)
                done.set()

        readers = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
        for t in readers:
            t.start()
        try:
            last = 0
            for d in range(1, 150):
                if failures:
                    break
                k = d % GROUPS
                delivery = group_delete(k, d) if d % 7 == 3 else group_delivery(k, d)
                last = store.append(KB, delivery).seq
                p.kick()
            deadline = time.monotonic() + 30
            while p.seq(KB) < last and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            done.set()
            for t in readers:
                t.join()
            p.stop()
        assert not failures, failures[0]
        assert p.error is None
        assert p.seq(KB) == last
        assert all(len(s) > 1 for s in seen), "readers did not overlap the ingest"
        with kb.read() as snap:
            check_whole(snap, rules)


def test_wait_for_is_woken_by_the_follower(tmp_path: Path) -> None:
    with Store(tmp_path / "kb.db") as store:
        store.append(KB, [upsert("a")])
        p = Projections(store, poll_interval=10.0)  # only a kick or the wait wakes it
        p.start()

        async def scenario() -> None:
            assert await p.wait_for(KB, 1, timeout=1.0)
            assert not await p.wait_for(KB, 2, timeout=0.05)

            def later() -> None:
                store.append(KB, [upsert("b"), link_added("a", "b", 2)])
                p.kick()

            writer = threading.Thread(target=later)
            writer.start()
            assert await p.wait_for(KB, 3, timeout=10.0)
            writer.join()
            assert not await p.wait_for("nope", 1, timeout=0.01)
            assert p.waiting() == {}

        try:
            asyncio.run(scenario())
        finally:
            p.stop()
        with p.get(KB).read() as snap:
            assert snap.seq == 3
            assert snap.counts(snap.view(None)) == (2, 1)


CHILD = r"""
import json, sys, time
from kbgraph.projection import Projections
from kbgraph.store import Store

path, kb, target = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Store(path) as store:
    p = Projections(store)
    p.start()
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while p.seq(kb) < target and time.monotonic() < deadline:
        time.sleep(0.005)
    p.stop()
    from tests.test_projection_concurrency import summary
    print(json.dumps(summary(p.get(kb))), flush=True)
"""


def summary(kb: KBProjection) -> dict:
    with kb.read() as snap:
        g = snap.graph
        ids = snap.ids
        alive = sorted(ids[u] for u in range(g.n) if snap.node(ids[u]) == u)
        und = sorted(
            [ids[u], ids[int(v)]]
            for u in range(g.n)
            for v in g.und[g.und_off[u] : g.und_off[u] + g.und_len[u]]
        )
        out = sorted(
            [ids[u], ids[int(v)]]
            for u in range(g.n)
            for v in g.out[g.out_off[u] : g.out_off[u] + g.out_len[u]]
        )
        declared = {i: snap.declared_links(snap.node(i)) for i in alive}
        titles = {i: snap.titles[snap.node(i)] for i in alive}
        return {
            "seq": snap.seq,
            "nodes": alive,
            "und": und,
            "out": out,
            "declared": declared,
            "titles": titles,
        }


def test_second_process_following_the_same_file_converges(tmp_path: Path) -> None:
    path = tmp_path / "kb.db"
    root = str(Path(__file__).resolve().parent.parent)
    with Store(path) as store:
        for d in range(10):  # built from load() in the child
            store.append(KB, group_delivery(d % GROUPS, d))
        deliveries = []
        for d in range(10, 120):  # followed from the log in the child
            k = d % GROUPS
            if d % 5 == 2:
                deliveries.append(group_delete(k, d))
            elif d % 5 == 4:
                deliveries.append([link_added(f"g{k}/m0", f"ghost/{d}", d + 10**6)])
            else:
                deliveries.append(group_delivery(k, d))
        expected_seq = store.kb_seq(KB) + sum(len(x) for x in deliveries)
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), KB, str(expected_seq)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        try:
            assert child.stdout.readline().strip() == "ready"
            results = [store.append(KB, x) for x in deliveries]
            output, _ = child.communicate(timeout=120)
        finally:
            child.kill()
        assert results[-1].seq == expected_seq
        here = Projections(store)
        here.load()
        assert json.loads(output) == summary(here.get(KB))
        assert json.loads(output)["seq"] == expected_seq


def test_rwlock_shares_readers_and_prefers_a_waiting_writer() -> None:
    lock = RWLock()
    both_in = threading.Barrier(2, timeout=10)

    def shared_reader() -> None:
        with lock.read():
            both_in.wait()  # both readers inside at once, or BrokenBarrierError

    threads = [threading.Thread(target=shared_reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    order: list[str] = []
    lock.acquire_read()
    writer = threading.Thread(
        target=lambda: (lock.acquire_write(), order.append("W"), lock.release_write())
    )
    writer.start()
    queued(lock, (0, 1))
    late = threading.Thread(
        target=lambda: (lock.acquire_read(), order.append("R"), lock.release_read())
    )
    late.start()
    time.sleep(0.05)
    assert order == []  # the late reader queues behind the waiting writer
    lock.release_read()
    writer.join(10)
    late.join(10)
    assert order == ["W", "R"]


def queued(lock: RWLock, readers_writers: tuple[int, int], seconds: float = 10.0) -> None:
    """Wait, within ``seconds``, until ``lock`` has (readers, writers) queued."""
    deadline = time.monotonic() + seconds
    while lock.queued() != readers_writers:
        assert time.monotonic() < deadline, f"{lock.queued()} queued, not {readers_writers}"
        time.sleep(0.001)


def test_rwlock_hands_off_to_queued_readers_before_the_next_writer() -> None:
    """A follower draining a backlog re-acquires at once; queued readers go first."""
    lock = RWLock()
    order: list[str] = []
    lock.acquire_write()
    reader = threading.Thread(
        target=lambda: (lock.acquire_read(), order.append("R"), lock.release_read())
    )
    reader.start()
    queued(lock, (1, 0))
    lock.release_write()
    lock.acquire_write()  # waits for the admitted reader
    order.append("W")
    lock.release_write()
    reader.join(10)
    assert order == ["R", "W"]


def test_cached_masks_stay_exact_under_growth_compaction_and_eviction(
    tmp_path: Path, monkeypatch
) -> None:
    """Readers creating and evicting masks while the follower grows and compacts: every
    view's degrees equal a brute-force count over the same snapshot."""
    import kbgraph.projection.adjacency as adjacency
    import kbgraph.projection.masks as masks_module

    monkeypatch.setattr(masks_module, "MASK_CACHE_ENTRIES", 2)
    monkeypatch.setattr(adjacency, "COMPACT_MIN_HOLES", 0)
    rule_sets = [canonical([Rule(frozenset({f"c{k}"}), frozenset())]) for k in range(4)] + [
        canonical([Rule(frozenset(), frozenset({"T"}))])
    ]
    with Store(tmp_path / "kb.db") as store:
        store.append(KB, [upsert("c0/seed")])
        p = Projections(store, poll_interval=0.001)
        p.start()
        kb = p.get(KB)
        done = threading.Event()
        failures: list[BaseException] = []
        checked = [0]

        def reader(offset: int) -> None:
            i = offset
            try:
                while not done.is_set():
                    i += 1
                    with kb.read() as snap:
                        view = snap.view(rule_sets[i % len(rule_sets)])
                        g = snap.graph
                        for u in range(g.n):
                            block = g.und[g.und_off[u] : g.und_off[u] + g.und_len[u]]
                            want = int(view.mask[block].sum()) if view.mask[u] else 0
                            assert view.deg[u] == want, (snap.ids[u], int(view.deg[u]), want)
                        checked[0] += 1
            except BaseException as exc:
                failures.append(exc)
                done.set()

        readers = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
        for t in readers:
            t.start()
        try:
            last = 0
            for d in range(120):
                if failures:
                    break
                ids = [f"c{(d + i) % 4}/n{d}-{i}" for i in range(5)]
                events = [
                    upsert(x, 1, type="T" if i % 2 else "", links=[*ids, f"c0/n{d // 2}-0"])
                    for i, x in enumerate(ids)
                ]
                if d % 3 == 2:
                    events.append(delete(f"c{(d - 2) % 4}/n{d - 2}-1", 5))
                last = store.append(KB, events).seq
                p.kick()
            deadline = time.monotonic() + 30
            while p.seq(KB) < last and time.monotonic() < deadline and not failures:
                time.sleep(0.01)
        finally:
            done.set()
            for t in readers:
                t.join()
            p.stop()
        assert not failures, failures[0]
        assert p.error is None and p.seq(KB) == last
        assert checked[0] > 0
        assert len(kb.masks) <= 2
        assert kb.nodes.cap >= 512  # the node arrays (and masks) did grow during the test


def test_follower_retries_a_failed_log_read() -> None:
    """A transient read error (SQLite busy, I/O) is retried; nothing is lost or doubled."""
    from tests.reference_model import FakeStore

    class Flaky(FakeStore):
        failures = 2

        def read_log(self, after_gid: int, limit: int = 10_000):
            if self.failures:
                self.failures -= 1
                raise OSError("disk hiccup")
            return super().read_log(after_gid, limit)

    store = Flaky()
    store.failures = 0
    store.append(KB, [upsert("a")])
    p = Projections(store, poll_interval=0.001)
    p.start()
    try:
        store.failures = 2
        store.append(KB, [upsert("b", links=["a"])])
        p.kick()
        deadline = time.monotonic() + 10
        while p.seq(KB) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        p.stop()
    assert store.failures == 0
    assert p.error is None and p.seq(KB) == 2
    with p.get(KB).read() as snap:
        assert snap.counts(snap.view(None)) == (2, 1)


class CountingStore(Store):
    """A store that counts the reads of its log."""

    reads = 0

    def read_log(self, after_gid: int, limit: int = 10_000):
        self.reads += 1
        return super().read_log(after_gid, limit)


def wait_seq(p: Projections, seq: int) -> None:
    """Until ``p`` announced ``seq`` (polled: a ``wait_for`` would end a hold)."""
    deadline = time.monotonic() + 10
    while p.seq(KB) < seq and time.monotonic() < deadline:
        time.sleep(0.005)
    assert p.seq(KB) == seq


def test_the_hold_gathers_commits_until_a_min_seq_waiter_comes(tmp_path: Path) -> None:
    """After a small batch the follower holds (here far longer than the test): the commits
    meanwhile are read in one batch once a request waits for one of them, not on their kicks
    and not after the hold."""
    with CountingStore(tmp_path / "kb.db") as store:
        p = Projections(store, poll_interval=60, hold=60)
        p.start()
        try:
            store.append(KB, [upsert("a")])
            p.kick()
            wait_seq(p, 1)
            reads = store.reads
            for name in "bcd":
                store.append(KB, [upsert(name)])
                p.kick()
            assert asyncio.run(p.wait_for(KB, 4, timeout=10))
            assert store.reads == reads + 1
            assert p.waiting() == {}
        finally:
            p.stop()
        assert p.error is None


def test_the_hold_is_bounded(tmp_path: Path) -> None:
    """With nobody waiting, a commit made during a hold is read once the hold ends."""
    with Store(tmp_path / "kb.db") as store:
        p = Projections(store, poll_interval=60, hold=0.05)  # no poll: the hold's end reads
        p.start()
        try:
            store.append(KB, [upsert("a")])
            p.kick()
            wait_seq(p, 1)
            store.append(KB, [upsert("b")])
            p.kick()
            wait_seq(p, 2)
        finally:
            p.stop()
        assert p.error is None


def test_stop_ends_a_hold(tmp_path: Path) -> None:
    with Store(tmp_path / "kb.db") as store:
        p = Projections(store, poll_interval=60, hold=60)
        p.start()
        store.append(KB, [upsert("a")])
        p.kick()
        wait_seq(p, 1)
        stopping = threading.Thread(target=p.stop)
        stopping.start()
        stopping.join(10)
        assert not stopping.is_alive()


def test_no_hold_after_a_min_seq_request(tmp_path: Path) -> None:
    """A client that reads its writes (X-Min-Seq) turns the hold off for a while: its next
    write is read at its commit, not after a hold (here of a minute)."""
    with Store(tmp_path / "kb.db") as store:
        p = Projections(store, poll_interval=60, hold=60)
        p.hold.quiet = 3600  # the quiet time cannot run out during the test
        p.start()
        try:
            store.append(KB, [upsert("a")])
            p.kick()
            assert asyncio.run(p.wait_for(KB, 1, timeout=10))
            store.append(KB, [upsert("b")])
            p.kick()
            wait_seq(p, 2)
            store.append(KB, [upsert("c")])
            p.kick()
            wait_seq(p, 3)
        finally:
            p.stop()
        assert p.error is None
