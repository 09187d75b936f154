"""Reaching the stream: the NATS connection a node (or an admin command) opens, and the stream
with the decision rules its nodes share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, Protocol

import nats
import nats.errors
import nats.js.errors
from nats.js import api

from kbgraph.config import JETSTREAM_SECTION, JetStreamConfig
from kbgraph.log.jetstream.wire import Signer

log = logging.getLogger("kbgraph.log.jetstream")

DUPLICATE_WINDOW_SECONDS: Final = 120.0  # JetStream drops a re-publish with the same Msg-Id
RULES_KEY: Final = "kbgraph_decision_rules"  # stream metadata: what every node decides with
OPEN_SECONDS: Final = 10.0  # a NATS connection not open by then fails, naming the last error


class ConnectFailed(RuntimeError):
    """No NATS connection: the message names why (TLS, the servers refusing or silent)."""


class SecretMissing(RuntimeError):
    """A secret the config points to (a file, a variable) is not there."""


def read_secret(config: JetStreamConfig, key: str) -> bytes | None:
    """The secret ``<key>_file`` or ``<key>_env`` of ``[log.jetstream]`` names (stripped), if
    configured."""
    path, env = getattr(config, f"{key}_file"), getattr(config, f"{key}_env")
    if path:
        try:
            value = open(path, "rb").read().strip()  # noqa: SIM115 - read at once
        except OSError as exc:
            raise SecretMissing(
                f"{JETSTREAM_SECTION}.{key}_file: cannot read {path}: {exc.strerror}"
            ) from None
        if not value:
            raise SecretMissing(f"{JETSTREAM_SECTION}.{key}_file: {path} is empty")
        return value
    if env:
        value = os.environb.get(env.encode(), b"").strip()
        if not value:
            raise SecretMissing(f"{JETSTREAM_SECTION}.{key}_env: the variable {env} is not set")
        return value
    return None


def security_options(config: JetStreamConfig) -> dict[str, Any]:
    """nats-py's own connect options for the configured credentials and TLS."""
    options: dict[str, Any] = {}
    password = read_secret(config, "password")
    if config.user and password is not None:
        options["user"], options["password"] = config.user, password.decode()
    token = read_secret(config, "token")
    if token is not None:
        options["token"] = token.decode()
    seed = read_secret(config, "nkey_seed")
    if seed is not None:
        options["nkeys_seed_str"] = seed.decode()
    if config.creds_file:
        options["user_credentials"] = config.creds_file
    tls_urls = any(url.startswith("tls://") for url in config.servers)
    if config.tls_ca_file or config.tls_cert_file or tls_urls:
        context = ssl.create_default_context(cafile=config.tls_ca_file or None)
        if config.tls_cert_file:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        options["tls"] = context
    return options


def secrets_problem(config: JetStreamConfig) -> str | None:
    """Why the node could not read its secrets or TLS files (checked before serving)."""
    try:
        signer(config)
        security_options(config)
    except (SecretMissing, OSError, ssl.SSLError) as exc:
        return str(exc)
    return None


class RulesDiffer(RuntimeError):
    """This node's decision settings differ from those the stream's nodes decide with."""


class RuleSettings(Protocol):
    """What ``decision_rules`` reads (a ``Store`` has it)."""

    max_kbs: int | None
    named_kbs: frozenset[str]
    dedupe_keys: int


def decision_rules(store: RuleSettings, signer: Signer | None = None) -> str:
    """The settings a delivery's decision depends on besides the stream: every node must have
    the same, or nodes would disagree on the same message (a KB created or refused, a key
    remembered or forgotten, a message's MAC valid or not)."""
    names = ",".join(sorted(store.named_kbs))
    rules = f"max_kbs={store.max_kbs}; dedupe_keys={store.dedupe_keys}; webhooks.kbs=[{names}]"
    return rules if signer is None else f"{rules}; mac={signer.fingerprint()}"


def signer(config: JetStreamConfig) -> Signer:
    secret = read_secret(config, "mac_secret")
    if secret is None:
        raise SecretMissing(
            f"{JETSTREAM_SECTION}.mac_secret_file or {JETSTREAM_SECTION}.mac_secret_env:"
            " not configured"
        )
    try:
        return Signer(secret)
    except ValueError as exc:
        raise SecretMissing(f"{JETSTREAM_SECTION}.mac_secret: {exc}") from None


CLOSED_AFTER_HANDSHAKE: Final = (
    ": the server closed the connection right after the TLS handshake, which is how a TLS 1.3"
    " server refuses a client certificate it does not trust"
    f" ({JETSTREAM_SECTION}.tls_cert_file); its alert ('unknown ca', 'bad certificate') is lost"
    " when our first write finds the socket closed"
)


def _refusal_hint(config: JetStreamConfig, seen: BaseException | None) -> str:
    """``CLOSED_AFTER_HANDSHAKE`` when a failure looks like a TLS 1.3 server refusing our client
    certificate, else "": it checks the certificate after the client's side of the handshake is
    done, so the client may learn of the refusal only as a closed socket on its first write
    (CONNECT), never as the alert."""
    closed = isinstance(seen, (BrokenPipeError, ConnectionResetError))
    return CLOSED_AFTER_HANDSHAKE if config.tls_cert_file and closed else ""


async def _quiet(exc: Exception) -> None:
    log.debug("nats: %r", exc)


async def connect(
    config: JetStreamConfig,
    name: str,
    *,
    disconnected: Callable[[], Awaitable[None]] | None = None,
    reconnected: Callable[[], Awaitable[None]] | None = None,
    error: Callable[[Exception], Awaitable[None]] | None = None,
    reconnect: bool = True,
) -> Any:
    """A NATS connection to the configured servers, with the configured credentials and TLS
    (nats-py's own options), or ``ConnectFailed`` naming why, within ``OPEN_SECONDS``.

    A TLS failure while opening (a certificate that does not verify, an expired one, a server
    that speaks no TLS) fails at once: nats-py would retry, or hang for good closing the
    connection whose TLS upgrade failed (its issue 718), and an unusable CA or certificate does
    not mend itself within a connection attempt. The caller retries (a node) or reports it."""
    said = error or _quiet
    last: list[Exception] = []
    tls_failed: asyncio.Future[ssl.SSLError] = asyncio.get_running_loop().create_future()

    async def heard(exc: Exception) -> None:
        last[:] = [exc]
        if isinstance(exc, ssl.SSLError) and not tls_failed.done():
            tls_failed.set_result(exc)
        await said(exc)

    options: dict[str, Any] = {
        **security_options(config),
        "servers": list(config.servers),
        "name": name,
        # one-shot (an admin command, the restore): each server twice, then NoServersError
        # (nats-py's 0 means "no limit" while connecting)
        "max_reconnect_attempts": -1 if reconnect else 1,
        "reconnect_time_wait": 0.2,
        "connect_timeout": 2,
        "error_cb": heard,
    }
    if disconnected is not None:
        options["disconnected_cb"] = disconnected
    if reconnected is not None:
        options["reconnected_cb"] = reconnected
    opening = asyncio.ensure_future(nats.connect(**options))
    try:
        either: set[asyncio.Future[Any]] = {opening, tls_failed}
        await asyncio.wait(either, timeout=OPEN_SECONDS, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not opening.done():
            opening.cancel()
            await asyncio.wait({opening}, timeout=1.0)  # its own cleanup, bounded too
    if opening.done() and not opening.cancelled() and opening.exception() is None:
        return opening.result()
    # a TLS failure is the cause whatever came after it (a later attempt's broken pipe, say)
    if tls_failed.done():
        raise ConnectFailed(f"TLS with the NATS server failed: {tls_failed.result()}")
    if opening.done() and not opening.cancelled():
        cause = opening.exception()
        seen = last[0] if last else cause  # nats-py's NoServersError says no more
        servers = ", ".join(config.servers)
        hint = _refusal_hint(config, seen)
        raise ConnectFailed(f"no NATS server reachable ({servers}): {seen!r}{hint}") from cause
    heard_last = f"{last[0]!r}" if last else "no answer"
    hint = _refusal_hint(config, last[0] if last else None)
    raise ConnectFailed(f"NATS not connected within {OPEN_SECONDS:.0f} s: {heard_last}{hint}")


async def disconnect(nc: Any, tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel a node's or worker's tasks (each awaited, however it ends), then close its NATS
    connection (``nc`` may be None: never opened)."""
    for task in tasks:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if nc is not None:
        with contextlib.suppress(Exception):
            await nc.close()


async def ensure_stream(js: Any, config: JetStreamConfig, rules: str) -> int:
    """Create the stream if missing (every node may try: it is idempotent); its last seq.

    The stream's metadata holds the decision rules (``decision_rules``) of the first node
    that found none there; a node whose own differ raises ``RulesDiffer`` and follows
    nothing (``/readyz`` names both), rather than decide some message otherwise."""
    stream = config.stream
    wanted = api.StreamConfig(
        name=stream,
        subjects=[f"{stream}.*"],
        num_replicas=config.replicas,
        storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
        metadata={RULES_KEY: rules},
    )
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        info = await js.add_stream(wanted)
    stated = (info.config.metadata or {}).get(RULES_KEY)
    if stated is None:  # a stream made by other means, or before the rules were stated
        info.config.metadata = {**(info.config.metadata or {}), RULES_KEY: rules}
        try:  # a node's NATS user need not (should not) be allowed to change the stream
            info = await js.update_stream(info.config)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            raise RulesDiffer(
                f"stream {stream} states no decision rules and this node may not state them"
                f" ({exc!r}): create the stream by starting a node (it states them), or set"
                f" the stream's metadata {RULES_KEY} to {rules!r} as its administrator"
            ) from None
        stated = (info.config.metadata or {}).get(RULES_KEY)
    if stated != rules:
        raise RulesDiffer(
            f"this node decides with {rules}, the nodes of stream {stream} with"
            f" {stated}: every node must decide alike ([limits] max_kbs, [store]"
            f" dedupe_keys, the [webhooks.kbs] names, [{JETSTREAM_SECTION}] mac_secret), so this"
            " one follows nothing"
        )
    if info.config.num_replicas != config.replicas:
        log.warning(
            "stream %s has %s replicas, the config says %s: kept as it is",
            stream,
            info.config.num_replicas,
            config.replicas,
        )
    return int(info.state.last_seq)
