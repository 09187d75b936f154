"""The JetStream log's pieces without a cluster: its config, the message encoding, and the
store's side (``Store.submit_from_log``: positions in order, decisions timed by the log)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from kbgraph import cli
from kbgraph.config import ConfigError, parse_config
from kbgraph.jetstream import decode_delivery, encode_delivery
from kbgraph.store import DeliveryResult, ReplayRefused, Store, WebhookMessage
from kbgraph.store.positions import LogOutOfOrder
from tests.kb_events import link_added, upsert

STREAM = "kbgraph"


def test_log_config_defaults_and_jetstream() -> None:
    assert parse_config("").log.kind == "sqlite"
    config = parse_config(
        '[log]\nkind = "jetstream"\nservers = ["nats://127.0.0.1:4222", "nats://10.0.0.2:4222"]\n'
        'stream = "kb-graph"\nreplicas = 3\n'
    )
    assert config.log.kind == "jetstream"
    assert config.log.servers == ["nats://127.0.0.1:4222", "nats://10.0.0.2:4222"]
    assert (config.log.stream, config.log.replicas) == ("kb-graph", 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[log]\nkind = "kafka"', "log.kind: Invalid enum value 'kafka'"),
        ("[log]\nstreams = 1", "unknown key log.streams"),
        ('[log]\nkind = "jetstream"\nservers = []', "log.servers: empty"),
        ('[log]\nkind = "jetstream"\nservers = ["http://x:1"]', "log.servers[0]: expected"),
        ("[log]\nreplicas = 0", "log.replicas: Expected int >= 1"),
        ('[log]\nkind = "jetstream"\nstream = "a.b"', "log.stream: expected"),
    ],
)
def test_log_config_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config(text)


def test_jetstream_serve_takes_one_worker(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "kbgraph.toml"
    path.write_text('[log]\nkind = "jetstream"\n')
    assert cli.main(["serve", "--config", str(path), "--workers", "2"]) == 2
    assert "one worker per node" in capsys.readouterr().err


def test_delivery_encoding_round_trips() -> None:
    events = [upsert("a", 1, links=["b"]), link_added("a", "c", 2)]
    message = WebhookMessage("msg_1", b"\x00" * 32)
    assert decode_delivery(encode_delivery("kb", events, message)) == ("kb", events, message)
    assert decode_delivery(encode_delivery("kb", events, None)) == ("kb", events, None)


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


def test_readiness_says_why_not(tmp_path: Path) -> None:
    """Not ready while connecting, while behind the stream's last sequence as of the start,
    while disconnected, and while the store fails to apply; ready otherwise."""
    from kbgraph.config import LogConfig
    from kbgraph.jetstream import JetStreamLog

    with Store(tmp_path / "kb.db") as store:
        submit(store, "kb", [upsert("a")], 1).result()
        follower = JetStreamLog(LogConfig(kind="jetstream"), store)
        assert follower.applied == 1  # resumes from the store's recorded position
        assert "connecting" in (follower.problem() or "")
        follower.target, follower.connected = 5, True
        assert follower.problem() == "catching up with stream kbgraph: at 1 of 5"
        follower.applied = 5
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
    config.write_text('[log]\nkind = "jetstream"\n')
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "a.md").write_text("# A\n")
    code = cli.main(["import", str(vault), "--kb", "notes", "--config", str(config)])
    assert code != 0
    assert "send with --url to a node instead" in capsys.readouterr().err
