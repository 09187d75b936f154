"""The service under test: a real ``kbgraph serve`` in a temp dir with generated credentials."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from loadtest import ROOT
from loadtest.httpload import HTTPLoadError, Pool

KB: Final = "loadtest"
HOST: Final = "127.0.0.1"
NARROW_COLLECTIONS: Final = ("infra", "network", "ops")
NARROW_TYPES: Final = ("Runbook",)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@dataclass
class Credentials:
    secret: str = field(default_factory=new_secret)
    admin: str = field(default_factory=lambda: "adm-" + secrets.token_urlsafe(18))
    agent: str = field(default_factory=lambda: "agt-" + secrets.token_urlsafe(18))


def write_config(folder: Path, creds: Credentials, kb: str = KB, log_toml: str = "") -> Path:
    """The service config: a secret, an admin token and a narrowed agent token; with
    ``log_toml`` (its ``[log]`` and ``[log.jetstream]`` sections), a node of several over NATS
    JetStream."""
    collections = ", ".join(f'"{c}"' for c in NARROW_COLLECTIONS)
    types = ", ".join(f'"{t}"' for t in NARROW_TYPES)
    path = folder / "kbgraph.toml"
    path.write_text(
        f"""[store]
path = "kbgraph.db"

[webhooks]
secrets = ["{creds.secret}"]

[[tokens]]
name = "admin"
token = "{creds.admin}"
admin = true

[[tokens]]
name = "agent"
token = "{creds.agent}"
rules = [{{ kb = "{kb}", collections = [{collections}] }}, {{ kb = "{kb}", types = [{types}] }}]
"""
    )
    if log_toml:
        with path.open("a") as out:
            out.write(f"\n{log_toml}")
    return path


class ServiceProcess:
    """``python -m kbgraph serve`` in its own process group, logging to a file."""

    ready_path = "/readyz"

    def __init__(
        self, config: Path, workers: int = 1, port: int | None = None, root: Path | None = None
    ) -> None:
        """``root``: run the server of another checkout (its own ``.venv``), e.g. a peer."""
        self.root = root or ROOT
        self.python = str(root / ".venv" / "bin" / "python") if root else sys.executable
        self.config = config
        self.workers = workers
        self.port = port or free_port()
        self.log_path = config.parent / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            self.python, "-m", "kbgraph", "serve", "--config", str(self.config),
            "--host", HOST, "--port", str(self.port), "--workers", str(self.workers),
            "--log-level", "warning",
        ]  # fmt: skip

    def start(self) -> None:
        command = self.command()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")]))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                start_new_session=True,
            )  # fmt: skip

    async def wait_ready(self, timeout: float = 90.0) -> None:
        """Poll ``ready_path`` (fresh connections, so every worker gets asked) until ready."""
        deadline = time.monotonic() + timeout
        streak = 0
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            pool = Pool(HOST, self.port, 1, timeout=5.0)
            try:
                response = await pool.request("GET", self.ready_path)
                streak = streak + 1 if response.status == 200 else 0
            except (HTTPLoadError, OSError, TimeoutError):
                streak = 0
            finally:
                await pool.close()
            if streak >= 3 * self.workers:
                return
            await asyncio.sleep(0.05 if streak else 0.2)
        raise RuntimeError(f"server not ready after {timeout:.0f} s:\n{self.tail()}")

    def stop(self, timeout: float = 15.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # the group this object started
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        return proc.returncode

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
