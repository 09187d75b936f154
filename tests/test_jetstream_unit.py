"""The JetStream log's pieces without a cluster: its config, the message encoding, and the
store's side (``Store.submit_from_log``: positions in order, decisions timed by the log)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import nats.errors
import pytest
from prometheus_client import generate_latest

from kbgraph import cli
from kbgraph.config import ConfigError, JetStreamConfig, parse_config
from kbgraph.log.jetstream import applier, decode_message, encode_message
from kbgraph.log.jetstream import consumer as follower
from kbgraph.log.jetstream.applier import ApplierProbe
from kbgraph.log.jetstream.connect import RULES_KEY, RulesDiffer, ensure_stream
from kbgraph.log.jetstream.wire import NotPublishable, pack, unpack
from kbgraph.store import DeliveryResult, ReplayRefused, Store, WebhookMessage, positions
from kbgraph.store.group import GroupWriter
from kbgraph.store.positions import LogOutOfOrder, MessageFailed
from tests.kb_events import link_added, upsert

STREAM = "kbgraph"
MAC = 'mac_secret_env = "KBGRAPH_TEST_MAC"\n'  # the cluster secret every jetstream node needs
JS = '[log]\nkind = "jetstream"\n[log.jetstream]\n'  # a JetStream node's log; its keys next


def test_log_config_defaults_and_jetstream() -> None:
    assert parse_config("").log.kind == "sqlite"
    config = parse_config(
        JS + 'servers = ["nats://127.0.0.1:4222", "nats://10.0.0.2:4222"]\n'
        f'stream = "kb-graph"\nreplicas = 3\n{MAC}'
    )
    assert config.log.kind == "jetstream"
    jetstream = config.log.jetstream
    assert jetstream.servers == ["nats://127.0.0.1:4222", "nats://10.0.0.2:4222"]
    assert (jetstream.stream, jetstream.replicas) == ("kb-graph", 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[log]\nkind = "kafka"', "log.kind: Invalid enum value 'kafka'"),
        ("[log]\nstreams = 1", "unknown key log.streams"),
        (JS + "servers = []", "log.jetstream.servers: empty"),
        (JS + 'servers = ["http://x:1"]', "log.jetstream.servers[0]: expected"),
        ("[log.jetstream]\nreplicas = 0", "log.jetstream.replicas: Expected int >= 1"),
        ("[log.jetstream]\nstreams = 1", "unknown key log.jetstream.streams"),
        (JS + 'stream = "a.b"', "log.jetstream.stream: expected"),
    ],
)
def test_log_config_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config(text)


def test_each_position_keeps_what_it_answered_for_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's workers answer from ``stream_outcomes``: the result, the delivery's own
    refusal, or the note of each position, as the applier decided it; the oldest go."""
    monkeypatch.setattr(positions, "RESULTS_KEPT", 4)
    message = WebhookMessage("msg_w", b"w" * 32)
    with Store(tmp_path / "kb.db") as store:
        events = [upsert("a"), upsert("b")]
        first = submit(store, "one", events, 1, message=message).result()
        with pytest.raises(ReplayRefused) as refused:
            submit(store, "two", [upsert("a")], 2, message=message).result()
        note(store, 3, "skipped", "by the decision at 9: why").result()
        resent = submit(store, "one", events, 4, message=message).result()
        position, results, notes = store.stream_outcomes(STREAM, [1, 2, 3, 4, 5])
        assert position == 4
        assert sorted(results) == [
            (1, msgspec.json.encode(first), None, None),
            (2, None, "replay", str(refused.value)),
            (4, msgspec.json.encode(resent), None, None),
        ]
        assert resent.duplicates == 2 and notes == [(3, "skipped", "by the decision at 9: why")]
        for seq in range(5, 9):
            submit(store, "one", [upsert(f"c{seq}")], seq).result()
        _, results, _ = store.stream_outcomes(STREAM, [1, 4, 5, 8])
        assert [row[0] for row in sorted(results)] == [5, 8]  # kept: the last 4 positions


def test_a_worker_sees_whether_its_applier_lives(tmp_path: Path) -> None:
    """``ApplierProbe``: no lock holder is no applier, whatever its last status said; a holder
    silent too long is hung; otherwise what it says."""
    store = tmp_path / "kb.db"
    probe = ApplierProbe(store)
    status = applier.Status(1, time.time(), 7, "catching up", None, None)
    applier.write_status(applier.status_path(store), status)
    assert "applier is not running" in (probe.look()[0] or "")
    with open(applier.lock_path(store), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        assert probe.look() == (None, status)
        assert probe.problem() == "catching up" and probe.refusal() is None
        old = applier.Status(1, time.time() - 60, 7, None, None, None)
        applier.write_status(applier.status_path(store), old)
        assert "has not reported for 60 s" in (probe.look()[0] or "")
    assert "not running" in (probe.look()[0] or "")
    probe.close()


def test_the_supervisor_starts_the_applier_again_when_it_failed_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kbgraph serve``'s supervisor thread outlives an applier that could not be started (a
    dead thread leaves the node's workers without an applier for good)."""
    calls: list[list[str]] = []
    real = subprocess.Popen

    def flaky(command: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        calls.append(command)
        if len(calls) == 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real(command, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(applier.subprocess, "Popen", flaky)
    monkeypatch.setattr(applier, "RESTART_SECONDS", 0.05)
    supervisor = applier.Supervisor(Path("kbgraph.toml"), "info")
    supervisor.command = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor.start()
    try:
        deadline = time.monotonic() + 30
        while supervisor.proc is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) == 2 and supervisor.proc is not None and supervisor.proc.poll() is None
        assert supervisor.alive
    finally:
        supervisor.stop()
    assert supervisor.proc is not None and supervisor.proc.poll() is not None


def test_a_workers_metrics_are_its_applier_s_stream_metrics(tmp_path: Path) -> None:
    """A worker follows no stream: its ``/metrics`` shows the ``kbgraph_stream_*`` metrics its
    node's applier last reported, each family once, not its own empty ones."""
    store = tmp_path / "kb.db"
    follower.POSITION.labels("unit-stream").set(41)
    follower.NOTED.labels("unit-stream", "skipped").inc(2)
    reported = follower.stream_metrics_text()
    follower.POSITION.remove("unit-stream")
    follower.NOTED.remove("unit-stream", "skipped")
    status = applier.Status(1, time.time(), 41, None, None, None, reported)
    applier.write_status(applier.status_path(store), status)
    probe = ApplierProbe(store)
    try:
        with open(applier.lock_path(store), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            applier.serve_applier_metrics(probe)
            served = generate_latest().decode()
        assert 'kbgraph_stream_position{stream="unit-stream"} 41.0' in served
        noted = 'kbgraph_stream_messages_noted_total{kind="skipped",stream="unit-stream"} 2.0'
        assert noted in served
        assert served.count("# TYPE kbgraph_stream_position gauge") == 1
    finally:
        probe.close()


def test_a_closed_probe_leaves_metrics_to_the_one_still_open(tmp_path: Path) -> None:
    """A process that closes a worker's log and opens another (a service restarted in place)
    serves the open one's applier metrics; once all are closed, its own again: a closed probe
    stays registered nowhere (its lock file is shut: a scrape would fail on it)."""
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    for store, position in ((first, 7), (second, 8)):
        follower.POSITION.labels("probe-stream").set(position)
        reported = follower.stream_metrics_text()
        status = applier.Status(1, time.time(), position, None, None, None, reported)
        applier.write_status(applier.status_path(store), status)
    follower.POSITION.remove("probe-stream")
    with open(applier.lock_path(first), "a+b") as a, open(applier.lock_path(second), "a+b") as b:
        fcntl.flock(a.fileno(), fcntl.LOCK_EX)
        fcntl.flock(b.fileno(), fcntl.LOCK_EX)
        old = ApplierProbe(first)
        applier.serve_applier_metrics(old)
        old.close()
        assert "probe-stream" not in generate_latest().decode()
        new = ApplierProbe(second)
        applier.serve_applier_metrics(new)
        older = ApplierProbe(first)
        applier.serve_applier_metrics(older)
        older.close()  # the newer-served one closes first: the one still open is served
        try:
            served = generate_latest().decode()
            assert 'kbgraph_stream_position{stream="probe-stream"} 8.0' in served
            assert served.count("# TYPE kbgraph_stream_position gauge") == 1
        finally:
            new.close()
    own = generate_latest().decode()
    assert "probe-stream" not in own
    assert own.count("# TYPE kbgraph_stream_position gauge") == 1


def test_delivery_encoding_round_trips() -> None:
    events = [upsert("a", 1, links=["b"]), link_added("a", "c", 2)]
    message = WebhookMessage("msg_1", b"\x00" * 32)
    assert decode_message(encode_message("kb", events, message)) == ("kb", events, message, None)
    assert decode_message(encode_message("kb", events, None)) == ("kb", events, None, None)


def submit(store: Store, kb: str, events, seq: int, at: float = 1000.0, message=None):
    future: concurrent.futures.Future[DeliveryResult] = concurrent.futures.Future()

    def resolve(result, exc) -> None:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    store.submit_from_log(kb, events, message, at, (STREAM, seq), resolve)
    return future


def test_positions_commit_with_the_state_and_in_order(tmp_path: Path) -> None:
    with Store(tmp_path / "kb.db") as store:
        assert store.log_position(STREAM) == 0
        assert submit(store, "kb", [upsert("a")], 1).result().seq == 1
        assert store.log_position(STREAM) == 1
        with pytest.raises(LogOutOfOrder):  # a gap: nothing applied
            submit(store, "kb", [upsert("b")], 3).result()
        with pytest.raises(LogOutOfOrder):  # a repeat: nothing applied twice
            submit(store, "kb", [upsert("b")], 1).result()
        assert store.kb_seq("kb") == 1 and store.log_position(STREAM) == 1
        futures = [submit(store, "kb", [upsert(f"c{i}")], 2 + i) for i in range(50)]
        assert [f.result().seq for f in futures] == list(range(2, 52))
        assert store.log_position(STREAM) == 51
    with Store(tmp_path / "kb.db") as store:  # durable with the state
        assert store.log_position(STREAM) == 51 and store.kb_seq("kb") == 51


def test_a_refused_delivery_still_moves_the_position(tmp_path: Path) -> None:
    """A replay refused on one node is refused on all: a decision, recorded like any other."""
    message = WebhookMessage("msg_x", b"d" * 32)
    with Store(tmp_path / "kb.db") as store:
        submit(store, "one", [upsert("a")], 1, message=message).result()
        with pytest.raises(ReplayRefused):
            submit(store, "two", [upsert("a")], 2, message=message).result()
        assert store.log_position(STREAM) == 2
        assert store.kb_seq("two") == 0


def test_binding_window_is_the_logs_time_not_the_clock(tmp_path: Path) -> None:
    """The webhook-id binding is timed by the message (the stream's timestamp): a node that
    applies it an hour later, or with a wrong clock, decides as the others do."""
    message = WebhookMessage("msg_y", b"e" * 32)
    with Store(tmp_path / "kb.db") as store:
        store.clock = lambda: 10_000_000.0  # this node's clock is far off: not consulted
        submit(store, "one", [upsert("a")], 1, at=1000.0, message=message).result()
        with pytest.raises(ReplayRefused):  # 599 s later by the log: still bound
            submit(store, "two", [upsert("a")], 2, at=1599.0, message=message).result()
        # 601 s later by the log: the binding is over, the delivery goes in
        assert submit(store, "two", [upsert("a")], 3, at=1601.0, message=message).result().seq == 1


def test_a_closed_log_leaves_no_series_of_its_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that closed its node's log (a service stopped in place) shows nothing of that
    stream on ``/metrics``: no position it stopped at, no failures or notes; another stream's
    series stay."""
    from kbgraph.log.jetstream import JetStreamLog

    monkeypatch.setenv("KBGRAPH_TEST_MAC", "a cluster secret of 32 bytes....")
    config = JetStreamConfig(stream="closing", mac_secret_env="KBGRAPH_TEST_MAC")
    with Store(tmp_path / "kb.db") as store:
        node = JetStreamLog(config, store)
        follower.POSITION.labels("closing").set(3)
        follower.FAILURES.labels("closing").inc()
        follower.FAILING.labels("closing", "4", "kb", "disk I/O error").set(1)
        follower.NOTED.labels("closing", "skipped").inc()
        follower.POSITION.labels("still-open").set(9)
        try:
            assert follower.stream_metrics_text().count('stream="closing"') >= 4
            asyncio.run(node.close())
            shown = follower.stream_metrics_text()
            assert 'stream="closing"' not in shown
            assert 'kbgraph_stream_position{stream="still-open"} 9.0' in shown
        finally:
            follower.POSITION.remove("still-open")


def test_readiness_says_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not ready while connecting, while behind the stream's last sequence as of the start,
    while disconnected, and while the store fails to apply; ready otherwise."""
    from kbgraph.log.jetstream import JetStreamLog

    monkeypatch.setenv("KBGRAPH_TEST_MAC", "a cluster secret of 32 bytes....")
    with Store(tmp_path / "kb.db") as store:
        submit(store, "kb", [upsert("a")], 1).result()
        follower = JetStreamLog(JetStreamConfig(mac_secret_env="KBGRAPH_TEST_MAC"), store)
        assert follower.applied == 1  # resumes from the store's recorded position
        assert "connecting" in (follower.problem() or "")
        follower.target, follower.connected = 5, True
        assert follower.problem() == "catching up with stream kbgraph: at 1 of 5"
        follower.applied = 5
        assert "has not answered for" in (follower.problem() or "")  # never asked yet
        follower.answered_at = time.monotonic()  # the stream's leader answered just now
        assert follower.problem() is None
        follower.connected = False
        assert "disconnected" in (follower.problem() or "")
        follower.connected, follower.failure = True, "disk I/O error"
        assert "disk I/O error" in (follower.problem() or "")


def test_local_writers_refuse_a_jetstream_node(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``kbgraph import`` into a node's own store would fork it from the stream: refused."""
    config = tmp_path / "kbgraph.toml"
    config.write_text(f"{JS}{MAC}")
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "a.md").write_text("# A\n")
    code = cli.main(["import", str(vault), "--kb", "notes", "--config", str(config)])
    assert code != 0
    assert "send with --url to a node instead" in capsys.readouterr().err


def note(store: Store, seq: int, kind: str, detail: str):
    future: concurrent.futures.Future[DeliveryResult] = concurrent.futures.Future()
    store.submit_note_from_log(
        (STREAM, seq),
        kind,
        detail,
        lambda r, e: future.set_exception(e) if e else future.set_result(r),
    )
    return future


def test_a_noted_message_takes_its_position_and_applies_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "kb.db") as store:
        submit(store, "kb", [upsert("a")], 1).result()
        assert note(store, 2, "skipped", "by the decision at 4: why").result().applied == 0
        with pytest.raises(LogOutOfOrder):  # in order like any delivery
            note(store, 2, "decision", "again").result()
        futures = [submit(store, "kb", [upsert("b")], 3), note(store, 4, "decision", "skip 2")]
        assert futures[0].result().seq == 2 and futures[1].result().applied == 0
        assert store.log_position(STREAM) == 4 and store.kb_seq("kb") == 2
        assert store.stream_note(STREAM, 2) == ("skipped", "by the decision at 4: why")
        assert store.stream_note(STREAM, 3) is None  # applied: no note
        assert store.stream_notes(STREAM) == [
            (2, "skipped", "by the decision at 4: why"),
            (4, "decision", "skip 2"),
        ]


def test_a_message_the_store_cannot_apply_is_named_and_nothing_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure that is not the delivery's own refusal names the message (position, KB,
    error) to every member of its group, and the group commits nothing."""
    original = GroupWriter.apply

    def apply(self, conn, group):
        if any(e.subject == "bad" for p in group for e in p.events):
            raise OSError("disk on fire")
        return original(self, conn, group)

    monkeypatch.setattr(GroupWriter, "apply", apply)
    with Store(tmp_path / "kb.db") as store:
        held, waiting = threading.Event(), threading.Event()

        def hold(*_: object) -> None:  # the writer waits here: the next two make one group
            waiting.set()
            held.wait()

        store.submit_from_log("kb", [upsert("z")], None, 1.0, (STREAM, 1), hold)
        assert waiting.wait(10)
        futures = [
            submit(store, "kb", [upsert("a")], 2),
            submit(store, "other", [upsert("bad")], 3),
        ]
        held.set()
        for future in futures:
            with pytest.raises(MessageFailed, match=r"position 3 \(kb other\): OSError") as caught:
                future.result()
            assert (caught.value.seq, caught.value.kb) == (3, "other")
        assert store.log_position(STREAM) == 1 and store.kb_seq("kb") == 1
        assert submit(store, "kb", [upsert("a")], 2).result().seq == 2  # alone, it applies


def test_a_delivery_is_checked_before_it_is_published() -> None:
    """What every node will decode is decoded here first: a KB name no node accepts never
    reaches the stream, and a big delivery travels deflated and reads back the same."""
    with pytest.raises(NotPublishable, match="kb name"):
        pack("Not A KB", [upsert("a")], None)
    events = [upsert(f"c{i}", text="word " * 2000) for i in range(10)]
    payload, headers = pack("kb", events, None)
    assert headers == {"Kbgraph-Encoding": "deflate"} and len(payload) < 20_000
    assert unpack(payload, headers) == ("kb", events, None, None)


@pytest.mark.parametrize("key", ["password", "token", "nkey_seed", "mac_secret"])
def test_a_secret_in_clear_is_refused_naming_the_key(key: str) -> None:
    text = f'{JS}{MAC}{key} = "hunter2"\n'
    if key == "mac_secret":
        text = text.replace(MAC, "")
    with pytest.raises(
        ConfigError, match=f"log.jetstream.{key}: a secret is never written in the config"
    ):
        parse_config(text)


def test_jetstream_needs_the_cluster_secret_and_one_way_to_log_in() -> None:
    with pytest.raises(
        ConfigError,
        match=r"log.jetstream.mac_secret_file or log.jetstream.mac_secret_env: required",
    ):
        parse_config(JS)
    with pytest.raises(ConfigError, match=r"log\.jetstream: one of user/password, token"):
        parse_config(f'{JS}{MAC}user = "n"\npassword_env = "P"\ntoken_env = "T"\n')
    with pytest.raises(ConfigError, match=r"log.jetstream.user and log.jetstream.password_file"):
        parse_config(f'{JS}{MAC}user = "n"\n')
    with pytest.raises(
        ConfigError, match=r"log.jetstream.tls_cert_file and log.jetstream.tls_key_file"
    ):
        parse_config(f'{JS}{MAC}tls_cert_file = "c.pem"\n')


def test_secrets_come_from_files_and_variables_into_nats_py_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kbgraph.log.jetstream.connect import (
        SecretMissing,
        secrets_problem,
        security_options,
        signer,
    )

    (tmp_path / "pw").write_text("s3cret\n")
    config = parse_config(
        f'{JS}{MAC}user = "node-a"\npassword_file = "pw"\n', tmp_path
    ).log.jetstream
    monkeypatch.delenv("KBGRAPH_TEST_MAC", raising=False)
    assert "the variable KBGRAPH_TEST_MAC is not set" in (secrets_problem(config) or "")
    monkeypatch.setenv("KBGRAPH_TEST_MAC", "short")
    assert "under 16 bytes" in (secrets_problem(config) or "")
    monkeypatch.setenv("KBGRAPH_TEST_MAC", "a cluster secret of 32 bytes....")
    assert secrets_problem(config) is None
    assert security_options(config) == {"user": "node-a", "password": "s3cret"}
    monkeypatch.setenv("NATS_TOKEN", "tok")
    token = parse_config(f'{JS}{MAC}token_env = "NATS_TOKEN"\n').log.jetstream
    assert security_options(token) == {"token": "tok"}
    (tmp_path / "seed").write_text("SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY\n")
    with pytest.raises(ConfigError, match="one of"):  # one way to log in
        parse_config(
            f'{JS}{MAC}nkey_seed_file = "seed"\ncreds_file = "n.creds"\n',
            tmp_path,
        )
    seeded_log = parse_config(f'{JS}{MAC}nkey_seed_file = "seed"\n', tmp_path).log.jetstream
    assert security_options(seeded_log)["nkeys_seed_str"].startswith("SUAMK2")
    missing = parse_config(f'{JS}{MAC}token_file = "nope"\n', tmp_path).log.jetstream
    with pytest.raises(SecretMissing, match=r"log.jetstream.token_file: cannot read"):
        security_options(missing)
    tls = parse_config(f'{JS}{MAC}servers = ["tls://127.0.0.1:4222"]\n', tmp_path).log.jetstream
    assert isinstance(security_options(tls)["tls"], ssl.SSLContext)
    one, other = signer(config), signer(token)
    headers: dict[str, str] = {}
    one.sign("s.kb", b"payload", headers)
    assert other.valid("s.kb", b"payload", headers)  # the same secret: the same MAC
    assert not one.valid("s.kb", b"payloaD", headers) and not one.valid("s.kc", b"payload", headers)
    assert not one.valid("s.kb", b"payload", {})


def test_a_stream_without_rules_a_node_may_not_update_says_how_to_state_them() -> None:
    """A node's NATS user is not allowed ``STREAM.UPDATE`` (it could change the rules): on a
    stream made by other means without them, the node follows nothing and names the value."""

    class NoUpdate:
        async def stream_info(self, stream: str):
            return SimpleNamespace(
                config=SimpleNamespace(metadata=None, num_replicas=3),
                state=SimpleNamespace(last_seq=0),
            )

        async def update_stream(self, config):
            raise nats.errors.TimeoutError  # what a permissions violation looks like here

    config = JetStreamConfig(stream="made-elsewhere")
    with pytest.raises(RulesDiffer, match=f"{RULES_KEY} to 'max_kbs=1'"):
        asyncio.run(ensure_stream(NoUpdate(), config, "max_kbs=1"))
