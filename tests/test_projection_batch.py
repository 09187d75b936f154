"""A batch applied at once equals its events applied one at a time.

``KBProjection.apply`` gathers some patches over its batch and makes them at its end (the
links declared between existing concepts, the name trie's new names, the mention edges): at
the batch's end, and after a batch an event of which raises midway, the projection must be
what ``apply_event``, event by event, makes of the same events (of those applied before the
failure). Compared by concept id: the graph, the visible degrees of cached masks, the search
index's postings and lengths, the names the trie matches, and the mention edges per view.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbgraph.access import RuleSet
from kbgraph.events import Event
from kbgraph.projection import KBProjection
from kbgraph.search.nametrie import NAME_SEP
from kbgraph.store import LogRecord
from tests.histories import apply_in_deliveries, deliveries_st, dump, rules_st
from tests.kb_events import upsert


def fresh(rule_sets: list[RuleSet]) -> KBProjection:
    kb = KBProjection("kb")
    kb.attach_mentions(True)
    for rules in rule_sets:  # masks cached before the events, so they are patched along
        with kb.read():
            kb.mask(rules)
    kb.index.name_trie()  # the trie made at once, so it is patched along as well
    return kb


def state(kb: KBProjection, rule_sets: list[RuleSet]) -> dict[str, Any]:
    """Everything a reader can see of ``kb``, by concept id."""
    views: list[RuleSet | None] = [None, *rule_sets]
    out = dump(kb, views)
    assert out is not None
    index, mentions = kb.index, kb.mentions
    assert mentions is not None
    with kb.read() as snap:
        ids = snap.ids
        alive = [u for u in range(len(ids)) if snap.node(ids[u]) == u]
        out["postings"] = {
            part: {
                key: {ids[u]: hits for u, hits in held.items()}
                for key, held in getattr(index, part).as_dict().items()
            }
            for part in ("terms", "names", "tags")
        }
        out["lengths"] = {ids[u]: index.lengths(u) for u in alive if index.terms.holds(u)}
        out["name_lengths"] = dict(index.name_lengths)
        # every name ever put, each as a text of its own: those the trie still holds match
        texts = [" ".join(key.split(NAME_SEP)).encode() for key in index.names.keys]
        out["trie"] = sorted({key for _, _, _, key in index.name_trie().match_texts(texts)})
        out["mentions"] = {}
        for rules in views:
            view = snap.view(rules)
            edges = mentions.view(view.mask)
            out["mentions"][rules] = {
                (ids[u], ids[v]) for u in range(len(ids)) for v in edges.out(u)
            }
    return out


def one_by_one(events: list[Event], kb: KBProjection) -> None:
    for e in events:
        kb.apply_event(e)


def records_of(events: list[Event]) -> list[LogRecord]:
    return [LogRecord(i + 1, "kb", i + 1, e, False) for i, e in enumerate(events)]


settings_ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings_
@given(deliveries_st, st.lists(st.integers(1, 12), max_size=20), st.lists(rules_st, max_size=2))
def test_a_batch_equals_its_events_one_by_one(
    deliveries: list[list[Event]], sizes: list[int], rule_sets: list[RuleSet]
) -> None:
    events = [e for d in deliveries for e in d]
    kb, single = fresh(rule_sets), fresh(rule_sets)
    apply_in_deliveries(records_of(events), sizes, kb)
    one_by_one(events, single)
    single.seq = kb.seq
    assert state(kb, rule_sets) == state(single, rule_sets)


@settings_
@given(deliveries_st, st.data(), st.lists(rules_st, max_size=2))
def test_a_batch_failing_midway_equals_what_it_applied_one_by_one(
    deliveries: list[list[Event]], data: st.DataObject, rule_sets: list[RuleSet]
) -> None:
    """An event raising inside ``apply`` (a bug's way in) leaves what the events before it
    patched, gathered patches included, as one by one: nothing half made, nothing lost."""
    events = [e for d in deliveries for e in d]
    at = data.draw(st.integers(0, len(events)))
    broken = msgspec.structs.replace(upsert("net/x", 1, text="x"), data=None)
    records = records_of([*events[:at], broken, *events[at:]])
    kb, single = fresh(rule_sets), fresh(rule_sets)
    with pytest.raises(AttributeError):
        kb.apply([records])  # one delivery: the failure is inside the batch
    one_by_one(events[:at], single)
    assert kb.seq == single.seq == 0  # the delivery is not counted applied
    assert state(kb, rule_sets) == state(single, rule_sets)
