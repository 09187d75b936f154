"""Shared fixtures: a configured service in-process (Starlette TestClient, real SQLite store)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings
from starlette.testclient import TestClient

from kbgraph.api import create_app
from kbgraph.config import load_config
from kbgraph.events import Event

if TYPE_CHECKING:
    from tests.nats_cluster import NatsCluster

# Hypothesis: "ci" (what scripts/test.sh and .ci/run use) draws the same examples on every run
# and keeps no example database, so a run never depends on an earlier one; "dev" (plain
# pytest) draws new examples each run and remembers failures. Either prints a
# ``@reproduce_failure`` blob with a failure (docs/getting-started.md: "Replaying a failure").
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_report_header() -> str:
    """Which SQLite this run is on (``scripts/test.sh`` runs a matrix of them)."""
    return f"sqlite: {sqlite3.sqlite_version} (module {sqlite3.__name__}, {sqlite3.__file__})"


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ADMIN = "admin-token-of-the-tests"
INFRA = "infra-token-of-the-tests"  # homelab: collection infra only
RUNBOOKS = "runbooks-token-of-the-tests"  # homelab: type Runbook only
OTHER = "other-token-of-the-tests"  # a rule for another KB only


def write_config(folder: Path, extra: str = "", min_seq_wait: float = 1.0) -> Path:
    runbooks_sha = hashlib.sha256(RUNBOOKS.encode()).hexdigest()
    path = folder / "kbgraph.toml"
    path.write_text(
        f"""
[store]
path = "kbgraph.db"

[webhooks]
secrets = ["{SECRET}"]

[server]
min_seq_wait_seconds = {min_seq_wait}
{extra}
[[tokens]]
name = "admin"
token = "{ADMIN}"
admin = true

[[tokens]]
name = "infra"
token = "{INFRA}"
rules = [{{ kb = "homelab", collections = ["infra"] }}]

[[tokens]]
name = "runbooks"
token_sha256 = "{runbooks_sha}"
rules = [{{ kb = "homelab", types = ["Runbook"] }}]

[[tokens]]
name = "other"
token = "{OTHER}"
rules = [{{ kb = "elsewhere" }}]
"""
    )
    return path


class Service:
    """A running app with helpers to write events and call the API as a given token."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.app = client.app

    def write(self, kb: str, events: list[Event], vectors: bool = True) -> int:
        """Append a delivery durably and return the KB's seq after it; with ``vectors``, once
        it is applied and the KB's vectors are settled too (they follow in the background, so
        an answer ranked by them is only determined then)."""
        seq = self.app.state.store.append(kb, events).seq
        if vectors:
            self.vectors_settled(kb, seq)
        return seq

    def vectors_settled(self, kb: str, seq: int, timeout: float = 120.0) -> None:
        projections = self.app.state.projections
        deadline = time.monotonic() + timeout
        while seq:
            p = projections.get(kb)
            if p is not None and p.seq >= seq and (p.vectors is None or not p.vectors.dirty):
                return
            assert time.monotonic() < deadline, f"{kb}: vectors not settled after {timeout} s"
            time.sleep(0.005)

    def call(self, token: str | None, method: str, path: str, min_seq: int = 0, **kwargs):
        headers = kwargs.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if min_seq:
            headers["X-Min-Seq"] = str(min_seq)
        return self.client.request(method, path, headers=headers, **kwargs)

    def tool(self, token: str, kb: str, name: str, body: dict, min_seq: int = 0):
        return self.call(token, "POST", f"/v1/kbs/{kb}/tools/{name}", min_seq, json=body)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (what the service runs on; selenium brings trio along)."""
    return "asyncio"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    app = create_app(load_config(write_config(tmp_path)))
    with TestClient(app) as client:
        yield Service(client)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """One NATS JetStream cluster for a module's tests that leave its servers as they found
    them (each test on a stream of its own): a start-up costs seconds on a loaded machine."""
    from tests.nats_cluster import running_cluster

    with running_cluster(tmp_path_factory.mktemp("nats")) as cluster:
        yield cluster
