"""The TOML config: strict decoding with messages naming the key; the CLI's refusals."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from kbgraph import cli
from kbgraph.access import Rule
from kbgraph.config import ConfigError, load_config, parse_config
from tests.support import PRIVATE_SECRET, SECRET, start_server, stop, write_config

GOOD = f"""
[store]
path = "data/kb.db"

[webhooks]
secrets = ["{SECRET}"]

[server]
max_body_bytes = 1000
min_seq_wait_seconds = 2.5

[[tokens]]
name = "admin"
token = "secret-admin-token-of-tests"
admin = true

[[tokens]]
name = "ops-agent"
token_sha256 = "{hashlib.sha256(b"ops").hexdigest()}"
rules = [{{ kb = "homelab", collections = ["network", "infra"] }},
         {{ kb = "homelab", types = ["Runbook"] }},
         {{ kb = "other" }}]
"""


def test_good_config(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "kbgraph.toml"
    path.parent.mkdir()
    path.write_text(GOOD)
    config = load_config(path)
    assert config.store.path == str(tmp_path / "conf" / "data" / "kb.db")
    assert config.webhooks.secrets == [SECRET]
    assert config.server.max_body_bytes == 1000
    assert config.server.min_seq_wait_seconds == 2.5
    index = config.token_index()
    admin = index[hashlib.sha256(b"secret-admin-token-of-tests").hexdigest()]
    assert (admin.name, admin.admin, admin.rules) == ("admin", True, {})
    ops = index[hashlib.sha256(b"ops").hexdigest()]
    assert ops.admin is False
    assert ops.rules == {
        "homelab": (
            Rule(frozenset(), frozenset({"Runbook"})),
            Rule(frozenset({"infra", "network"}), frozenset()),
        ),
        "other": (Rule(frozenset(), frozenset()),),
    }


def test_defaults() -> None:
    config = parse_config("", base_dir="/srv")
    assert config.store.path == "/srv/kbgraph.db"
    assert config.server.max_body_bytes == 16 * 1024 * 1024
    assert config.server.min_seq_wait_seconds == 5.0
    assert config.tokens == [] and config.webhooks.secrets == []


TOKEN = 'name = "t"\ntoken = "token-x-of-the-config-tests"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[store]\npth = "x"', "unknown key store.pth"),
        ("colour = 1", "unknown key colour"),
        ("[webhooks]\nsecret = []", "unknown key webhooks.secret"),
        ("[[tokens]]\n" + TOKEN + "adimn = true", "unknown key tokens[0].adimn"),
        (
            "[[tokens]]\n" + TOKEN + "[[tokens]]\nname = 'u'\ntoken = 'y'\nrules = [{types = []}]",
            "tokens[1].rules[0]: missing required field kb",
        ),
        (
            "[[tokens]]\n" + TOKEN + "rules = [{kb = 'a', colections = []}]",
            "unknown key tokens[0].rules[0].colections",
        ),
        ("[[tokens]]\n" + TOKEN + 'admin = "yes"', "tokens[0].admin: Expected bool, got str"),
        ("[store]\npath = 3", "store.path: Expected str, got int"),
        ("[webhooks]\nsecrets = 'whsec_x'", "webhooks.secrets: Expected array, got str"),
        ("[webhooks]\nsecrets = ['abc']", "webhooks.secrets[0]: expected whsec_<base64>"),
        ("[webhooks]\nsecrets = ['whsec_!!!']", "webhooks.secrets[0]: not valid base64"),
        ("[webhooks]\nsecrets = ['whsec_']", "webhooks.secrets[0]: empty secret"),
        ("[[tokens]]\nname = 't'", "tokens[0]: exactly one of token or token_sha256"),
        (
            "[[tokens]]\nname = 't'\ntoken = 'a'\ntoken_sha256 = '" + "0" * 64 + "'",
            "tokens[0]: exactly one of token or token_sha256",
        ),
        ("[[tokens]]\nname = 't'\ntoken_sha256 = 'abc'", "tokens[0].token_sha256: expected 64"),
        ("[[tokens]]\ntoken = 'a'", "tokens[0]: missing required field name"),
        (
            "[[tokens]]\n" + TOKEN + "rules = [{kb = 'Bad Name'}]",
            "tokens[0].rules[0].kb: invalid kb name",
        ),
        (
            "[[tokens]]\n" + TOKEN + "admin = true\nrules = [{kb = 'a'}]",
            "tokens[0].rules: an admin token",
        ),
        ("[[tokens]]\n" + TOKEN + "[[tokens]]\n" + TOKEN, "tokens[1].name: duplicate"),
        ("[server]\nmax_body_bytes = 0", "server.max_body_bytes: Expected int >= 1"),
        ("[webhooks.kbs.Bad]\nsecrets = []", "webhooks.kbs.Bad: invalid kb name 'Bad'"),
        ("[webhooks.kbs.ok]\nsecrets = []", "webhooks.kbs.ok.secrets: empty"),
        ("[webhooks.kbs.ok]\nsecrets = ['abc']", "webhooks.kbs.ok.secrets[0]: expected whsec_"),
        ("[webhooks.kbs.ok]\nsecret = 'x'", "unknown key webhooks.kbs.ok.secret"),
        ("[limits]\nmax_kbs = 0", "limits.max_kbs: Expected int >= 1"),
        ("[store\n", "invalid TOML"),
    ],
)
def test_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert str(info.value).startswith(message), str(info.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert cli.is_loopback(host) is loopback


def test_auth_problem() -> None:
    full = parse_config(GOOD)
    no_tokens = parse_config(f"[webhooks]\nsecrets = ['{SECRET}']")
    no_secrets = parse_config("[[tokens]]\n" + TOKEN)
    for config in (full, no_tokens, no_secrets):
        assert cli.auth_problem(config, "127.0.0.1") is None
    assert cli.auth_problem(full, "0.0.0.0") is None
    assert "no bearer token" in (cli.auth_problem(no_tokens, "0.0.0.0") or "")
    assert "no webhook secret" in (cli.auth_problem(no_secrets, "10.1.2.3") or "")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbgraph", *args], capture_output=True, text=True, timeout=60
    )


def test_serve_refuses_non_loopback_without_auth(tmp_path: Path) -> None:
    path = tmp_path / "kbgraph.toml"
    path.write_text(f"[webhooks]\nsecrets = ['{SECRET}']\n")
    done = run_cli("serve", "--config", str(path), "--host", "0.0.0.0", "--port", "1")
    assert done.returncode == 2
    assert "refusing to serve on non-loopback address '0.0.0.0'" in done.stderr
    assert "no bearer token" in done.stderr


def test_serve_exits_2_on_config_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "kbgraph.toml"
    path.write_text('[store]\npth = "x"\n')
    done = run_cli("serve", "--config", str(path))
    assert done.returncode == 2
    assert "unknown key store.pth" in done.stderr


def test_demo_config_and_seed(tmp_path: Path) -> None:
    from kbgraph.store import Store

    path = tmp_path / "kbgraph.toml"
    cli.write_demo_config(path)
    config = load_config(path)
    assert config.auth_enabled and config.tokens[0].admin and config.tokens[0].token
    assert config.store.path == str(tmp_path / "kbgraph.db")
    assert cli.seed_demo(config.store.path, 50) == 50
    assert cli.seed_demo(config.store.path, 50) == 50  # seeded once only
    with Store(config.store.path) as store:
        concepts = store.load().kbs["demo"].concepts
        assert len(concepts) == 50 and all(c.text for c in concepts)
        assert sum(len(c.links) for c in concepts) > 0


def test_limits_defaults_and_keys() -> None:
    limits = parse_config("").limits
    assert limits.max_request_bytes == 1 << 20 and limits.max_header_bytes == 16 << 10
    assert limits.header_timeout_seconds == 10.0 and limits.keep_alive_seconds == 5.0
    assert limits.max_connections == 1000
    assert limits.max_kbs == 1000 and limits.max_inflight_ingest_bytes == 64 << 20
    own = parse_config(
        f"[webhooks]\nsecrets = ['{SECRET}']\n[webhooks.kbs.a]\nsecrets = ['{PRIVATE_SECRET}']"
    )
    assert own.webhooks.secrets_for("a") == [PRIVATE_SECRET]
    assert own.webhooks.secrets_for("b") == [SECRET]
    set_ = parse_config("[limits]\nmax_request_bytes = 10\nmax_connections = 3\n").limits
    assert (set_.max_request_bytes, set_.max_connections) == (10, 3)
    with pytest.raises(ConfigError, match=r"^limits.max_header_bytes: Expected int >= 1024"):
        parse_config("[limits]\nmax_header_bytes = 10\n")
    with pytest.raises(ConfigError, match=r"^unknown key limits.max_body"):
        parse_config("[limits]\nmax_body = 10\n")


@pytest.mark.parametrize("token", [" spaced", "spaced ", "\tspaced", "spaced\n"])
def test_a_token_with_outer_whitespace_is_refused_naming_it(token: str) -> None:
    escaped = token.encode("unicode_escape").decode()  # a TOML basic string takes \t, \n
    with pytest.raises(ConfigError) as info:
        parse_config(f'[[tokens]]\nname = "ops-agent"\ntoken = "{escaped}"\n')
    assert str(info.value) == (
        "tokens[0].token: leading or trailing whitespace in the token of 'ops-agent'"
    )


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_serve_exits_2_with_one_line_on_a_bad_store(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"not a database, not at all. " * 10)
    a_file = tmp_path / "file"
    a_file.write_text("")
    cases = {
        "corrupt.db": "file is not a database",
        "file/kb.db": f"{a_file} is not a directory",
        ".": "is a directory",
    }
    for store, cause in cases.items():
        path = tmp_path / "kbgraph.toml"
        path.write_text(f'[store]\npath = "{store}"\n')
        done = run_cli("serve", "--config", str(path), "--port", "1")
        assert done.returncode == 2
        line = _one_line(done.stderr)
        assert line.startswith(f"kbgraph: store {(tmp_path / store).resolve()}")
        assert line.endswith(cause), line
    missing = run_cli("serve", "--config", str(tmp_path / "none.toml"))
    assert missing.returncode == 2
    assert "cannot read config file" in _one_line(missing.stderr)


# a node's [log] as the previous release wrote it, and as this one does
FLAT_LOG = """
[log]
kind = "jetstream"
servers = ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
stream = "kb-graph"
snapshot_every_seconds = 60.0
mac_secret_file = "cluster.secret"
"""
SECTION_LOG = """
[log]
kind = "jetstream"

[log.jetstream]
servers = ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
stream = "kb-graph"
snapshot_every_seconds = 60.0
mac_secret_file = "cluster.secret"
"""
MOVED = "[log] servers, stream, snapshot_every_seconds, mac_secret_file"


def test_the_previous_releases_flat_log_keys_read_as_log_jetstream_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A config of the previous release, its JetStream keys flat in ``[log]``, reads as the
    same keys in ``[log.jetstream]`` (a file relative to the config's folder alike), with one
    warning naming the file, the keys and their place now; ``quiet`` says nothing."""
    flat, section = tmp_path / "flat.toml", tmp_path / "section.toml"
    flat.write_text(FLAT_LOG)
    section.write_text(SECTION_LOG)
    with caplog.at_level(logging.WARNING, logger="kbgraph.config"):
        now = load_config(section)
        assert caplog.records == []
        before = load_config(flat)
    assert before == now
    assert now.log.jetstream.mac_secret_file == str(tmp_path / "cluster.secret")
    assert now.log.jetstream.stream == "kb-graph"
    (record,) = caplog.records
    said = record.getMessage()
    assert f"config {flat}: {MOVED}:" in said and "move them to [log.jetstream]" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kbgraph.config"):
        assert load_config(flat, quiet=True) == now
    assert caplog.records == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[log]\nstream = "a"\n[log.jetstream]\nstream = "b"\n',
            "log.stream, log.jetstream.stream: set in both places",
        ),
        ("[log]\nreplicas = 9\n", "log.jetstream.replicas: Expected int <= 5"),
        ('[log]\njetstream = 1\nstream = "a"\n', "log.jetstream: Expected `object`"),
    ],
)
def test_a_flat_log_key_is_checked_where_it_is_read(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("`", "")):
        parse_config(text)


def test_serve_warns_once_of_the_previous_releases_keys(tmp_path: Path) -> None:
    """``kbgraph serve`` with two workers says it once: the processes it starts read the file
    quietly (each worker's app and HTTP limits)."""
    config = write_config(tmp_path, '[log]\nkind = "sqlite"\nstream = "kept"\n')
    proc = start_server(config, workers=2)
    stop(proc)
    said = [line for line in proc.tail().splitlines() if "[log.jetstream]" in line]
    assert len(said) == 1 and "[log] stream:" in said[0], proc.tail()
