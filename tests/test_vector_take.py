"""The cluster embedder's rows in a store (``Store.submit_vectors_from_log``,
``kbgraph.store.vectorrows.take``; issue 48 case 1), against an oracle written from the rule: a
row is taken only when its hash is that of its concept's text at the message's position in the
log (as embedded: names first, cut at ``max_chars``) and no row for that text is held yet, so a
message published again after the text changed, or a second row for the same text, changes
nothing. The rows and the notes are the same whether the writer takes the messages one at a
time or all in one group (every node decides alike, however its writer groups them)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import sqlite3
import threading
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbgraph.embeddings import concept_text, text_hash
from kbgraph.store import DeliveryResult, Store
from kbgraph.store.group import LoggedVectors
from kbgraph.store.vectorrows import VectorRow
from tests.kb_events import delete, upsert

STREAM = "s"
KB = "kb"
MODEL = "m"
TEXTS = ["alpha", "alpine", "beta"]  # cut at 7 characters, the first two embed alike
CONCEPTS = ["c0", "c1", "c2"]

op = st.one_of(
    st.tuples(st.just("text"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("delete"), st.integers(0, 2), st.just(0)),
    st.tuples(
        st.just("vectors"),
        st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 50)), max_size=4),
        st.just(0),
    ),
)


def digest(concept: str, text: str, max_chars: int) -> bytes:
    return text_hash(concept_text(concept, [], [], text)[:max_chars])


def messages(ops: list[tuple[object, ...]], max_chars: int) -> list[object]:
    """Each op as what the log carries: a delivery (events) or a vectors message."""
    versions = dict.fromkeys(CONCEPTS, 0)
    out: list[object] = []
    for kind, a, b in ops:
        if kind == "vectors":
            assert isinstance(a, list)
            rows = [
                VectorRow(
                    CONCEPTS[c], digest(CONCEPTS[c], TEXTS[t], max_chars), np.full(4, v, "f4"), ""
                )
                for c, t, v in a
            ]
            out.append(LoggedVectors(MODEL, max_chars, rows))
            continue
        assert isinstance(a, int) and isinstance(b, int)
        concept = CONCEPTS[a]
        versions[concept] += 1
        if kind == "text":
            out.append([upsert(concept, versions[concept], text=TEXTS[b])])
        else:
            out.append([delete(concept, versions[concept])])
    return out


def oracle(
    ops: list[tuple[object, ...]], max_chars: int
) -> tuple[dict[str, tuple[bytes, bytes]], list[str]]:
    """The rows (concept -> hash, vector bytes) and the vectors notes' counts, by the rule."""
    text: dict[str, str | None] = dict.fromkeys(CONCEPTS)
    table: dict[str, tuple[bytes, bytes]] = {}
    notes = []
    for kind, a, b in ops:
        if kind == "text":
            assert isinstance(a, int) and isinstance(b, int)
            text[CONCEPTS[a]] = TEXTS[b]
        elif kind == "delete":
            assert isinstance(a, int)
            text[CONCEPTS[a]] = None
        else:
            assert isinstance(a, list)
            taken = held = stale = 0
            for c, t, v in a:
                concept, now = CONCEPTS[c], text[CONCEPTS[c]]
                given_hash = digest(concept, TEXTS[t], max_chars)
                if now is None or given_hash != digest(concept, now, max_chars):
                    stale += 1
                elif concept in table and table[concept][0] == given_hash:
                    held += 1
                else:
                    taken += 1
                    table[concept] = (given_hash, np.full(4, v, "f4").tobytes())
            notes.append(f"{taken} taken, {held} held already, {stale} stale")
    return table, notes


def submit(store: Store, seq: int, message: object, resolve: object) -> None:
    if isinstance(message, LoggedVectors):
        store.submit_vectors_from_log((STREAM, seq), KB, message, resolve)  # type: ignore[arg-type]
    else:
        store.submit_from_log(KB, message, None, 1.0, (STREAM, seq), resolve)  # type: ignore[arg-type]


def waiter() -> tuple[concurrent.futures.Future[DeliveryResult], object]:
    future: concurrent.futures.Future[DeliveryResult] = concurrent.futures.Future()

    def resolve(result: DeliveryResult | None, exc: BaseException | None) -> None:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    return future, resolve


def apply(path: Path, log: list[object], grouped: bool) -> tuple[dict[str, object], list[str]]:
    """Apply ``log`` one message at a time, or (``grouped``) all of it after a first message
    whose outcome holds the writer until the rest is queued: one group. The rows, the notes."""
    with Store(path) as store:
        futures = []
        held, release = threading.Event(), threading.Event()
        first, first_resolve = waiter()

        def hold(result: DeliveryResult | None, exc: BaseException | None) -> None:
            first_resolve(result, exc)  # type: ignore[operator]
            held.set()
            release.wait(10)

        submit(store, 1, [upsert("anchor")], hold if grouped else first_resolve)
        if grouped:
            assert held.wait(10)
        first.result(10)
        for seq, message in enumerate(log, start=2):
            future, resolve = waiter()
            submit(store, seq, message, resolve)
            futures.append(future)
            if not grouped:
                future.result(10)
        release.set()
        for future in futures:
            future.result(10)
        notes = [d.split(": ")[-1] for _, k, d in store.stream_notes(STREAM) if k == "vectors"]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT concept, text_hash, vec FROM vector ORDER BY concept")
        return {c: (bytes(h), bytes(v)) for c, h, v in rows}, notes


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(op, max_size=14), st.sampled_from([7, 100]))
def test_rows_are_taken_for_the_text_at_their_position_however_grouped(
    tmp_path_factory: object, ops: list[tuple[object, ...]], max_chars: int
) -> None:
    folder = tmp_path_factory.mktemp("take")  # type: ignore[attr-defined]
    log = messages(ops, max_chars)
    table, notes = oracle(ops, max_chars)
    one = apply(folder / "one.db", log, grouped=False)
    grouped = apply(folder / "grouped.db", log, grouped=True)
    assert one == (table, notes)
    assert grouped == one


def test_a_message_published_again_after_the_text_changed_changes_nothing(
    tmp_path: Path,
) -> None:
    ops: list[tuple[object, ...]] = [
        ("text", 0, 0),
        ("vectors", [(0, 0, 1)], 0),
        ("text", 0, 2),
        ("vectors", [(0, 2, 2)], 0),
        ("vectors", [(0, 0, 1)], 0),  # the first message again: its text is gone
        ("vectors", [(0, 2, 3)], 0),  # another row for the text now: the first one stays
    ]
    rows, notes = apply(tmp_path / "kb.db", messages(ops, 100), grouped=False)
    assert rows == {"c0": (digest("c0", "beta", 100), np.full(4, 2, "f4").tobytes())}
    assert notes[2:] == ["0 taken, 0 held already, 1 stale", "0 taken, 1 held already, 0 stale"]
