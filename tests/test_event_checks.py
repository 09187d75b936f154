"""A batch's events checked at once (``check_events``, ``all_plain_ids``) decide exactly as
``check_event`` one event at a time: the same events back, or the same refusal naming the
first problem (the oracle is the per-event check, itself held to the naming rules' definition
in ``test_names``)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from kbgraph.events import (
    MAX_TEXT_BYTES,
    ConceptDeleted,
    ConceptUpserted,
    DeleteData,
    DeliveryError,
    Event,
    LinkAdded,
    LinkData,
    UpsertData,
    check_event,
    check_events,
    decode_delivery,
)
from kbgraph.names import MAX_ID_LENGTH, all_plain_ids, concept_id_problem

# Plain ids and texts, and values around every rule: ids holding the line break that joins
# ids, controls, non-ASCII, marks NFC composes, format characters, empty segments, at and past
# the length bound; texts past a quarter of the bound in characters, and past it in bytes.
plain_ids = st.sampled_from(["a", "kb/b", "a/b/c", "x" * MAX_ID_LENGTH])
tricky_ids = (
    st.text(alphabet=st.sampled_from("ab/\n\r é\u0301\x00\x7f\x85\u200b"), max_size=8)
    | st.lists(plain_ids, min_size=2, max_size=3).map("\n".join)
    | st.sampled_from(["x" * (MAX_ID_LENGTH + 1), "é", "e\u0301", "a\u200bb", "a//b", ""])
)
plain_texts = st.sampled_from(["", "plain words"])
tricky_texts = st.sampled_from(["é" * (MAX_TEXT_BYTES // 4 + 1), "x" * (MAX_TEXT_BYTES + 1)])


def oracle(events: list[Event]) -> list[Event] | tuple[int, str]:
    try:
        return [check_event(event, f"events[{i}]") for i, event in enumerate(events)]
    except DeliveryError as exc:
        return exc.status, exc.message


def decided(events: list[Event]) -> list[Event] | tuple[int, str]:
    try:
        return check_events(events)
    except DeliveryError as exc:
        return exc.status, exc.message


@st.composite
def events(
    draw: st.DrawFn,
    subjects: st.SearchStrategy[str],
    ids: st.SearchStrategy[str],
    texts: st.SearchStrategy[str],
    kinds: tuple[str, ...] = ("upsert", "delete", "link"),
) -> Event:
    """An event whose subject is one of ``subjects``, its links or target of ``ids``."""
    subject = draw(subjects)
    kind = draw(st.sampled_from(kinds))
    envelope = {"specversion": "1.0", "id": "e", "source": "test://checks", "subject": subject}
    if kind == "upsert":
        data = UpsertData(version=1, text=draw(texts), links=draw(st.lists(ids, max_size=4)))
        return ConceptUpserted(**envelope, data=data)  # type: ignore[arg-type]
    if kind == "delete":
        return ConceptDeleted(**envelope, data=DeleteData(version=1))  # type: ignore[arg-type]
    return LinkAdded(**envelope, data=LinkData(version=1, target=draw(ids)))  # type: ignore[arg-type]


@st.composite
def batches(draw: st.DrawFn) -> list[Event]:
    """Plain events, and maybe one anywhere whose ids or text may break a rule."""
    batch = draw(st.lists(events(plain_ids, plain_ids, plain_texts), max_size=5))
    if draw(st.booleans()):
        odd = (
            events(tricky_ids, plain_ids, plain_texts)
            | events(plain_ids, tricky_ids, plain_texts, ("upsert", "link"))
            | events(plain_ids, plain_ids, tricky_texts, ("upsert",))
        )
        batch.insert(draw(st.integers(0, len(batch))), draw(odd))
    return batch


@given(st.lists(plain_ids | tricky_ids, max_size=6))
def test_ids_are_plain_exactly_when_each_is_valid_and_ascii(batch: list[str]) -> None:
    expected = all(concept_id_problem(i) is None and i.isascii() for i in batch)
    assert all_plain_ids(batch) == expected


@given(batches())
def test_a_batch_checked_at_once_decides_as_each_event_alone(batch: list[Event]) -> None:
    assert decided(batch) == oracle(batch)


def test_a_plain_batch_is_returned_as_decoded_and_a_bad_one_names_its_event() -> None:
    good = [
        {"specversion": "1.0", "id": f"e{i}", "source": "s", "type": "concept.upserted",
         "subject": f"kb/c{i}", "data": {"version": 1, "links": [f"kb/c{i + 1}"]}}
        for i in range(3)
    ]  # fmt: skip
    events = decode_delivery(msgspec.json.encode(good), "application/json")
    assert [e.subject for e in events] == ["kb/c0", "kb/c1", "kb/c2"]
    bad = [*good[:2], {**good[2], "data": {"version": 1, "links": ["a//b"]}}]
    try:
        decode_delivery(msgspec.json.encode(bad), "application/json")
    except DeliveryError as exc:
        assert (exc.status, exc.message) == (
            422,
            "events[2].data.links[0]: invalid concept id: empty segment",
        )
    else:
        raise AssertionError("a delivery with an invalid link was taken")
