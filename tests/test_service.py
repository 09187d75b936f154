"""The service built in one place (``kbgraph.service``) around one ``DeliveryLog``."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kbgraph.config import load_config
from kbgraph.log import DeliveryLog
from kbgraph.log.sqlite import StoreLog
from tests.support import ROOT, write_config

# Serve a SQLite config end to end in a fresh interpreter: the CLI's parser (every command),
# the app, its lifespan, a signed delivery, a read that sees it, /readyz, then the modules.
SERVE_SQLITE = r"""
import json, sys
from starlette.testclient import TestClient
from kbgraph.api import create_app
from kbgraph.cli import build_parser
from kbgraph.config import load_config
from tests import webhook_client as wc
from tests.support import ADMIN, SECRET, bearer

build_parser()
config = load_config(sys.argv[1])
with TestClient(create_app(config)) as client:
    body, headers = wc.delivery(SECRET, [wc.upsert("infra/a", 1, title="A")])
    posted = client.post("/v1/kbs/homelab/events", content=body, headers=headers)
    auth = {**bearer(ADMIN), "X-Min-Seq": "1"}
    read = client.get("/v1/kbs/homelab/concepts/infra/a", headers=auth)
    ready = client.get("/readyz")
print(json.dumps({
    "posted": posted.status_code, "read": read.status_code, "ready": ready.status_code,
    "nats": sorted(m for m in sys.modules if m == "nats" or m.startswith("nats.")),
}))
"""


def child_json(script: str, config: Path) -> Any:
    """The JSON object on the last line ``script`` prints, run with ``config`` in a fresh
    interpreter (its imports and its heap its own)."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_sqlite_service_never_imports_nats(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[embeddings]\nprovider = "none"\n')
    out = child_json(SERVE_SQLITE, config)
    assert out == {"posted": 200, "read": 200, "ready": 200, "nats": []}


def test_the_log_is_chosen_by_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sqlite: the store's own log; jetstream: a node's log, or a worker's beside an applier.
    Each is a ``DeliveryLog`` (the protocol's methods, with their signatures)."""
    from kbgraph.log.backends import open_log
    from kbgraph.log.jetstream.backend import APPLIER_ENV
    from kbgraph.log.jetstream.node import JetStreamLog
    from kbgraph.log.jetstream.worker import WorkerLog
    from kbgraph.projection import Projections
    from kbgraph.store.opening import open_store

    sqlite = load_config(write_config(tmp_path))
    monkeypatch.setenv("KBGRAPH_TEST_MAC", "a cluster secret of 32 bytes....")
    (tmp_path / "js").mkdir()
    jetstream_path = write_config(
        tmp_path / "js",
        '[log]\nkind = "jetstream"\n[log.jetstream]\nmac_secret_env = "KBGRAPH_TEST_MAC"\n',
    )
    jetstream = load_config(jetstream_path)
    store = open_store(sqlite)
    try:
        projections = Projections(store)
        chosen = [open_log(sqlite, store, projections), open_log(jetstream, store, projections)]
        monkeypatch.setenv(APPLIER_ENV, "1")
        chosen.append(open_log(jetstream, store, projections))
        assert [type(log) for log in chosen] == [StoreLog, JetStreamLog, WorkerLog]
        for log in chosen:
            for name in ("follow", "append", "problem", "close"):
                ours, theirs = getattr(DeliveryLog, name), getattr(type(log), name)
                assert list(inspect.signature(theirs).parameters) == list(
                    inspect.signature(ours).parameters
                ), (type(log).__name__, name)
                assert inspect.iscoroutinefunction(theirs) == inspect.iscoroutinefunction(ours)
        chosen[2].applier.close()  # type: ignore[attr-defined]
    finally:
        store.close()


# Through the lifespan of an app the tests build, then of one uvicorn's factory builds for
# ``kbgraph serve``: only the second settles the process's heap (``settle_heap``).
SETTLED_HEAP = r"""
import gc, json, os, sys
from starlette.testclient import TestClient
from kbgraph.api import app_from_env, create_app
from kbgraph.config import CONFIG_ENV, load_config
from tests import webhook_client as wc
from tests.support import SECRET

def serve(app, subject):
    with TestClient(app) as client:
        body, headers = wc.delivery(SECRET, [wc.upsert(subject, 1, title="A")])
        posted = client.post("/v1/kbs/homelab/events", content=body, headers=headers)
        return posted.status_code, gc.get_freeze_count()

built = serve(create_app(load_config(sys.argv[1])), "infra/a")
os.environ[CONFIG_ENV] = sys.argv[1]
served = serve(app_from_env(), "infra/b")
print(json.dumps({"built": built, "served": served}))
"""


def test_only_a_serving_process_settles_its_heap(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[embeddings]\nprovider = "none"\n')
    out = child_json(SETTLED_HEAP, config)
    assert out["built"] == [200, 0]  # nothing frozen by an app the tests build
    posted, frozen = out["served"]
    assert posted == 200
    assert frozen > 10_000  # the modules, the kernels, the first build


# A serving process whose follower finds its next records cut (another worker wrote a
# checkpoint and cut the log past it) reloads; the reloaded KB is settled too. The cut is made
# by a second handle on the store, as another worker's, from a listener the follower runs after
# it applied the first delivery: it cannot read the cut records before they are gone.
RELOAD_SETTLED = r"""
import gc, json, os, sys, time, weakref
from starlette.testclient import TestClient
from kbgraph.api import app_from_env, context_of
from kbgraph.config import CONFIG_ENV, load_config
from kbgraph.store.opening import open_store
from tests import webhook_client as wc
from tests.kb_events import upsert
from tests.support import SECRET

KB = "homelab"
os.environ[CONFIG_ENV] = sys.argv[1]
other = open_store(load_config(sys.argv[1]))  # another worker's handle on the store
app = app_from_env()
seen = {}

def cut_past_the_follower(kb, seq):
    if seen:
        return
    seen["old"] = weakref.ref(projections.get(KB))
    for i in range(3):
        other.append(KB, [upsert(f"infra/cut{i}", title=f"cut {i}", text="past the follower")])
    other.cut_log(other.read_log(0)[-1].gid)  # keeps only the newest record

def wait(done, seconds):
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()

with TestClient(app) as client:
    projections = context_of(app).service.projections
    frozen = gc.get_freeze_count()
    projections.add_listener(cut_past_the_follower)
    body, headers = wc.delivery(SECRET, [wc.upsert("infra/a", 1, title="A", text="first")])
    posted = client.post("/v1/kbs/homelab/events", content=body, headers=headers).status_code
    replaced = wait(lambda: seen and projections.get(KB) is not seen["old"](), 60)
    settled = wait(lambda: gc.get_freeze_count() > frozen, 10)
    old_freed = wait(lambda: seen["old"]() is None, 10)
    parts, level = {}, [projections.get(KB)]  # the KB and what it holds, 3 levels down
    for _ in range(3):
        parts.update((id(o), o) for o in level)
        level = [
            o for o in gc.get_referents(*level)
            if gc.is_tracked(o) and id(o) not in parts
            and not isinstance(o, (type, type(sys)))  # shared with the whole process
        ]
    young = {id(o) for o in gc.get_objects()}
    print(json.dumps({
        "posted": posted, "replaced": bool(replaced), "settled": settled,
        "old_freed": old_freed, "seq": projections.seq(KB),
        "parts": len(parts), "young_parts": sum(i in young for i in parts),
    }))
other.close()
"""


def test_a_serving_process_settles_its_heap_again_after_a_reload(tmp_path: Path) -> None:
    """The KB a reload built leaves the collector's walks (it is frozen as the start-up heap
    was), and the KB it replaced is freed all the same."""
    config = write_config(tmp_path, '[embeddings]\nprovider = "none"\n')
    out = child_json(RELOAD_SETTLED, config)
    assert out["posted"] == 200 and out["replaced"], out
    assert out["seq"] == 4, out  # the delivery and the three written past the follower
    assert out["settled"] and out["old_freed"], out
    assert out["parts"] >= 20 and out["young_parts"] == 0, out
