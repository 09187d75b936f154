"""The TOML configuration (docs/configuration.md), decoded strictly.

Every problem raises ``ConfigError`` with a message naming the key (``unknown key store.pth``,
``tokens[1].rules[0]: missing required field kb``), so a wrong config stops start-up with a
message an operator can act on. Paths in the file are relative to the file's folder. A key
read from the place an earlier release kept it is logged once as a warning naming its place
now (``moved_log_keys``).

```toml
[store]
path = "kbgraph.db"

[webhooks]
secrets = ["whsec_..."]          # every KB without secrets of its own
# unsigned = true              # with tokens and no secrets above: unsigned deliveries, meant

[webhooks.kbs.homelab]
secrets = ["whsec_..."]          # only these sign deliveries to KB homelab

[log]                          # optional; the embedded default is kind = "sqlite"
kind = "jetstream"             # several nodes over NATS JetStream, each a full replica

[log.jetstream]                # read with kind = "jetstream" only
servers = ["nats://127.0.0.1:4222"]
stream = "kbgraph"
replicas = 3

[server]                       # optional
max_body_bytes = 16777216
min_seq_wait_seconds = 5.0
allowed_origins = []           # e.g. ["http://localhost:6274"]: see kbgraph.http.origins

[limits]                       # optional; the defaults, see docs/operations.md "Limits"
max_request_bytes = 1048576
max_header_bytes = 16384
header_timeout_seconds = 10.0
body_timeout_seconds = 10.0
min_body_bytes_per_second = 65536
keep_alive_seconds = 5.0
max_connections = 1000
max_kbs = 1000
max_inflight_ingest_bytes = 67108864

[[tokens]]
name = "ops-agent"
token_sha256 = "..."           # or token = "..."; exactly one of the two
admin = false
rules = [{ kb = "homelab", collections = ["infra"] }, { kb = "homelab", types = ["Runbook"] }]
```
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
import tomllib
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from kbgraph.access import Rule, RuleSet, canonical
from kbgraph.names import KB_NAME_PATTERN, is_kb_name

DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
# a token written in the config: shorter is guessable (a token_sha256 cannot be measured)
MIN_TOKEN_CHARS: Final = 16
# the environment variable naming the config file: set by ``kbgraph serve``, read by the app
# factory (``kbgraph.api.app_from_env``) and the HTTP protocol in every uvicorn worker
CONFIG_ENV: Final = "KBGRAPH_CONFIG"
JETSTREAM_SECTION: Final = "log.jetstream"  # the JetStream log's keys, as messages name them
_HEX64: Final = re.compile(r"[0-9a-fA-F]{64}")
_MSGSPEC_AT: Final = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN: Final = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
_MISSING: Final = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")

log = logging.getLogger("kbgraph.config")


class ConfigError(Exception):
    """A configuration that must stop start-up; the message names the offending key."""


class StoreConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    path: str = "kbgraph.db"  # absolute once loaded
    checkpoints: str = ""  # folder of projection checkpoints; "" = beside path, ".checkpoints"
    # a checkpoint once the log grew this much past the last one (0: never); then the log
    # before it is cut, keeping log_retain_events records for followers just behind
    checkpoint_every_events: Annotated[int, msgspec.Meta(ge=0)] = 100_000
    log_retain_events: Annotated[int, msgspec.Meta(ge=0)] = 10_000
    # a KB's last this many accepted (source, id) keys answer "duplicates" (docs/events.md);
    # an older event sent again is decided by its version alone
    dedupe_keys: Annotated[int, msgspec.Meta(ge=1)] = 1_000_000

    @property
    def checkpoint_folder(self) -> Path | None:
        if not self.checkpoint_every_events:
            return None
        return Path(self.checkpoints or f"{self.path}.checkpoints")


class KBWebhooksConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    secrets: list[str] = []  # only these sign deliveries to this KB


class WebhooksConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    secrets: list[str] = []  # every KB without secrets of its own
    kbs: dict[str, KBWebhooksConfig] = {}
    # no secret above beside [[tokens]]: `serve` refuses that unless this says it is meant
    unsigned: bool = False

    def secrets_for(self, kb: str) -> list[str]:
        own = self.kbs.get(kb)
        return list(own.secrets) if own is not None else list(self.secrets)


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_MAX_BODY_BYTES
    min_seq_wait_seconds: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    # browser origins besides the service's own that may call it (auth off) or its MCP endpoint
    allowed_origins: list[str] = []


class LimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Per-connection and per-request bounds of the HTTP server (docs/operations.md "Limits")."""

    max_request_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1 << 20  # agent API bodies: 413
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 << 10  # request head: 431
    header_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0  # head not complete
    # a request body must end within body_timeout_seconds plus one second per
    # min_body_bytes_per_second bytes received: a trickled body cannot hold a connection
    body_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    min_body_bytes_per_second: Annotated[int, msgspec.Meta(ge=1)] = 64 << 10
    keep_alive_seconds: Annotated[float, msgspec.Meta(gt=0)] = 5.0  # idle between requests
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 1000  # per worker process
    max_kbs: Annotated[int, msgspec.Meta(ge=1)] = 1000  # a delivery creating one more: 403
    # delivery bodies being read or decoded at once, per worker process: past it 503
    max_inflight_ingest_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 << 20


class JetStreamConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[log.jetstream]``: the NATS JetStream stream every node follows into its own store
    (docs/operations.md "A cluster"). The previous release read these keys flat in ``[log]``:
    they still are, with a warning (``moved_log_keys``)."""

    # the cluster's client URLs (a node reconnects to any of them)
    servers: list[str] = msgspec.field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    stream: str = "kbgraph"  # the stream's name (subjects "<stream>.<kb>")
    replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 3  # the stream's replicas
    publish_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0  # then 503
    # a snapshot of this node's store to the bucket "<stream>-snapshots" this often (0:
    # never), the bucket keeping the newest snapshots_keep; the stream trimmed below them
    snapshot_every_seconds: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    snapshots_keep: Annotated[int, msgspec.Meta(ge=1)] = 2
    # security (kbgraph.log.jetstream.connect): every secret from a file or a variable
    user: str = ""  # with password_file / password_env
    password_file: str = ""
    password_env: str = ""
    token_file: str = ""
    token_env: str = ""
    nkey_seed_file: str = ""
    nkey_seed_env: str = ""
    creds_file: str = ""  # a .creds file (user JWT and nkey seed)
    tls_ca_file: str = ""  # the CA that signed the servers' certificates
    tls_cert_file: str = ""  # this node's client certificate, with tls_key_file
    tls_key_file: str = ""
    mac_secret_file: str = ""  # the cluster secret every message is signed with (required)
    mac_secret_env: str = ""
    # a secret written in clear: refused by _check_log, naming the key
    password: str | None = None
    token: str | None = None
    nkey_seed: str | None = None
    mac_secret: str | None = None


class LogConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Where the log lives: the store's SQLite file (one machine) or a NATS JetStream stream
    (``jetstream``, its own section)."""

    kind: Literal["sqlite", "jetstream"] = "sqlite"
    jetstream: JetStreamConfig = JetStreamConfig()


class RuleConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    kb: str
    collections: list[str] = []
    types: list[str] = []


class TokenConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    token: str | None = None
    token_sha256: str | None = None
    admin: bool = False
    rules: list[RuleConfig] = []
    metrics: bool = False  # may read /metrics (counts over every KB); admin tokens may too

    def sha256(self) -> str:
        """The hex sha256 of the token, the key it is looked up by."""
        if self.token_sha256 is not None:
            return self.token_sha256.lower()
        assert self.token is not None
        return token_sha256(self.token)


class TokenGrant(msgspec.Struct, frozen=True):
    """What a bearer token may see: everything (admin) or, per KB, its canonical rules."""

    name: str
    admin: bool
    rules: dict[str, RuleSet]  # kb -> canonical rules; empty for admin
    metrics: bool = False  # may read /metrics


class EmbeddingsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Vectors for search and seeds (docs/configuration.md, Embeddings). ``default``: ``local`` when
    the wordllama package is installed, else ``none``."""

    provider: Literal["default", "local", "openai", "none"] = "default"
    url: str = "http://127.0.0.1:11434/v1"  # openai: the API's base (``/embeddings`` is added)
    model: str = "nomic-embed-text"  # openai: the model name sent
    api_key_env: str = ""  # openai: the variable holding the key (never the key itself)
    batch: Annotated[int, msgspec.Meta(ge=1, le=2048)] = 64  # openai: texts per request
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0  # openai: per request
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3  # openai: then later, from the filler
    # what is embedded of a concept: its first max_chars characters (names first, then text)
    max_chars: Annotated[int, msgspec.Meta(ge=100)] = 8000
    # a question waits this long for its vector, then is answered by its words alone
    query_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 1.0


class MentionsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Mention edges (docs/configuration.md, Mentions): a concept's text naming another."""

    enabled: bool = True  # every KB keeps them, but those named in ``off``
    off: list[str] = []  # KBs without mention edges

    def on_for(self, kb: str) -> bool:
        return self.enabled and kb not in self.off


class Config(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    store: StoreConfig = StoreConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    mentions: MentionsConfig = MentionsConfig()
    webhooks: WebhooksConfig = WebhooksConfig()
    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    log: LogConfig = LogConfig()
    tokens: list[TokenConfig] = []

    @property
    def auth_enabled(self) -> bool:
        """Both doors locked: signed webhooks (for every KB) and bearer tokens."""
        return bool(self.webhooks.secrets) and bool(self.tokens)

    def open_doors(self) -> list[str]:
        """What anyone who can reach the port may do without a credential, one line each."""
        doors = []
        if not self.tokens:
            doors.append("no bearer token ([[tokens]]): every caller reads every KB as admin")
        if not self.webhooks.secrets:
            signed = ", ".join(sorted(self.webhooks.kbs))
            but = f" but {signed}" if signed else ""
            doors.append(
                f"no webhook secret ([webhooks] secrets): unsigned deliveries write into every"
                f" KB{but}"
            )
        return doors

    def token_index(self) -> dict[str, TokenGrant]:
        """Grants keyed by the sha256 hex of the token (compare hashes, never raw tokens)."""
        index: dict[str, TokenGrant] = {}
        for token in self.tokens:
            per_kb: dict[str, list[Rule]] = {}
            if not token.admin:
                for rule in token.rules:
                    per_kb.setdefault(rule.kb, []).append(
                        Rule(frozenset(rule.collections), frozenset(rule.types))
                    )
            index[token.sha256()] = TokenGrant(
                name=token.name,
                admin=token.admin,
                rules={kb: canonical(rules) for kb, rules in sorted(per_kb.items())},
                metrics=token.admin or token.metrics,
            )
        return index


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_config(path: str | Path, quiet: bool = False) -> Config:
    """Read, decode and check a config file; raise ConfigError naming the key on any problem.
    ``quiet``: no warning of keys in an earlier release's place (a process ``kbgraph serve``
    started reads the file it read and warned of already)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8") from None
    return parse_config(text, base_dir=path.resolve().parent, quiet=quiet, source=str(path))


def parse_config(
    text: str, base_dir: str | Path = ".", quiet: bool = False, source: str = ""
) -> Config:
    """``load_config`` on a string (from the file ``source``, if one); relative paths are
    resolved against ``base_dir``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}") from None
    moved = moved_log_keys(data)
    if moved and not quiet:
        where = f"config {source}" if source else "config"
        keys = ", ".join(moved)
        log.warning(
            "%s: [log] %s: the JetStream log's keys are in [%s] now; read from [log] this"
            " time, move them to [%s]",
            where,
            keys,
            JETSTREAM_SECTION,
            JETSTREAM_SECTION,
        )
    kbs = data.get("webhooks", {}).get("kbs", {}) if isinstance(data.get("webhooks"), dict) else {}
    for kb, table in kbs.items() if isinstance(kbs, dict) else ():
        try:  # one KB at a time, so an error names the KB (msgspec says "kbs[...]")
            msgspec.convert(table, KBWebhooksConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(_name_key(str(exc), f"webhooks.kbs.{kb}")) from None
    try:
        config = msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(_name_key(str(exc))) from None
    _check(config)
    base = Path(base_dir).resolve()
    store = config.store
    paths = {
        "path": str(base / store.path),  # an absolute path stays as it is
        "checkpoints": str(base / store.checkpoints) if store.checkpoints else "",
    }
    jetstream = config.log.jetstream
    files = {  # [log.jetstream]'s files, relative to the config's folder too
        key: str(base / getattr(jetstream, key))
        for key in jetstream.__struct_fields__
        if key.endswith("_file") and getattr(jetstream, key)
    }
    return msgspec.structs.replace(
        config,
        store=msgspec.structs.replace(store, **paths),
        log=msgspec.structs.replace(
            config.log, jetstream=msgspec.structs.replace(jetstream, **files)
        ),
    )


def moved_log_keys(data: dict[str, object]) -> list[str]:
    """Move the JetStream keys an earlier release read flat in ``[log]`` into
    ``[log.jetstream]`` in ``data`` (a parsed TOML document); the keys moved. A key set in
    both places is a ``ConfigError``: which one is meant cannot be told."""
    table = data.get("log")
    own = JetStreamConfig.__struct_fields__
    if not isinstance(table, dict) or not any(key in own for key in table):
        return []
    section = table.get("jetstream", {})
    if not isinstance(section, dict):
        return []  # msgspec names the key and what it expected
    moved = [key for key in table if key in own]
    both = [key for key in moved if key in section]
    if both:
        raise ConfigError(
            f"log.{both[0]}, {JETSTREAM_SECTION}.{both[0]}: set in both places; keep the one"
            f" in [{JETSTREAM_SECTION}] (an earlier release read it in [log])"
        )
    kept = {key: value for key, value in table.items() if key not in own}
    data["log"] = {**kept, "jetstream": {**section, **{key: table[key] for key in moved}}}
    return moved


def _name_key(message: str, prefix: str = "") -> str:
    """msgspec's "Object contains unknown field `pth` - at `$.store`" -> "unknown key store.pth"."""
    match = _MSGSPEC_AT.match(message)
    assert match is not None
    what, where = match["what"], _join(prefix, (match["path"] or "").lstrip(".")).strip(".")
    unknown = _UNKNOWN.match(what)
    if unknown:
        return f"unknown key {_join(where, unknown['key'])}"
    missing = _MISSING.match(what)
    if missing:
        return f"{where or 'config'}: missing required field {missing['key']}"
    return f"{where or 'config'}: {what.replace('`', '')}"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def secret_problem(secret: str) -> str | None:
    """What is wrong with a webhook secret in Standard Webhooks' form (``whsec_`` and the
    key in base64), or None: the config's secrets and a sender's (``kbgraph sync --url``)."""
    if not secret.startswith("whsec_"):
        return "expected whsec_<base64>"
    try:
        decoded = base64.b64decode(secret[len("whsec_") :], validate=True)
    except (binascii.Error, ValueError):
        return "not valid base64 after whsec_"
    if not decoded:
        return "empty secret"
    return None


def _check_secrets(secrets: list[str], key: str) -> None:
    for index, secret in enumerate(secrets):
        problem = secret_problem(secret)
        if problem:
            raise ConfigError(f"{key}[{index}]: {problem}")


def _check(config: Config) -> None:
    """What the types cannot say: secret syntax, token form, rule KB names, unique names."""
    if not config.store.path:
        raise ConfigError("store.path: empty")
    if "@" in config.embeddings.url.partition("://")[2].partition("/")[0]:
        raise ConfigError(
            "embeddings.url: credentials in the URL are refused (they would reach logs and"
            " stored vectors): put the key in the variable api_key_env names"
        )
    _check_log(config.log)
    _check_secrets(config.webhooks.secrets, "webhooks.secrets")
    if config.webhooks.unsigned and config.webhooks.secrets:
        raise ConfigError(
            "webhooks.unsigned: true beside webhooks.secrets: deliveries are signed or not,"
            " remove one"
        )
    for kb, own in config.webhooks.kbs.items():
        if not is_kb_name(kb):
            raise ConfigError(
                f"webhooks.kbs.{kb}: invalid kb name {kb!r}: expected {KB_NAME_PATTERN}"
            )
        if not own.secrets:
            raise ConfigError(f"webhooks.kbs.{kb}.secrets: empty (the KB would take no delivery)")
        _check_secrets(own.secrets, f"webhooks.kbs.{kb}.secrets")
    names: set[str] = set()
    hashes: set[str] = set()
    for index, token in enumerate(config.tokens):
        where = f"tokens[{index}]"
        if not token.name:
            raise ConfigError(f"{where}.name: empty")
        if token.name in names:
            raise ConfigError(f"{where}.name: duplicate token name {token.name!r}")
        names.add(token.name)
        if (token.token is None) == (token.token_sha256 is None):
            raise ConfigError(f"{where}: exactly one of token or token_sha256 is required")
        if token.token is not None and not token.token:
            raise ConfigError(f"{where}.token: empty")
        if token.token is not None and token.token != token.token.strip():
            # A caller's bearer token is stripped, so this one could never authenticate.
            raise ConfigError(
                f"{where}.token: leading or trailing whitespace in the token of {token.name!r}"
            )
        if token.token is not None and 0 < len(token.token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{where}.token: {len(token.token)} characters, too short to be secret: a token"
                f" needs at least {MIN_TOKEN_CHARS} (e.g. python -c 'import secrets;"
                " print(secrets.token_urlsafe(32))')"
            )
        if token.token_sha256 is not None and not _HEX64.fullmatch(token.token_sha256):
            raise ConfigError(f"{where}.token_sha256: expected 64 hex digits (sha256 of the token)")
        digest = token.sha256()
        if digest in hashes:
            raise ConfigError(f"{where}: same token as an earlier entry")
        hashes.add(digest)
        if token.admin and token.rules:
            raise ConfigError(f"{where}.rules: an admin token sees everything and takes no rules")
        for rule_index, rule in enumerate(token.rules):
            if not is_kb_name(rule.kb):
                raise ConfigError(
                    f"{where}.rules[{rule_index}].kb: invalid kb name {rule.kb!r}: "
                    f"expected {KB_NAME_PATTERN}"
                )


_STREAM_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_log(config: LogConfig) -> None:
    if config.kind != "jetstream":
        return
    js, at = config.jetstream, JETSTREAM_SECTION
    if not js.servers:
        raise ConfigError(f"{at}.servers: empty (jetstream needs at least one server URL)")
    for index, url in enumerate(js.servers):
        if not re.fullmatch(r"(nats|tls)://[^\s/]+", url):
            raise ConfigError(f"{at}.servers[{index}]: expected nats://host:port, got {url!r}")
    if not _STREAM_NAME.fullmatch(js.stream):
        raise ConfigError(f"{at}.stream: expected 1-64 of A-Z a-z 0-9 _ -, got {js.stream!r}")
    for key in ("password", "token", "nkey_seed", "mac_secret"):
        if getattr(js, key) is not None:
            raise ConfigError(
                f"{at}.{key}: a secret is never written in the config in clear:"
                f" use {at}.{key}_file or {at}.{key}_env"
            )
    for key in ("password", "token", "nkey_seed", "mac_secret"):
        if getattr(js, f"{key}_file") and getattr(js, f"{key}_env"):
            raise ConfigError(f"{at}.{key}_file, {at}.{key}_env: one or the other")
    if not (js.mac_secret_file or js.mac_secret_env):
        raise ConfigError(
            f"{at}.mac_secret_file or {at}.mac_secret_env: required with kind = jetstream"
            " (every message is signed with the cluster's secret; nodes refuse one without)"
        )
    if bool(js.user) != bool(js.password_file or js.password_env):
        raise ConfigError(f"{at}.user and {at}.password_file/_env: both or neither")
    ways = [js.user, js.token_file or js.token_env, js.nkey_seed_file or js.nkey_seed_env]
    if sum(bool(way) for way in [*ways, js.creds_file]) > 1:
        raise ConfigError(f"{at}: one of user/password, token, nkey_seed, creds_file")
    if bool(js.tls_cert_file) != bool(js.tls_key_file):
        raise ConfigError(f"{at}.tls_cert_file and {at}.tls_key_file: both or neither")
