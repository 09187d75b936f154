"""``kbgraph cluster skip``: an operator's decision, recorded in the stream, that the message at
one position applies nothing on any node (the way forward when every node fails on it); its
command line is ``kbgraph.log.jetstream.commands``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from pathlib import Path
from types import SimpleNamespace
from typing import Final

import msgspec
import nats.js.errors

from kbgraph.config import Config, JetStreamConfig
from kbgraph.log.jetstream import snapshots, wire
from kbgraph.log.jetstream.connect import connect, decision_rules, signer
from kbgraph.log.jetstream.node import NODE_ENV

RESTORE_SECONDS: Final = 600.0  # fetching and unpacking the newest snapshot, at most
CONNECT_SECONDS: Final = 20.0  # NATS not answering by then: serve, and /readyz says why


class DecisionRefused(ValueError):
    """The decision would not do what it says (no such message, or decided already)."""


async def skip(config: JetStreamConfig, position: int, reason: str) -> int:
    """Publish "skip ``position``" with ``reason``; the decision's own stream sequence.

    Checked first: the message exists and is a delivery, and no decision skips it already. A
    retry of the command within JetStream's duplicate window publishes nothing new."""
    if not reason.strip():
        raise DecisionRefused("--reason: say why (it is recorded in every node's store)")
    signing = signer(config)
    nc = await asyncio.wait_for(connect(config, "kbgraph-admin", reconnect=False), CONNECT_SECONDS)
    try:
        js = nc.jetstream(timeout=5)
        stream, subject = config.stream, wire.decision_subject(config.stream)
        try:
            raw = await js.get_msg(stream, position)
        except nats.js.errors.NotFoundError:
            raise DecisionRefused(f"stream {stream} holds no message at {position}") from None
        if raw.subject == subject:
            raise DecisionRefused(f"position {position} is a decision, not a delivery")
        after = position + 1
        while True:
            try:
                found = await js.get_msg(stream, after, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            valid = signing.valid(subject, found.data or b"", found.headers or {})
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                if valid and wire.decode_decision(found.data or b"").position == position:
                    raise DecisionRefused(
                        f"position {position} is skipped already, by the decision at {found.seq}"
                    )
            after = int(found.seq) + 1
        payload = wire.encode_decision(wire.Skip(position, reason))
        headers: dict[str, str] = {}
        signing.sign(subject, payload, headers)
        # the id is the MAC's: a retried command publishes nothing new, and nobody without
        # the cluster secret can store a message under it first
        headers[wire.MSG_ID] = f"skip-{position}-{headers[wire.MAC][:32]}"
        ack = await js.publish(subject, payload, headers=headers)
        if ack.duplicate:
            stored = await js.get_msg(stream, int(ack.seq))
            if (stored.data or b"") != payload or not signing.valid(
                subject, stored.data or b"", stored.headers or {}
            ):
                raise DecisionRefused(
                    f"the stream answered with the message at {ack.seq}, not this decision:"
                    " not recorded, run the command again"
                )
        return int(ack.seq)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


def restore_before_serving(config: Config) -> str | None:
    """Before ``kbgraph serve`` opens the store: a fresh or far-behind node (the stream no
    longer holds the next message it needs) restores the newest snapshot. The reason it must
    not start, or None (restored, not needed, or NATS not reachable: the node says so)."""

    node = secrets.token_hex(6)  # the serving node reports under the same key
    os.environ[NODE_ENV] = node

    async def run() -> None:
        nc = await asyncio.wait_for(
            connect(config.log.jetstream, "kbgraph-restore", reconnect=False), CONNECT_SECONDS
        )
        try:
            settings = SimpleNamespace(
                max_kbs=config.limits.max_kbs,
                named_kbs=frozenset(config.webhooks.kbs),
                dedupe_keys=config.store.dedupe_keys,
            )
            signing = signer(config.log.jetstream)
            await snapshots.prepare(
                nc.jetstream(timeout=30),
                config.log.jetstream.stream,
                signing,
                decision_rules(settings, signing),
                Path(config.store.path),
                config.store.checkpoint_folder,
                node,
            )
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    try:
        asyncio.run(asyncio.wait_for(run(), RESTORE_SECONDS))
    except snapshots.SnapshotRefused as exc:
        return str(exc)
    except Exception as exc:  # NATS down, say: the node starts and says why on /readyz
        logging.getLogger("kbgraph.log.jetstream").warning("no snapshot restored: %r", exc)
    return None
