"""The cluster embedder's claims and rule (``kbgraph.log.jetstream.lease``; issue 48, case 2): what
NATS credentials alone can write does not count (junk, a claim made with another secret, a
claim moved to another key, a claim past its time), the oldest counted claim holds, and a
holder named stalled is passed over."""

from __future__ import annotations

from kbgraph.log.jetstream import lease, wire
from kbgraph.log.jetstream.lease import LEASE_SECONDS, Claim

SIGNER = wire.Signer(b"the cluster's secret, 32 bytes..")
STREAM = "s"


def sealed(claim: Claim, signer: wire.Signer = SIGNER) -> tuple[str, bytes]:
    return lease.key(claim.name), lease.seal(signer, STREAM, claim)


def test_a_sealed_claim_opens_and_nothing_else_does() -> None:
    claim = Claim("node-a-1", 100.0, 200.0, ("node-b-2",))
    at, value = sealed(claim)
    assert lease.opened(SIGNER, STREAM, at, value) == claim
    other = wire.Signer(b"another secret of 32 bytes......")
    forged = [
        (at, b"holder"),
        (at, b""),
        (at, b"\xff\xfe\n{}"),
        sealed(claim, other),  # made without the cluster's secret
        (lease.key("node-c-3"), value),  # moved to another process's key
        (at, value.replace(b"200.0", b"900.0")),  # its time changed
    ]
    for at_key, junk in forged:
        assert lease.opened(SIGNER, STREAM, at_key, junk) is None, junk
    assert lease.opened(SIGNER, "another-stream", at, value) is None


def test_the_oldest_counted_claim_holds() -> None:
    now = 1000.0
    a, b, c = (Claim(n, since, now) for n, since in (("a", 30.0), ("b", 10.0), ("c", 20.0)))
    assert lease.holder([a, b, c], now) == "b"
    old_b = Claim("b", 10.0, now - LEASE_SECONDS - 0.1)  # a replay past its time
    assert lease.holder([a, old_b, c], now) == "c"
    ahead = Claim("b", 10.0, now + LEASE_SECONDS + 0.1)  # a clock far ahead counts not
    assert lease.holder([a, ahead, c], now) == "c"
    assert lease.holder([], now) is None
    same = [Claim("y", 5.0, now), Claim("x", 5.0, now)]
    assert lease.holder(same, now) == "x"


def test_a_holder_named_stalled_is_passed_over() -> None:
    now = 1000.0
    b = Claim("b", 10.0, now)
    c = Claim("c", 20.0, now, ("b",))
    a = Claim("a", 30.0, now)
    assert lease.holder([a, b, c], now) == "c"
    old_vote = Claim("c", 20.0, now - LEASE_SECONDS - 1, ("b",))  # a vote that lapsed
    assert lease.holder([a, b, old_vote], now) == "b"
    everyone = [Claim("b", 10.0, now, ("c",)), Claim("c", 20.0, now, ("b",))]
    assert lease.holder(everyone, now) == "b"  # all named: the rule over all of them
