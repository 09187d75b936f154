"""What the tests share: the tokens and webhook secret of the test configs, the config itself,
a service in-process (Starlette's TestClient on a real SQLite store), a real ``kbgraph serve``
in a child process, and a few helpers more than one test module needs. Fixtures over these are
in ``conftest.py``; helpers with a subject of their own are modules beside this one
(``webhook_client``, ``kb_events``, ``vault_files``, ``histories``, ``embedders``,
``nats_cluster``, ``jetstream_nodes``, ...)."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
from starlette.testclient import TestClient

from kbgraph.api import context_of
from kbgraph.events import Event
from tests import webhook_client as wc

ROOT = Path(__file__).resolve().parent.parent
STARTUP_SECONDS = 120.0
GENEROUS = 15.0  # seconds: "closed within", never a speed claim
SUBPROCESS_SECONDS = 120
HANG_GUARD = 300.0  # seconds: a hang would otherwise stop the suite; never a speed claim

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PRIVATE_SECRET = "whsec_cHJpdmF0ZS1rYi1zZWNyZXQtZm9yLXRlc3Rz"  # a KB's own secret
ADMIN = "admin-token-of-the-tests"
INFRA = "infra-token-of-the-tests"  # homelab: collection infra only
RUNBOOKS = "runbooks-token-of-the-tests"  # homelab: type Runbook only
OTHER = "other-token-of-the-tests"  # a rule for another KB only


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header of a request made with ``token``."""
    return {"Authorization": f"Bearer {token}"}


def write_config(
    folder: Path, extra: str = "", min_seq_wait: float | None = 1.0, store: str = "kbgraph.db"
) -> Path:
    """``folder/kbgraph.toml``: the store at ``store`` (relative to the folder), the webhook
    secret, the four tokens above (admin; infra: collection ``infra`` of ``homelab``; runbooks:
    type ``Runbook`` of ``homelab``, given by its sha256; other: KB ``elsewhere`` only),
    ``X-Min-Seq`` waits of ``min_seq_wait`` seconds (None: the service's default), and
    ``extra`` TOML before the tokens."""
    runbooks_sha = hashlib.sha256(RUNBOOKS.encode()).hexdigest()
    server = "" if min_seq_wait is None else f"[server]\nmin_seq_wait_seconds = {min_seq_wait}\n"
    path = folder / "kbgraph.toml"
    path.write_text(
        f"""
[store]
path = "{store}"

[webhooks]
secrets = ["{SECRET}"]

{server}{extra}
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
        seq = context_of(self.app).service.store.append(kb, events).seq
        if vectors:
            self.vectors_settled(kb, seq)
        return seq

    def vectors_settled(self, kb: str, seq: int, timeout: float = 120.0) -> None:
        projections = context_of(self.app).service.projections
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
            headers.update(bearer(token))
        if min_seq:
            headers["X-Min-Seq"] = str(min_seq)
        return self.client.request(method, path, headers=headers, **kwargs)

    def tool(self, token: str, kb: str, name: str, body: dict, min_seq: int = 0):
        return self.call(token, "POST", f"/v1/kbs/{kb}/tools/{name}", min_seq, json=body)


def served_config(folder: Path) -> Path:
    """The config of a real ``kbgraph serve`` in these tests: the store at ``folder/kb.db``
    (the tests open it), ``X-Min-Seq`` waits as long as the service's default."""
    return write_config(folder, min_seq_wait=None, store="kb.db")


BOUND = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")  # uvicorn's start-up line


class ServerProcess(subprocess.Popen[bytes]):
    """A ``kbgraph serve`` child; ``port`` is the one it bound (it chose it: ``--port 0``).

    Letting the server pick its own port leaves no window for another process (a parallel test
    run, say) to take a port probed as free, and none in which a health check could reach some
    other server. A thread drains stderr (a full pipe would block the server's logging) and
    keeps its tail for the failure message.
    """

    port: int | None = None

    def __init__(self, command: list[str]) -> None:
        super().__init__(
            command,
            start_new_session=True,  # the workers of --workers N share the group
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        self.log: collections.deque[str] = collections.deque(maxlen=40)
        self.bound = threading.Event()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        for raw in self.stderr:  # type: ignore[union-attr]
            line = raw.decode(errors="replace").rstrip()
            self.log.append(line)
            found = BOUND.search(line)
            if found and self.port is None:
                self.port = int(found[1])
                self.bound.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self) -> str:
        """The last lines logged; once the server has exited, all of them (the reader drains
        the pipe to its end)."""
        if self.poll() is not None:
            self.reader.join(5)
        return "\n".join(self.log)


def start_server(
    config: Path, port: int = 0, workers: int = 1, module: str = "kbgraph"
) -> ServerProcess:
    """``kbgraph serve`` on loopback (``python -m module``), returned once it answers
    ``/healthz``."""
    command = [sys.executable, "-m", module, "serve", "--config", str(config)]
    proc = ServerProcess([*command, "--port", str(port), "--workers", str(workers)])
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.tail()[-2000:]}")
        if proc.bound.wait(0.1):
            try:
                if httpx.get(f"{proc.url}/healthz", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    stop(proc)
    raise AssertionError(f"server did not start: {proc.tail()[-2000:]}")


@contextlib.contextmanager
def running(config: Path) -> Iterator[str]:
    """A real ``kbgraph serve`` on a loopback port of its choosing; yields its base URL."""
    proc = start_server(config)
    try:
        yield proc.url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    if isinstance(proc, ServerProcess):
        proc.reader.join(30)  # EOF once every process of the group is gone
    if proc.stderr is not None:
        proc.stderr.close()


def closed_by_server(sock: socket.socket, within: float = GENEROUS) -> bool:
    """True when the server closes ``sock`` (EOF or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def binary(
    event: dict, content_type: str = "application/json", **extra: str
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of ``event`` in binary mode, signed; attribute values percent-encoded."""
    body = json.dumps(event["data"]).encode()
    headers = wc.signed_headers(SECRET, body, content_type)
    for name in ("specversion", "id", "source", "type", "subject"):
        headers[f"ce-{name}"] = quote(event[name], safe="/:")
    headers.update(extra)
    return body, headers


def scripts() -> list[str]:
    """The loadtest modules meant to be run: those with a ``__main__`` block."""
    return sorted(
        path.stem
        for path in (ROOT / "loadtest").glob("*.py")
        if path.stem != "__main__" and 'if __name__ == "__main__"' in path.read_text()
    )


def python_without(code: str, blocked: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where the ``blocked`` modules cannot be imported."""
    prelude = f"import sys\nBLOCKED = {blocked!r}\n"
    prelude += "for name in BLOCKED:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_SECONDS,
    )


def cli_without(args: list[str], blocked: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``kbgraph ARGS`` in a fresh interpreter where the ``blocked`` modules cannot be imported."""
    return python_without(f"from kbgraph.cli import main\nsys.exit(main({args!r}))", blocked, cwd)
