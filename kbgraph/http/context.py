"""What every route is handed: one typed ``AppContext``, built once by the composition root
(``kbgraph.api.create_app``) and passed explicitly to the agent routes, the MCP endpoint and
the webhook, so that no route reads Starlette's untyped application state and mypy checks each
use.

The context is frozen; what the app's lifespan changes while it runs (whether it is ready, the
MCP SDK's session manager, made anew for each run of the lifespan) is in ``Running``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from kbgraph.config import Config, TokenGrant
from kbgraph.events import SignatureVerifier
from kbgraph.http.health import WriteProbe
from kbgraph.http.inflight import InflightBytes
from kbgraph.service import Service


@dataclass(slots=True)
class Running:
    """What the lifespan sets: ready once the service is open and following its log, and the
    MCP session manager of this run (the SDK's manager runs once)."""

    ready: bool = False
    mcp: StreamableHTTPSessionManager | None = None


@dataclass(frozen=True, slots=True)
class AppContext:
    """The service and the settings every request reads (see the module's text)."""

    config: Config
    service: Service  # opened by the lifespan: its store, projections, log and tool threads
    tokens: Mapping[str, TokenGrant]  # sha256 of a bearer token -> what it may see
    verifier: SignatureVerifier  # the webhook secrets of every KB without its own
    kb_verifiers: Mapping[str, SignatureVerifier]  # a KB's own secrets
    inflight: InflightBytes
    write_probe: WriteProbe
    running: Running = field(default_factory=Running)

    @classmethod
    def build(cls, config: Config, service: Service) -> AppContext:
        """The context of ``config``'s service (nothing opened yet)."""
        return cls(
            config=config,
            service=service,
            tokens=config.token_index(),
            verifier=SignatureVerifier(list(config.webhooks.secrets)),
            kb_verifiers={
                kb: SignatureVerifier(list(own.secrets)) for kb, own in config.webhooks.kbs.items()
            },
            inflight=InflightBytes(config.limits.max_inflight_ingest_bytes),
            write_probe=WriteProbe(config.store.path),
        )

    def verifier_for(self, kb: str) -> SignatureVerifier:
        """The KB's own secrets' verifier, else the default one (none configured: unsigned)."""
        return self.kb_verifiers.get(kb, self.verifier)
