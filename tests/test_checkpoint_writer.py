"""The checkpoint writer: forked from the follower (its descriptors, the fork warning, locks and
the compiler held by other threads at the fork, its deadline) or, without fork, in the follower."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import pytest
from numba.core.compiler_lock import global_compiler_lock

from kbgraph.projection import Projections, checkpoint, follower
from kbgraph.store import Store
from tests.checkpointed import everything, projections, reap
from tests.histories import KB
from tests.kb_events import upsert


def test_a_forked_writer_checkpoints_while_the_follower_goes_on(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb.db")
    for i in range(20):
        store.append(KB, [upsert(f"c{i}", title=f"DNS {i}", links=["c0"])])
    p = projections(store, tmp_path / "ckpt", checkpoint_every=10, log_retain=0)
    p.maybe_checkpoint()  # 20 records past none: a child starts writing at gid 20
    assert p.checkpoint_writer is not None and p.checkpoint_writer[1] == 20
    for i in range(5):  # the follower goes on meanwhile
        store.append(KB, [upsert(f"later{i}", links=["c1"])])
    while p.follow_once():
        pass
    reap(p, 60, "the checkpoint writer did not finish")
    assert p.checkpoint_gid == 20 and store.log_start() == 20
    restarted = projections(store, tmp_path / "ckpt")
    assert restarted.loaded_from is not None and restarted.gid == 20  # the forked instant
    while restarted.follow_once():
        pass
    assert everything(restarted, [None]) == everything(p, [None])
    p.stop()
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))
    store.close()


def writer_running_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: Callable[[], None]
) -> tuple[Store, Projections]:
    """A store of 20 concepts, its projection checkpointing every 10 records, and a checkpoint
    writer that runs ``first`` (in the forked child, the parent going on) before it writes."""
    store = Store(tmp_path / "kb.db")
    for i in range(20):
        store.append(KB, [upsert(f"c{i}")])
    p = projections(store, tmp_path / "ckpt", checkpoint_every=10)
    write = checkpoint.write

    def write_after_first(*args: Any) -> Path:
        first()
        return write(*args)

    monkeypatch.setattr(checkpoint, "write", write_after_first)
    return store, p


def test_the_forked_writer_holds_no_descriptor_of_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection the server closes while a checkpoint is being written must close for its
    client at once, not when the writer exits."""
    # the child sleeps before it writes: the parent goes on meanwhile
    store, p = writer_running_first(tmp_path, monkeypatch, lambda: time.sleep(3))
    server_end, client_end = socket.socketpair()
    p.maybe_checkpoint()
    assert p.checkpoint_writer is not None
    server_end.close()  # the parent closes its end while the child is writing
    client_end.settimeout(2)
    assert client_end.recv(1) == b""  # EOF now: the child holds no copy of it
    client_end.close()
    reap(p, 60, "the checkpoint writer did not finish")
    assert p.checkpoint_gid == 20  # the slowed child still wrote it
    store.close()


FORK_WARNING = (  # CPython 3.12+'s words (Modules/posixmodule.c), pid aside
    "This process (pid={}) is multi-threaded, use of fork() may lead to deadlocks in the child."
)


def test_the_fork_warning_alone_is_silenced(monkeypatch: pytest.MonkeyPatch) -> None:
    """On Python 3.12+ os.fork() in a process with threads warns; the checkpoint fork says
    why that does not apply to its child (``follower.fork``) and silences exactly that."""

    def warning_fork(message: str) -> Any:
        def fork() -> int:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return 4242

        return fork

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monkeypatch.setattr(os, "fork", warning_fork(FORK_WARNING.format(os.getpid())))
        assert follower.fork() == 4242
        monkeypatch.setattr(os, "fork", warning_fork("another deprecation"))
        with pytest.raises(DeprecationWarning, match="another deprecation"):
            follower.fork()


def test_the_forked_child_writes_while_other_threads_hold_locks(tmp_path: Path) -> None:
    """The real fork, with warnings as errors, while another thread holds a KB's read lock
    and the store's writer thread runs: the child takes neither and writes the checkpoint."""
    store = Store(tmp_path / "kb.db")
    for i in range(20):
        store.append(KB, [upsert(f"c{i}")])
    p = projections(store, tmp_path / "ckpt", checkpoint_every=10)
    kb = p.get(KB)
    assert kb is not None
    holding, release = threading.Event(), threading.Event()

    def reader() -> None:
        with kb.read():
            holding.set()
            release.wait(60)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert holding.wait(30)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            p.maybe_checkpoint()
        assert p.checkpoint_writer is not None
        reap(p, 60, "the forked writer hung")
        assert p.checkpoint_gid == 20
    finally:
        release.set()
        thread.join()
    restarted = projections(store, tmp_path / "ckpt")
    assert restarted.loaded_from is not None and restarted.gid == 20
    assert everything(restarted, [None]) == everything(p, [None])
    store.close()


def test_the_forked_child_compiles_a_kernel_while_another_thread_was_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel the parent never ran is compiled (or loaded from numba's cache) in the child,
    under numba's compiler lock. Another thread compiling at the instant of the fork (the
    local model's first batch, a request's first walk) must not leave the child's copy of that
    lock held: the child hung, and a server wrote no checkpoint and cut no log again. The fork
    waits for the compile under way, and the child compiles."""

    def compile_fresh() -> None:
        @numba.njit
        def fresh(x: int) -> int:
            return x + 1

        assert fresh(1) == 2  # compiled here, in the child

    store, p = writer_running_first(tmp_path, monkeypatch, compile_fresh)
    compiling, done = threading.Event(), threading.Event()

    def compiler() -> None:
        with global_compiler_lock:  # as numba holds it while compiling
            compiling.set()
            done.wait(1.0)

    thread = threading.Thread(target=compiler)
    thread.start()
    try:
        assert compiling.wait(30)
        p.maybe_checkpoint()
        assert p.checkpoint_writer is not None
        reap(p, 30, "the forked writer hung on numba's lock")
        assert p.checkpoint_gid == 20 and (tmp_path / "ckpt" / checkpoint.file_name(20)).exists()
    finally:
        done.set()
        thread.join()
        p.stop()  # kills a writer still hung
        store.close()


def test_a_writer_still_running_after_its_deadline_is_killed_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever holds a forked writer, checkpoints and the log's cut must not stop for good:
    past ``WRITER_SECONDS`` it is killed, its partial file removed, the log left uncut, and
    another writer starts after as many records."""
    store = Store(tmp_path / "kb.db")
    for i in range(20):
        store.append(KB, [upsert(f"c{i}")])
    p = projections(store, tmp_path / "ckpt", checkpoint_every=10, log_retain=0)
    write = checkpoint.write

    def hung_write(folder: Path, *args: Any) -> Path:
        (folder / f".ckpt-hung.kbg.{os.getpid()}.tmp").write_bytes(b"partial")
        time.sleep(3600)
        raise AssertionError("not reached")

    monkeypatch.setattr(checkpoint, "write", hung_write)
    monkeypatch.setattr(follower, "WRITER_SECONDS", 0.5)
    try:
        p.maybe_checkpoint()
        assert p.checkpoint_writer is not None
        pid = p.checkpoint_writer[0]
        with caplog.at_level(logging.WARNING, logger="kbgraph.projection.follower"):
            reap(p, 30, "the hung writer was never killed")
        assert p.checkpoint_writer is None and "was still writing after" in caplog.text
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped, not a zombie
        assert not list((tmp_path / "ckpt").glob("*.kbg*")) and store.log_start() <= 1
        assert p.checkpoint_gid == 20  # the next try after as many records
        monkeypatch.setattr(checkpoint, "write", write)
        for i in range(10):
            store.append(KB, [upsert(f"later{i}")])
        while p.follow_once():
            pass
        p.maybe_checkpoint()
        reap(p, 60, "the next writer did not finish")
        assert p.checkpoint_gid == 30 and store.log_start() == 30
    finally:
        p.stop()
        store.close()


def test_without_fork_checkpoints_are_written_in_the_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A platform without os.fork: start-up says how checkpoints are written, and they are
    (no AttributeError mid-run)."""
    store = Store(tmp_path / "kb.db")
    for i in range(20):
        store.append(KB, [upsert(f"c{i}")])
    monkeypatch.delattr(os, "fork")
    p = Projections(store, checkpoints=tmp_path / "ckpt", checkpoint_every=10, log_retain=0)
    with caplog.at_level(logging.WARNING, logger="kbgraph.projection.follower"):
        p.start()
    try:
        assert "no os.fork on this platform" in caplog.text
        p.stop()  # the follower thread: the checkpoint below is then this thread's to write
        p.maybe_checkpoint()
        assert p.checkpoint_writer is None and p.checkpoint_gid == 20 and store.log_start() == 20
        assert [f.name for f in checkpoint.candidates(tmp_path / "ckpt")] == [
            checkpoint.file_name(20)
        ]
    finally:
        p.stop()
        store.close()
