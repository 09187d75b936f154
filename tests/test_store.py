"""The SQLite store: docs/events.md's semantics, atomicity, durability across reopen, the log."""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import sqlite3
import threading
from pathlib import Path

import pytest

from kbgraph.events import (
    ConceptUpserted,
    DeleteData,
    LinkAdded,
    LinkData,
    LinkRemoved,
    UpsertData,
)
from kbgraph.store import ConceptState, DeliveryResult, Store
from tests.kb_events import delete, link_added, link_removed, upsert


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "kb.db") as s:
        yield s


def concepts(store: Store, kb: str) -> dict[str, ConceptState]:
    state = store.load().kbs.get(kb)
    return {} if state is None else {c.id: c for c in state.concepts}


def result(applied=0, duplicates=0, stale=0, ignored=0, *, seq: int) -> DeliveryResult:
    accepted = applied + duplicates + stale + ignored
    return DeliveryResult(accepted, applied, duplicates, stale, ignored, seq)


def test_pragmas_are_durable(store: Store) -> None:
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with store.reading() as made_as_the_writer_is:
        assert made_as_the_writer_is.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    conn.close()


def test_single_and_batch(store: Store) -> None:
    assert store.append("kb", [upsert("a/x", links=["b", "b", "a/x", "missing"])]) == result(
        1, seq=1
    )
    assert store.append("kb", [upsert("b", title="B", text="hello"), upsert("c")]) == result(
        2, seq=3
    )
    state = concepts(store, "kb")
    assert sorted(state) == ["a/x", "b", "c"]
    # links deduplicated and sorted, the self-link dropped, the missing target kept
    assert state["a/x"].links == ["b", "missing"]
    assert state["b"].title == "B" and state["b"].text == "hello"
    assert store.kb_seq("kb") == 3 and store.kb_seq("other") == 0
    log = store.read_log(0)
    assert [(r.gid, r.seq, r.last_in_delivery) for r in log] == [
        (1, 1, True),
        (2, 2, False),
        (3, 3, True),
    ]
    assert log[1].event.subject == "b"


def test_upsert_is_full_state(store: Store) -> None:
    store.append(
        "kb", [upsert("x", title="T", text="body", tags=["t"], links=["y"], status="draft")]
    )
    store.append("kb", [upsert("x", 2, title="")])
    x = concepts(store, "kb")["x"]
    assert (x.version, x.title, x.text, x.tags, x.links, x.status) == (2, "", "", [], [], "")


def unwritable_upsert() -> ConceptUpserted:
    """Not a value the store can write: the write raises inside the delivery."""
    return ConceptUpserted(
        specversion="1.0",
        id="bad",
        source="s",
        subject="bad",
        data=UpsertData(version=1, title=object()),  # type: ignore[arg-type]
    )


def test_atomic_delivery_with_a_failing_event_stores_nothing(store: Store) -> None:
    good = upsert("ok")
    bad = unwritable_upsert()
    with pytest.raises((sqlite3.Error, TypeError)):
        store.append("kb", [good, bad])
    assert store.kb_seq("kb") == 0
    assert store.read_log(0) == []
    assert concepts(store, "kb") == {}
    # nothing was remembered as accepted: the same event applies now
    assert store.append("kb", [good]) == result(1, seq=1)


def test_failing_delivery_does_not_harm_concurrent_ones(store: Store) -> None:
    bad = unwritable_upsert()
    errors: list[BaseException] = []
    results: list[DeliveryResult] = []

    def send(events) -> None:
        try:
            results.append(store.append("kb", events))
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=send, args=([bad] if i % 5 == 0 else [upsert(f"c{i}")],))
        for i in range(40)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 8 and len(results) == 32
    assert len(concepts(store, "kb")) == 32
    assert store.kb_seq("kb") == 32


def test_duplicates_however_late_and_within_a_batch(store: Store) -> None:
    first = upsert("x", 1)
    assert store.append("kb", [first, first]) == result(1, 1, seq=1)
    for i in range(50):
        store.append("kb", [upsert(f"y{i}")])
    store.append("kb", [upsert("x", 7)])
    # the same (source, id) long after, even with content that would now be stale or fresh
    again = ConceptUpserted(
        specversion="1.0", id=first.id, source=first.source, subject="x", data=UpsertData(99)
    )
    assert store.append("kb", [again]) == result(duplicates=1, seq=52)
    assert concepts(store, "kb")["x"].version == 7
    # duplicates are per KB and per source
    assert store.append("kb2", [again]).applied == 1
    other_source = ConceptUpserted(
        specversion="1.0", id=first.id, source="other", subject="x", data=UpsertData(100)
    )
    assert store.append("kb", [other_source]).applied == 1


def test_stale_versions(store: Store) -> None:
    store.append("kb", [upsert("x", 5, title="five")])
    assert store.append("kb", [upsert("x", 5, title="again"), upsert("x", 3)]) == result(
        stale=2, seq=1
    )
    assert store.append("kb", [upsert("x", 6), upsert("x", 6)]) == result(1, stale=1, seq=2)
    assert concepts(store, "kb")["x"].version == 6
    # stale events are acknowledged: their (source, id) is remembered
    assert store.read_log(0)[-1].event.data.version == 6


def test_late_upsert_after_delete_does_not_resurrect(store: Store) -> None:
    store.append("kb", [upsert("x", 1, links=["y"]), upsert("y", 1, links=["x"])])
    assert store.append("kb", [delete("x", 5)]) == result(1, seq=3)
    state = concepts(store, "kb")
    assert "x" not in state
    assert state["y"].links == ["x"]  # others' links to a deleted concept survive
    assert store.append("kb", [upsert("x", 4), upsert("x", 5)]) == result(stale=2, seq=3)
    assert "x" not in concepts(store, "kb")
    assert store.append("kb", [upsert("x", 6, title="back")]) == result(1, seq=4)
    x = concepts(store, "kb")["x"]
    assert (x.version, x.title, x.links) == (6, "back", [])  # its old out-links are gone


def test_delete_of_never_seen_concept_records_a_tombstone(store: Store) -> None:
    assert store.append("kb", [delete("ghost", 3)]) == result(1, seq=1)
    assert store.append("kb", [upsert("ghost", 2)]) == result(stale=1, seq=1)
    assert concepts(store, "kb") == {}


def test_link_events(store: Store) -> None:
    assert store.append("kb", [link_added("nobody", "x", 1)]) == result(ignored=1, seq=0)
    store.append("kb", [upsert("a", 1)])
    assert store.append(
        "kb",
        [
            link_added("a", "b", 2),
            link_added("a", "gone", 3),
            link_added("a", "a", 4),  # a self-link: applied, declares nothing
            link_removed("a", "gone", 5),
            link_added("a", "c", 5),  # stale: same version as the removal
        ],
    ) == result(4, stale=1, seq=5)
    a = concepts(store, "kb")["a"]
    assert (a.version, a.links) == (5, ["b"])
    # on a deleted concept: not newer than the tombstone -> stale, newer -> ignored
    store.append("kb", [delete("a", 10)])
    assert store.append("kb", [link_added("a", "b", 9), link_added("a", "b", 11)]) == result(
        stale=1, ignored=1, seq=6
    )


def test_net_effect_of_mixed_events_in_one_delivery(store: Store) -> None:
    store.append("kb", [upsert("x", 1, links=["p", "q"], text="old words")])
    store.append(
        "kb",
        [
            link_added("x", "r", 2),
            link_removed("x", "p", 3),
            delete("x", 4),
            upsert("x", 5, links=["s"], text="new words"),
            link_added("x", "t", 6),
            link_removed("x", "s", 7),
            upsert("y", 1),
            delete("y", 2),
        ],
    )
    state = concepts(store, "kb")
    assert sorted(state) == ["x"]
    assert (state["x"].version, state["x"].links, state["x"].text) == (7, ["t"], "new words")
    assert store.append("kb", [upsert("y", 2)]).stale == 1


def test_restart_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "kb.db"
    ev = upsert("x", 1, links=["y"], text="persisted words")
    with Store(path) as s:
        s.append("kb", [ev, upsert("y", 1)])
        s.append("kb", [delete("y", 2)])
        before = s.load()
        log_before = s.read_log(0)
    with Store(path) as s:
        assert s.load() == before
        assert s.read_log(0) == log_before
        assert s.append("kb", [ev]) == result(duplicates=1, seq=3)
        assert s.append("kb", [upsert("y", 2)]) == result(stale=1, seq=3)
        assert s.append("kb", [upsert("z", 1)]).seq == 4


def test_read_log_returns_whole_deliveries(store: Store) -> None:
    store.append("kb", [upsert(f"a{i}") for i in range(3)])  # gids 1-3
    store.append("kb", [upsert("b")])  # gid 4
    store.append("kb", [upsert(f"c{i}") for i in range(5)])  # gids 5-9
    assert [r.gid for r in store.read_log(0, limit=2)] == [1, 2, 3]  # bigger than the limit
    assert [r.gid for r in store.read_log(0, limit=5)] == [1, 2, 3, 4]  # cut at a boundary
    assert [r.gid for r in store.read_log(4, limit=1)] == [5, 6, 7, 8, 9]
    assert store.read_log(9) == []


def test_log_is_gapless_under_concurrent_deliveries(store: Store) -> None:
    results: dict[str, list[tuple[DeliveryResult, int]]] = {"k1": [], "k2": []}
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(25):
            kb = "k1" if (n + i) % 2 else "k2"
            size = 1 + (n * i) % 4
            res = store.append(kb, [upsert(f"w{n}/{i}/{j}") for j in range(size)])
            with lock:
                results[kb].append((res, size))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log = store.read_log(0, limit=100_000)
    gids = [r.gid for r in log]
    assert gids == list(range(1, len(log) + 1))
    for kb, acks in results.items():
        seqs = [r.seq for r in log if r.kb == kb]
        assert seqs == list(range(1, len(seqs) + 1))
        assert len(seqs) == sum(size for _, size in acks)
        # each ack's seq is the position of its delivery's last event
        ends = {r.seq for r in log if r.kb == kb and r.last_in_delivery}
        assert {res.seq for res, _ in acks} == ends
    assert store.load().gid == len(log)


def _append_many(path: str, name: str, count: int) -> None:
    def event(subject: str) -> ConceptUpserted:
        # ids unique over both processes (each process has its own tests.kb_events counter)
        return ConceptUpserted(
            specversion="1.0", id=subject, source="proc", subject=subject, data=UpsertData(1)
        )

    with Store(path) as s:
        for i in range(count):
            s.append("shared", [event(f"{name}/{i}"), event(f"{name}/{i}/b")])


def test_two_processes_share_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "kb.db")
    Store(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, f"p{n}", 60)) for n in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Store(path) as s:
        log = s.read_log(0, limit=100_000)
        assert [r.seq for r in log] == list(range(1, 241))
        assert len(concepts(s, "shared")) == 240


@pytest.mark.anyio
async def test_append_async(store: Store) -> None:
    import anyio

    results: list[DeliveryResult] = []

    async def send(i: int) -> None:
        results.append(await store.append_async("kb", [upsert(f"x{i}")]))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(send, i)
    assert sorted(r.seq for r in results) == list(range(1, 21))
    assert (await store.append_async("kb", [])).seq == 20


def test_empty_delivery_and_closed_store(tmp_path: Path) -> None:
    s = Store(tmp_path / "kb.db")
    assert s.append("kb", []) == result(seq=0)
    s.close()
    with pytest.raises(RuntimeError):
        s.append("kb", [upsert("x")])


# --- a reference model, event by event, against the store's net-effect writes ---------------


class Model:
    def __init__(self) -> None:
        self.accepted: set[tuple[str, str]] = set()
        self.known: dict[str, int] = {}  # version of concept or tombstone
        self.concepts: dict[str, tuple[int, str, set[str]]] = {}
        self.seq = 0

    def apply(self, events) -> DeliveryResult:
        counts = {"applied": 0, "duplicates": 0, "stale": 0, "ignored": 0}
        for ev in events:
            key = (ev.source, ev.id)
            if key in self.accepted:
                counts["duplicates"] += 1
                continue
            self.accepted.add(key)
            v = ev.data.version
            if ev.subject in self.known and v <= self.known[ev.subject]:
                counts["stale"] += 1
                continue
            if isinstance(ev.data, LinkData) and ev.subject not in self.concepts:
                counts["ignored"] += 1
                continue
            counts["applied"] += 1
            self.seq += 1
            self.known[ev.subject] = v
            if isinstance(ev.data, UpsertData):
                self.concepts[ev.subject] = (v, ev.data.title, set(ev.data.links) - {ev.subject})
            elif isinstance(ev.data, DeleteData):
                self.concepts.pop(ev.subject, None)
            else:
                _, title, links = self.concepts[ev.subject]
                if isinstance(ev, LinkAdded) and ev.data.target != ev.subject:
                    links.add(ev.data.target)
                elif isinstance(ev, LinkRemoved):
                    links.discard(ev.data.target)
                self.concepts[ev.subject] = (v, title, links)
        return DeliveryResult(len(events), seq=self.seq, **counts)


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_random_deliveries_match_the_reference_model(tmp_path: Path, seed: int) -> None:
    import random

    rng = random.Random(seed)
    ids = ["a", "b", "c/d", "e"]
    model = Model()
    sent = []
    counter = itertools.count()
    with Store(tmp_path / "kb.db") as s:
        for _ in range(300):
            events = []
            for _ in range(rng.randint(1, 6)):
                if sent and rng.random() < 0.1:
                    events.append(rng.choice(sent))  # a redelivery
                    continue
                subject, v = rng.choice(ids), rng.randint(0, 12)
                kind = rng.choice(["up", "up", "del", "add", "add", "rm"])
                eid = f"r{next(counter)}"
                if kind == "up":
                    ev = upsert(subject, v, links=rng.sample(ids, rng.randint(0, 3)), title=eid)
                elif kind == "del":
                    ev = delete(subject, v)
                elif kind == "add":
                    ev = link_added(subject, rng.choice([*ids, "zz"]), v)
                else:
                    ev = link_removed(subject, rng.choice(ids), v)
                events.append(ev)
                sent.append(ev)
            assert s.append("kb", events) == model.apply(events)
        state = concepts(s, "kb")
        assert {k: (c.version, c.title, set(c.links)) for k, c in state.items()} == model.concepts


def settle(outcomes: list, slot: int, result, exc) -> None:
    outcomes[slot] = result if exc is None else exc


@pytest.mark.parametrize("seed", [1, 2])
def test_group_commit_matches_the_reference_model(tmp_path: Path, seed: int) -> None:
    """Many deliveries applied as one group (the fast path), and with a failing one among
    them (the per-delivery replay): each caller gets what applying them one by one gives."""
    import random

    from kbgraph.store.group import Pending

    rng = random.Random(seed)
    ids = ["a", "b", "c/d"]
    models = {"k1": Model(), "k2": Model()}
    counter = itertools.count()
    bad = ConceptUpserted(
        specversion="1.0",
        id="bad",
        source="s",
        subject="a",
        data=UpsertData(version=10**6, title=object()),  # type: ignore[arg-type]
    )
    with Store(tmp_path / "kb.db") as s:
        for round_ in range(30):
            group, expected, outcomes = [], [], []
            for _ in range(rng.randint(1, 12)):
                kb = rng.choice(["k1", "k2"])
                events = []
                for _ in range(rng.randint(1, 4)):
                    subject, v = rng.choice(ids), rng.randint(0, 15)
                    kind = rng.choice(["up", "del", "add", "rm"])
                    if kind == "up":
                        ev = upsert(subject, v, links=rng.sample(ids, 2), title=f"t{next(counter)}")
                    elif kind == "del":
                        ev = delete(subject, v)
                    elif kind == "add":
                        ev = link_added(subject, rng.choice(ids), v)
                    else:
                        ev = link_removed(subject, rng.choice(ids), v)
                    events.append(ev)
                if round_ % 3 == 0 and rng.random() < 0.3:
                    events.append(bad)
                    expected.append(None)
                else:
                    expected.append(models[kb].apply(events))

                outcomes.append(None)
                group.append(Pending(kb, events, functools.partial(settle, outcomes, len(group))))
            s.commit_group(group)  # the writer thread is idle meanwhile
            for want, got in zip(expected, outcomes, strict=True):
                if want is None:
                    assert isinstance(got, (sqlite3.Error, TypeError))
                else:
                    assert got == want
        for kb, model in models.items():
            state = concepts(s, kb)
            got = {k: (c.version, c.title, set(c.links)) for k, c in state.items()}
            assert got == model.concepts
            log = [r for r in s.read_log(0, limit=100_000) if r.kb == kb]
            assert [r.seq for r in log] == list(range(1, model.seq + 1))


def test_nul_characters_survive_the_bulk_statements(store: Store) -> None:
    """SQLite's JSON functions cut text at U+0000: such payloads go row by row instead."""
    ev = ConceptUpserted(
        specversion="1.0",
        id="id\x00tail",
        source="src\x00tail",
        subject="x",
        data=UpsertData(version=1, title="a\x00b", text="before\x00after", tags=["t\x00"]),
    )
    assert store.append("kb", [ev, upsert("y", 1)]).applied == 2
    x = concepts(store, "kb")["x"]
    assert (x.title, x.text, x.tags) == ("a\x00b", "before\x00after", ["t\x00"])
    assert store.read_log(0)[0].event == ev
    # the key with U+0000 is remembered whole: the same key is a duplicate, a prefix is not
    assert store.append("kb", [ev]).duplicates == 1
    prefix = ConceptUpserted(
        specversion="1.0", id="id", source="src", subject="x", data=UpsertData(version=2)
    )
    assert store.append("kb", [prefix]).applied == 1
    assert store.append("kb", [upsert("x", 3, text="plain")]).applied == 1
    assert concepts(store, "kb")["x"].text == "plain"
