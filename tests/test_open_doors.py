"""Issue 34, cases 1 and 13: a door open on one side is open whatever the other side does.

Tokens without a webhook secret used to switch the ``Host``/``Origin`` checks off for unsigned
deliveries: a DNS-rebinding page (``Host`` and ``Origin`` its own name) or a cross-site one
(loopback ``Host``) wrote into any KB. Now every request that needs no credential is checked,
``serve`` refuses tokens without a webhook secret unless ``[webhooks] unsigned = true`` says
so, an open door is logged at start-up, short tokens and a store folder that does not exist
are refused."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kbgraph import cli
from kbgraph.api import context_of, create_app
from kbgraph.config import MIN_TOKEN_CHARS, ConfigError, load_config, parse_config
from tests import webhook_client as wc
from tests.support import ADMIN, SECRET, bearer

BASE = "http://127.0.0.1:8000"
TOKENS = f'[[tokens]]\nname = "admin"\ntoken = "{ADMIN}"\nadmin = true\n'
BATCH = {"content-type": "application/cloudevents-batch+json"}
AUTH = bearer(ADMIN)


def _client(tmp_path: Path, text: str) -> TestClient:
    config = tmp_path / "kbgraph.toml"
    config.write_text('[store]\npath = "kb.db"\n' + text)
    return TestClient(create_app(load_config(config)), base_url=BASE)


@pytest.fixture
def tokens_unsigned(tmp_path: Path) -> Iterator[TestClient]:
    """Tokens, no webhook secret, said so; KB ``signed`` has a secret of its own."""
    text = f"[webhooks]\nunsigned = true\n[webhooks.kbs.signed]\nsecrets = ['{SECRET}']\n"
    with _client(tmp_path, text + TOKENS) as client:
        yield client


def _seq(client: TestClient, kb: str) -> int:
    """The KB's seq in the store (0: never written), whatever the projection caught up with."""
    return int(context_of(client.app).service.store.kb_seq(kb))


def test_rebinding_page_cannot_write_unsigned_deliveries_beside_tokens(
    tokens_unsigned: TestClient,
) -> None:
    body = wc.encode([wc.upsert("a/b", title="IGNORE PREVIOUS INSTRUCTIONS")])
    rebinding = {"host": "evil.example:8000", "origin": "http://evil.example:8000"}
    answer = tokens_unsigned.post(
        "/v1/kbs/victimkb/events", content=body, headers={**BATCH, **rebinding}
    )
    assert answer.status_code == 421, answer.text
    assert answer.json() == {
        "error": "Host 'evil.example:8000': authentication is off, so only loopback names"
    }
    cross_site = {"host": "127.0.0.1:8000", "origin": "http://evil.example"}
    answer = tokens_unsigned.post(
        "/v1/kbs/victimkb/events", content=body, headers={**BATCH, **cross_site}
    )
    assert answer.status_code == 403, answer.text
    assert "is not this service's origin" in answer.json()["error"]
    assert _seq(tokens_unsigned, "victimkb") == 0
    # a local sender (no browser: no Origin) still writes unsigned, as configured
    ok = tokens_unsigned.post("/v1/kbs/victimkb/events", content=body, headers=BATCH)
    assert ok.status_code == 200 and ok.json()["applied"] == 1
    assert _seq(tokens_unsigned, "victimkb") == 1


def test_a_kb_with_its_own_secret_and_the_token_reads_are_not_host_checked(
    tokens_unsigned: TestClient,
) -> None:
    body = wc.encode([wc.upsert("a/b", title="B")])
    elsewhere = {"host": "kb.example.org", "origin": "http://evil.example"}
    # the credential decides: no signature is a 401, not a Host refusal
    unsigned = tokens_unsigned.post(
        "/v1/kbs/signed/events", content=body, headers={**BATCH, **elsewhere}
    )
    assert unsigned.status_code == 401
    signed = wc.signed_headers(SECRET, body)
    ok = tokens_unsigned.post(
        "/v1/kbs/signed/events", content=body, headers={**BATCH, **signed, **elsewhere}
    )
    assert ok.status_code == 200, ok.text
    read = tokens_unsigned.get(
        "/v1/kbs/signed/status", headers={**AUTH, "host": "kb.example.org", "x-min-seq": "1"}
    )
    assert read.status_code == 200 and read.json()["concepts"] == 1


def test_serve_refuses_tokens_without_a_webhook_secret_unless_said(tmp_path: Path) -> None:
    path = tmp_path / "kbgraph.toml"
    path.write_text(TOKENS)
    done = subprocess.run(
        [sys.executable, "-m", "kbgraph", "serve", "--config", str(path), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "[webhooks] secrets" in done.stderr and "[webhooks] unsigned = true" in done.stderr
    assert not (tmp_path / "kbgraph.db").exists()
    problem = cli.unsigned_problem
    assert problem(parse_config(TOKENS)) is not None
    only_one_kb = parse_config(f"[webhooks.kbs.a]\nsecrets = ['{SECRET}']\n" + TOKENS)
    assert problem(only_one_kb) is not None  # every other KB would still take anything
    assert problem(parse_config("[webhooks]\nunsigned = true\n" + TOKENS)) is None
    assert problem(parse_config(f"[webhooks]\nsecrets = ['{SECRET}']\n" + TOKENS)) is None
    assert problem(parse_config("")) is None  # both doors open: loopback only, and logged
    with pytest.raises(ConfigError, match=r"^webhooks.unsigned: true beside webhooks.secrets"):
        parse_config(f"[webhooks]\nsecrets = ['{SECRET}']\nunsigned = true\n")


def test_open_doors_are_logged_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cases = {
        "": ["no bearer token", "unsigned deliveries"],
        TOKENS + "[webhooks]\nunsigned = true\n": ["unsigned deliveries"],
        f"[webhooks]\nsecrets = ['{SECRET}']\n": ["no bearer token"],
        f"[webhooks]\nsecrets = ['{SECRET}']\n" + TOKENS: [],
    }
    for number, (text, doors) in enumerate(cases.items()):
        folder = tmp_path / str(number)
        folder.mkdir()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kbgraph"), _client(folder, text):
            pass
        said = [r.getMessage() for r in caplog.records if "door open" in r.getMessage()]
        assert len(said) == len(doors), (text, said)
        for door, line in zip(doors, said, strict=True):
            assert door in line and all(r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.parametrize("length", [1, 5, MIN_TOKEN_CHARS - 1])
def test_short_tokens_are_refused_saying_how_long(length: int) -> None:
    token = "Q" * length
    with pytest.raises(ConfigError) as info:
        parse_config(f'[[tokens]]\nname = "ops"\ntoken = "{token}"\n')
    message = str(info.value)
    assert message.startswith(f"tokens[0].token: {length} characters")
    assert f"at least {MIN_TOKEN_CHARS}" in message and token not in message.split(":", 1)[1]
    assert parse_config(f'[[tokens]]\nname = "ops"\ntoken = "{"Q" * MIN_TOKEN_CHARS}"\n')


def test_a_store_whose_folder_does_not_exist_is_refused(tmp_path: Path) -> None:
    """``serve``, ``demo``'s store and ``import --config`` never make the store's folder: a
    mistyped path would quietly serve a new, empty store."""
    folder = tmp_path / "nonexistent" / "dir"
    path = tmp_path / "kbgraph.toml"
    path.write_text(f'[store]\npath = "{folder / "x.db"}"\n')
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "a.md").write_text("# a\n")
    commands = [
        ["serve", "--config", str(path), "--port", "1"],
        [
            "import",
            str(vault),
            "--kb",
            "k",
            "--config",
            str(path),
            "--manifest",
            str(tmp_path / "m"),
        ],
    ]
    for command in commands:
        done = subprocess.run(
            [sys.executable, "-m", "kbgraph", *command], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (
            f"kbgraph: store {folder / 'x.db'}: the folder {folder} does not exist"
            " (create it first)"
        )
        assert not folder.parent.exists()
