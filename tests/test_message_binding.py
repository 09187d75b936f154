"""Signed messages bound to their KB (``GroupWriter.bind_messages``): a group of deliveries
looks its messages up and binds them in one statement each, and decides exactly as the same
deliveries committed one at a time do (a retry in the same group is a retry, the same message
for another KB in the same group a replay), whatever the mix."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbgraph.store import DeliveryResult, Store, WebhookMessage
from kbgraph.store.group import Pending
from tests.kb_events import upsert

delivery = st.tuples(
    st.sampled_from(["k1", "k2"]),  # the KB it is sent to
    st.integers(0, 3),  # its webhook-id
    st.integers(0, 1),  # its body (another body: another message under the same id)
    st.integers(0, 1),  # 1: new events under it (a replay with changed attributes)
)


def outcomes(path: Path, deliveries: list[tuple[str, int, int, int]], grouped: bool) -> list:
    got: list[object] = [None] * len(deliveries)

    def settle(at: int, result: DeliveryResult | None, exc: BaseException | None) -> None:
        got[at] = result if exc is None else type(exc).__name__

    group = []
    with Store(path) as store:
        for at, (kb, msg, body, fresh) in enumerate(deliveries):
            events = [upsert(f"m{msg}b{body}", 1 + fresh * at, title=f"{msg}/{body}")]
            message = WebhookMessage(f"msg_{msg}", bytes([body]) * 32)
            group.append(Pending(kb, events, functools.partial(settle, at), message))
        if grouped:
            store.commit_group(group)  # the writer thread is idle meanwhile
        else:
            for pending in group:
                store.commit_group([pending])
        state = {kb: store.kb_seq(kb) for kb in ("k1", "k2")}
    return [got, state]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(delivery, min_size=1, max_size=10))
def test_a_group_binds_as_its_deliveries_one_at_a_time(
    deliveries: list[tuple[str, int, int, int]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        alone = outcomes(Path(tmp) / "alone.db", deliveries, grouped=False)
        together = outcomes(Path(tmp) / "together.db", deliveries, grouped=True)
    assert together == alone
