"""The follower's hold (``kbgraph.projection.hold``): when it waits, and what ends a wait."""

from __future__ import annotations

import threading

from kbgraph.projection.hold import HOLD_BELOW, Hold


def held_in_thread(hold: Hold, records: int, stopping: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=hold.after, args=(records, stopping))
    thread.start()
    return thread


def test_no_hold_after_an_empty_or_a_large_batch_or_when_off() -> None:
    stopping = threading.Event()
    assert not Hold(60).after(0, stopping)
    assert not Hold(60).after(HOLD_BELOW, stopping)
    assert not Hold(0).after(1, stopping)


def test_no_hold_while_stopping_nor_after_a_request_asked_for_a_seq() -> None:
    stopping = threading.Event()
    stopping.set()
    assert not Hold(60).after(1, stopping)
    hold = Hold(60)
    hold.quiet = 3600  # the quiet time cannot run out during the test
    hold.asked()
    assert not hold.after(1, threading.Event())


def test_a_hold_is_bounded() -> None:
    assert Hold(0.01).after(1, threading.Event())


def test_a_request_asking_for_a_seq_cuts_a_hold_short() -> None:
    """A hold of a minute ends once a request asks for a seq (before the wait began or
    during it)."""
    hold = Hold(60)
    hold.quiet = 3600
    thread = held_in_thread(hold, 1, threading.Event())
    hold.asked()
    thread.join(10)
    assert not thread.is_alive()


def test_stopping_cuts_a_hold_short() -> None:
    """As ``Projections.stop`` does: the stop flag set, then ``end``."""
    hold = Hold(60)
    stopping = threading.Event()
    thread = held_in_thread(hold, 1, stopping)
    stopping.set()
    hold.end()
    thread.join(10)
    assert not thread.is_alive()
