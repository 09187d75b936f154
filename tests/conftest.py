"""The fixtures: a configured service in-process (Starlette TestClient, real SQLite store), a
NATS JetStream cluster for a module; what they are built from is in ``tests/support.py``."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings
from starlette.testclient import TestClient

from kbgraph.api import create_app
from kbgraph.config import load_config
from tests.support import Service, write_config

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
