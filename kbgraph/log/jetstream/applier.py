"""A node of several workers (``kbgraph serve --workers N`` with ``[log] kind = "jetstream"``):
ONE applier process follows the stream into the node's store, the N workers follow that store
as they do on one machine and publish the deliveries they take themselves
(``kbgraph.log.jetstream.worker``).

The applier is its own process, owned by ``kbgraph serve`` (``Supervisor``: restarted a second
after it exits), not one of uvicorn's workers: a worker dies and is replaced by uvicorn on its
own, the applier's life is one thing to watch. It runs the single worker's ``JetStreamLog``
(follow, apply, report its position, snapshots and trims: once per node) and says how it
stands in a small status file beside the store, rewritten every ``STATUS_SECONDS``; it holds
an exclusive lock on ``<store>.applier.lock`` while it lives (the kernel drops the lock the
moment it dies, whatever killed it). A worker's ``ApplierProbe`` tests that lock and reads the
status: no applier, or one silent for ``STALE_SECONDS``, and the worker is not ready and
refuses writes (503) rather than answer from a store nobody applies to.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import msgspec
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kbgraph.config import load_config
from kbgraph.log.jetstream.consumer import STREAM_METRICS, stream_metrics_text
from kbgraph.log.jetstream.node import JetStreamLog
from kbgraph.store.opening import open_store

log = logging.getLogger("kbgraph.log.jetstream")

STATUS_SECONDS: Final = 0.2  # the status file rewritten this often
STALE_SECONDS: Final = 5.0  # a status older than this: the applier is hung (e.g. stopped)
RESTART_SECONDS: Final = 1.0  # an applier that exited is started again after this pause
PROBE_SECONDS: Final = 0.05  # a worker reads the status at most this often


class Status(msgspec.Struct, frozen=True):
    """How the applier stands, as the workers read it."""

    pid: int
    at: float  # time.time() when written
    applied: int  # the stream position the store holds
    problem: str | None  # why the node is not ready (JetStreamLog.problem)
    refusal: str | None  # why a delivery must be refused before publishing
    stuck: int | None  # the position that fails to apply here, if one does
    metrics: str = ""  # the applier's kbgraph_stream_* metrics, Prometheus's text format


def status_path(store: str | Path) -> Path:
    return Path(f"{store}.applier")


def lock_path(store: str | Path) -> Path:
    return Path(f"{store}.applier.lock")


def write_status(path: Path, status: Status) -> None:
    """Replace the status file at ``path`` with ``status`` at once (what ``ApplierProbe`` reads)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(status))
    os.replace(tmp, path)


async def run(config_path: str, parent: int) -> None:
    """Apply the stream into the store until stopped (SIGTERM) or orphaned (``parent`` gone)."""
    config = load_config(config_path, quiet=True)  # serve warned of it
    path = Path(config.store.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path(path), "a+b") as lock:
        # one applier per store: a replacement waits until the last one is gone
        await asyncio.to_thread(fcntl.flock, lock.fileno(), fcntl.LOCK_EX)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        store = open_store(config)
        applier = JetStreamLog(
            config.log.jetstream,
            store,
            checkpoints=config.store.checkpoint_folder,
            vector_max_chars=config.embeddings.max_chars,
        )
        await applier.follow()
        log.info("applier of stream %s started (pid %s)", config.log.jetstream.stream, os.getpid())
        try:
            while not stop.is_set() and os.getppid() == parent:
                stuck = applier.stuck.position if applier.stuck is not None else None
                status = Status(
                    os.getpid(),
                    time.time(),
                    applier.applied,
                    applier.problem(),
                    applier.refusal(),
                    stuck,
                    stream_metrics_text(),
                )
                await asyncio.to_thread(write_status, status_path(path), status)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), STATUS_SECONDS)
        finally:
            await applier.close()
            store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kbgraph.log.jetstream.applier",
        description="apply the stream into the node's store (started by kbgraph serve)",
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--parent", type=int, required=True, help="exit when it is gone")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(levelname)s:     applier: %(message)s"
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args.config, args.parent))
    return 0


class Supervisor:
    """``kbgraph serve``'s thread that keeps the node's applier process running."""

    def __init__(self, config_path: Path, log_level: str) -> None:
        self.command = [
            sys.executable,
            "-m",
            "kbgraph.log.jetstream.applier",
            "--config",
            str(config_path.resolve()),
            "--parent",
            str(os.getpid()),
            "--log-level",
            log_level,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kbgraph-applier", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the supervising thread runs (it only ends at ``stop``)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.is_set():
            # a session of its own: a signal to serve's process group (Ctrl-C, a stop) reaches
            # serve, which stops the applier after its workers, rather than both at once (it
            # would be started again meanwhile); orphaned, it exits by itself (``--parent``)
            try:
                self.proc = subprocess.Popen(self.command, start_new_session=True)
            except Exception as exc:  # e.g. no process to be had for a moment: never give up
                log.error(
                    "the applier did not start (%r): trying again in %.0f s", exc, RESTART_SECONDS
                )
                self._stopping.wait(RESTART_SECONDS)
                continue
            while self.proc.poll() is None:
                if self._stopping.wait(0.2):
                    return
            log.error(
                "the applier exited with %s: starting it again in %.0f s",
                self.proc.returncode,
                RESTART_SECONDS,
            )
            self._stopping.wait(RESTART_SECONDS)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


class ApplierProbe:
    """A worker's view of the node's applier: alive (its lock held), and what it says."""

    def __init__(self, store: str | Path) -> None:
        self.status_file = status_path(store)
        self._lock = open(lock_path(store), "a+b")  # noqa: SIM115 - the worker's lifetime
        self._read_at = 0.0
        self._seen: tuple[str | None, Status | None] = ("the node's applier is starting", None)

    def close(self) -> None:
        """Close the lock file, and stop serving this probe's metrics if ``/metrics`` did (a
        closed probe left in the registry would fail every scrape, or show a dead node)."""
        _unserve(self)
        self._lock.close()

    def read(self) -> tuple[str | None, Status | None]:
        """(why the applier cannot be relied on, or None; its last status, if any)."""
        now = time.monotonic()
        if now - self._read_at >= PROBE_SECONDS:
            self._read_at = now
            self._seen = self.look()
        return self._seen

    def look(self) -> tuple[str | None, Status | None]:
        """What ``read`` gives, looked at now (``read`` looks at most every PROBE_SECONDS)."""
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: the applier lives
        else:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            return "the node's applier is not running (kbgraph serve starts it again)", None
        try:
            status = msgspec.json.decode(self.status_file.read_bytes(), type=Status)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return "the node's applier is starting", None
        age = time.time() - status.at
        if age > STALE_SECONDS:
            return f"the node's applier has not reported for {age:.0f} s", status
        return None, status

    def problem(self) -> str | None:
        """Why the node is not ready, as far as its applier goes."""
        dead, status = self.read()
        if dead is not None or status is None:
            return dead
        return status.problem

    def refusal(self) -> str | None:
        """Why a delivery must be refused now, before publishing it."""
        dead, status = self.read()
        if dead is not None or status is None:
            return dead
        return status.refusal

    def describe(self) -> list[Metric]:
        """None in advance: the families come and go with the applier's status."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The applier's ``kbgraph_stream_*`` metrics as its last status gave them (a worker's
        ``/metrics`` serves them: the worker itself follows no stream)."""
        _dead, status = self.read()
        if status is not None:
            yield from text_string_to_metric_families(status.metrics)


_serving: list[ApplierProbe] = []  # the open probes served, the last one on /metrics


def _show(before: ApplierProbe | None) -> None:
    """Register the newest served probe (none: this process's own stream metrics) in place of
    ``before``, what the registry held."""
    after = _serving[-1] if _serving else None
    if after is before:
        return
    if before is None:
        for collector in STREAM_METRICS:
            REGISTRY.unregister(collector)
    else:
        REGISTRY.unregister(before)
    if after is None:
        for collector in STREAM_METRICS:
            REGISTRY.register(collector)
    else:
        REGISTRY.register(after)


def serve_applier_metrics(probe: ApplierProbe) -> None:
    """Make this worker's ``/metrics`` show its node's applier's stream metrics in place of its
    own (never set: a worker applies nothing), until ``probe`` closes."""
    before = _serving[-1] if _serving else None
    _serving.append(probe)
    _show(before)


def _unserve(probe: ApplierProbe) -> None:
    """Undo ``serve_applier_metrics(probe)``: the probe opened before it and still open is
    served again, or, none left, this process's own stream metrics."""
    before = _serving[-1] if _serving else None
    if probe in _serving:
        _serving.remove(probe)
    _show(before)


if __name__ == "__main__":
    sys.exit(main())
