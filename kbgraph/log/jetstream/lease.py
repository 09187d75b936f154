"""Who embeds for the cluster: signed claims in the key-value bucket ``<stream>-embedder`` and
one rule that every process applies to them alike.

Every process that may embed writes its claim every ``RENEW_SECONDS`` under a key of its own
(``claim.<digest of its name>``): its name, when it began claiming (``since``), when it wrote
this claim (``at``), and the holders it found stalled. A claim is signed with the cluster's
secret (``Kbgraph-Mac``, over the key and the record), so NATS credentials alone cannot make
one. A claim counts while its MAC is valid and its ``at`` is within ``LEASE_SECONDS`` of the
reader's clock, so one captured and put back counts only until then. The holder is the
counted claim with the earliest ``since`` (then the least name) among those that no counted
claim names stalled (among all of them, should every one be named). A process applies the rule
from its second renewal on (``since`` set at its first, or when its claim had lapsed), so that
the claims of processes started with it show: two processes started at once agree at once.

Who can write the bucket without the secret cannot take the lease or keep it: junk and old
claims do not count, and a process always counts its own claim, so overwriting or purging the
others' claims makes more than one process embed (the same texts' rows, the first one taken:
``kbgraph.store.vectorrows.take``), never none. A process whose rows wait ``STALL_SECONDS``
while none settles names the holder stalled in its claims for ``VOTE_SECONDS``; the next
holder by the rule embeds from the next renewal on (``kbgraph.log.jetstream.embedder``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec
import nats.js.errors

from kbgraph.log.jetstream import wire

LEASE_SECONDS: Final = 10.0  # a claim counts this long after it was written (and the bucket's TTL)
RENEW_SECONDS: Final = 2.0  # each process writes its claim (and reads the others') this often
STALL_SECONDS: Final = 15.0  # rows waiting this long with none settled: the holder is stalled
VOTE_SECONDS: Final = 60.0  # a holder named stalled stays passed over this long
MAX_CLAIMS: Final = 64  # claims read per renewal (the bucket may hold junk keys besides)


class Claim(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One process's claim (wall-clock seconds)."""

    name: str
    since: float
    at: float
    stalled: tuple[str, ...] = ()


_decoder = msgspec.json.Decoder(Claim)


def bucket(stream: str) -> str:
    return f"{stream}-embedder"


def key(name: str) -> str:
    """A process's key: its name may hold characters a key may not."""
    return "claim." + hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


def _subject(stream: str, at_key: str) -> str:
    return f"$KV.{bucket(stream)}.{at_key}"


def seal(signer: wire.Signer, stream: str, claim: Claim) -> bytes:
    """The bucket's value of ``claim``: its MAC (hex), a newline, the claim (JSON)."""
    payload = msgspec.json.encode(claim)
    headers: dict[str, str] = {}
    signer.sign(_subject(stream, key(claim.name)), payload, headers)
    return headers[wire.MAC].encode() + b"\n" + payload


def opened(signer: wire.Signer, stream: str, at_key: str, value: bytes) -> Claim | None:
    """The claim a value of the bucket at ``at_key`` holds, or None: junk, a MAC that fails
    (made without the secret, or moved from another key)."""
    mac, _, payload = value.partition(b"\n")
    try:
        if not signer.valid(_subject(stream, at_key), payload, {wire.MAC: mac.decode()}):
            return None
        claim = _decoder.decode(payload)
    except (UnicodeDecodeError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return claim if key(claim.name) == at_key else None


def holder(claims: list[Claim], now: float) -> str | None:
    """The holder by the rule (see the module's text) among ``claims`` at wall time ``now``."""
    live = [c for c in claims if abs(now - c.at) <= LEASE_SECONDS]
    stalled = {name for c in live for name in c.stalled}
    candidates = [c for c in live if c.name not in stalled] or live
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c.since, c.name)).name


async def entries(js: Any, stream: str, limit: int = MAX_CLAIMS) -> list[tuple[str, bytes]]:
    """(key, value) of the bucket's claim keys, at most ``limit``, each read by its position
    in the bucket's stream (``STREAM.MSG.GET``: a node's permissions allow no consumer info,
    which nats-py's watchers ask for)."""
    prefix = f"$KV.{bucket(stream)}."
    found: list[tuple[str, bytes]] = []
    after = 1
    while len(found) < limit:
        try:
            raw = await js.get_msg(
                f"KV_{bucket(stream)}", after, subject=f"{prefix}claim.>", next=True
            )
        except nats.js.errors.NotFoundError:
            break
        after = int(raw.seq) + 1
        if not (raw.headers or {}).get("KV-Operation"):  # a delete or a purge: no claim
            found.append((raw.subject.removeprefix(prefix), raw.data or b""))
    return found


async def read(js: Any, signer: wire.Signer, stream: str) -> list[Claim]:
    """The valid claims in the bucket (``entries``: a bucket flooded with junk hides claims
    past ``MAX_CLAIMS``, which makes more than one holder, never none)."""
    claims = [opened(signer, stream, at_key, value) for at_key, value in await entries(js, stream)]
    return [claim for claim in claims if claim is not None]
