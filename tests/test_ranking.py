"""graph_context's ``ranked`` as a function of its seeds and results (kbgraph.agent.ranking)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET

from kbgraph.agent.ranking import GRAPH_SHARE, ranked
from kbgraph.agent.shapes import ContextResult, Seed

NAMES = [f"c/{i:02d}" for i in range(40)]
ROUNDED = st.integers(0, 10_000).map(lambda n: n / 10_000)


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[Seed], list[ContextResult], int]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=30))
    cut = draw(st.integers(0, len(names)))
    seeds = [Seed(n, n.upper(), draw(ROUNDED), draw(ROUNDED), "s") for n in names[:cut]]
    results = [
        ContextResult(n, n.upper(), draw(ROUNDED), draw(st.integers(1, 4)), names[0], "r")
        for n in names[cut:]
    ]
    return seeds, results, draw(st.integers(1, 30))


@given(answers())
def test_every_seed_and_result_at_most_once_best_first(
    answer: tuple[list[Seed], list[ContextResult], int],
) -> None:
    seeds, results, limit = answer
    out = ranked(seeds, results, limit)
    ids = [row.id for row in out]
    assert len(ids) == len(set(ids)) == min(limit, len(seeds) + len(results))
    order = [(-row.score, row.hops, row.id) for row in out]
    assert order == sorted(order)
    seed_ids = {s.id for s in seeds}
    for row in out:
        assert 0.0 <= row.score <= 1.0
        assert (row.hops == 0) == (row.id in seed_ids)
        assert isinstance(row.via, str) == (row.hops > 0)  # a seed has no via
    # nothing left out ranks above the last one kept
    if out:
        kept = {row.id for row in out}
        last = (-out[-1].score, out[-1].hops, out[-1].id)
        everyone = ranked(seeds, results, 1000)
        for row in everyone:
            if row.id not in kept:
                assert (-row.score, row.hops, row.id) > last
    assert ranked(seeds, results, limit) == out  # deterministic


def test_the_walk_breaks_a_near_tie_and_lifts_a_result_over_a_weak_seed() -> None:
    assert 0.05 <= GRAPH_SHARE <= 0.5  # the figures below are chosen for such a share
    seeds = [
        Seed("a", "A", 0.40, 0.10, ""),
        Seed("b", "B", 0.39, 0.40, ""),  # nearly a's match, and the walk favours it
        Seed("d", "D", 0.01, 0.00, ""),  # a weak match the walk does not reach
    ]
    results = [ContextResult("c", "C", 0.30, 1, "b", ""), ContextResult("e", "E", 0.0, 2, "c", "")]
    out = ranked(seeds, results, 4)
    assert [row.id for row in out] == ["b", "a", "c", "d"]
    assert out[2].hops == 1 and out[2].via == "b" and out[3].via is UNSET
    expected_b = (1 - GRAPH_SHARE) * 0.39 / 0.40 + GRAPH_SHARE * 1.0
    assert out[0].score == round(expected_b, 4)
    assert out[2].score == round(GRAPH_SHARE * 0.30 / 0.40, 4)
