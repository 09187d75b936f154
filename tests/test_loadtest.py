"""The load-test harness: its generator and model, then short real runs with 1 and 2 workers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest

from tests.support import SECRET

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # loadtest/ is not installed

from loadtest import kbgen
from loadtest.driver import build_parser, main, run
from loadtest.httpload import build_request
from loadtest.model import Model
from loadtest.options import Options


def ev(kind: str, subject: str, version: int, eid: str, **data: object) -> dict:
    return {
        "specversion": "1.0",
        "id": eid,
        "source": "test://lt",
        "type": kind,
        "subject": subject,
        "data": {"version": version, **data},
    }


def test_model_applies_the_contract_rules() -> None:
    model = Model()
    first = model.apply(
        [
            ev("concept.upserted", "a/x", 2, "1", title="X", links=["a/y", "a/x"]),
            ev("concept.upserted", "a/y", 1, "2", title="Y"),
            ev("link.added", "a/z", 1, "3", target="a/x"),  # never existed: ignored
        ]
    )
    assert msgspec.to_builtins(first) == {
        "accepted": 3, "applied": 2, "duplicates": 0, "stale": 0, "ignored": 1,
    }  # fmt: skip
    assert model.expected("a/x") == {
        "id": "a/x", "title": "X", "aliases": [], "type": "", "status": "", "tags": [],
        "text": "", "version": 2, "links": ["a/y"], "backlinks": [],
    }  # fmt: skip
    assert model.expected("a/y")["backlinks"] == ["a/x"]  # type: ignore[index]
    again = model.apply([ev("concept.upserted", "a/x", 9, "1", title="dup")])
    assert (again.duplicates, again.applied) == (1, 0)
    stale = model.apply([ev("concept.upserted", "a/x", 2, "4", title="old")])
    assert stale.stale == 1 and model.expected("a/x")["title"] == "X"  # type: ignore[index]
    model.apply([ev("concept.deleted", "a/y", 5, "5")])
    assert model.expected("a/y") is None
    assert model.expected("a/x")["links"] == []  # type: ignore[index]  # target gone
    late = model.apply([ev("concept.upserted", "a/y", 4, "6", title="late")])
    assert late.stale == 1 and model.expected("a/y") is None  # no resurrection
    model.apply([ev("link.removed", "a/x", 3, "7", target="a/y")])
    model.apply([ev("concept.upserted", "a/y", 6, "8", title="back")])
    assert model.expected("a/x") is not None
    assert model.expected("a/x")["links"] == []  # type: ignore[index]
    assert model.status() == (2, 0)
    assert model.applied == 5


def test_generator_is_deterministic_and_zipf() -> None:
    a = kbgen.make_kb("seed", 200, seed=7)
    b = kbgen.make_kb("seed", 200, seed=7)
    assert a == b and all(c["text"] for c in a)
    words = " ".join(c["text"].lower() for c in a).replace(".", "").split()
    counts = sorted((words.count(w) for w in set(words)), reverse=True)
    assert counts[0] > 20 * counts[len(counts) // 2]  # a heavy head, a long tail
    hub = kbgen.make_kb("hub", 200, seed=7)
    assert [c["id"] for c in hub] == [c["id"] for c in a]
    one = kbgen.WriterStream(0, 2, a, seed=3)
    two = kbgen.WriterStream(0, 2, a, seed=3)
    for _ in range(200):
        d1, d2 = one.next(), two.next()
        assert d1.body == d2.body
        one.acknowledged(d1)
        two.acknowledged(d2)
    other = kbgen.WriterStream(1, 2, a, seed=3)
    later = [one.next() for _ in range(200)]
    subjects = {e["subject"] for d in later for e in d.events if "ghost" not in e["subject"]}
    assert subjects <= set(one.owned)
    assert not set(one.owned) & set(other.owned)  # writers own disjoint concepts


def test_deliveries_are_valid_for_the_service() -> None:
    from kbgraph.events import decode_delivery

    concepts = kbgen.make_kb("seed", 100, seed=1)
    stream = kbgen.WriterStream(1, 3, concepts, seed=1)
    deliveries = kbgen.initial_load(concepts, batch=30) + [stream.next() for _ in range(300)]
    for delivery in deliveries:
        events = decode_delivery(delivery.body, delivery.content_type)
        assert len(events) == len(delivery.events)
    signer = kbgen.Signer(SECRET)
    headers = signer.headers(deliveries[0])
    assert headers["webhook-signature"].startswith("v1,")


def test_request_bytes() -> None:
    raw = build_request("POST", "/x", "127.0.0.1", 80, {"a": "b"}, b"{}")
    assert raw == b"POST /x HTTP/1.1\r\nhost: 127.0.0.1:80\r\na: b\r\ncontent-length: 2\r\n\r\n{}"
    assert "--write-rate" in build_parser().format_help()


def test_port_is_an_option_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["--port", "9123"]).port == 9123
    assert build_parser().parse_args([]).port is None
    assert main(["--port", "70000"]) == 2
    assert "--port 70000: expected 1-65535" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_short_run_loses_nothing_and_has_no_5xx(workers: int, tmp_path: Path) -> None:
    full = run(Options(short=True, workers=workers, out=str(tmp_path), progress=False))
    checks = full["checks"]
    assert checks["no_5xx"], checks["five_xx_samples"]
    assert checks["zero_loss"], json.dumps(checks, indent=1)[:3000]
    assert checks["min_seq_honoured"], checks["min_seq_violations"]
    assert checks["acknowledged_deliveries"] > 10
    assert checks["applied_expected"] == checks["applied_found"] > 1000
    assert full["agents"]["all"]["count"] > 0
    assert full["webhooks"]["lag"]["count"] > 0
    assert (tmp_path / f"loadtest-w{workers}.json").exists()
    assert (tmp_path / f"loadtest-w{workers}.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_check_catches_a_delivery_the_service_never_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the model believes in one more applied event than was sent, zero_loss is false."""
    calls = {"n": 0}
    real_apply = Model.apply

    def apply_with_phantom(self: Model, events: list[dict]) -> object:
        calls["n"] += 1
        if calls["n"] == 12:  # a phantom upsert "acknowledged" but never sent
            real_apply(self, [ev("concept.upserted", "ops/phantom", 1, "phantom", title="P")])
        return real_apply(self, events)

    monkeypatch.setattr(Model, "apply", apply_with_phantom)
    full = run(Options(short=True, seconds=1.0, out=None, progress=False))
    checks = full["checks"]
    assert checks["no_5xx"]
    assert not checks["zero_loss"]
    assert checks["applied_expected"] == checks["applied_found"] + 1
    assert any(s.startswith("ops/phantom") for s in checks["mismatch_samples"])


def test_the_faults_readyz_figure_catches_a_node_ready_while_refusing() -> None:
    """``Load.ready_while_refusing``: a node that keeps saying ready while the deliveries
    sent to it fail counts from the first failed sending after the fault's start to its last
    ready sample; a node that says not ready (or does not answer) meanwhile counts from then."""
    from loadtest.faults import Load

    def load(readyz: list[tuple[float, int, int]]) -> Load:
        lying = Load(lambda: [], "whsec_x", {}, "kb", "t", {})
        # node 0: taken at 1, refused (sent 2, no answer by 5; sent 6, 503 at 7), taken at 9
        lying.writes = [
            (1.0, 0, 200, 0.9),
            (5.0, 0, 0, 2.0),
            (7.0, 0, 503, 6.0),
            (9.0, 0, 200, 8.5),
        ]
        lying.readyz = readyz
        return lying

    assert load([(t, 0, 200) for t in (1.5, 3.0, 5.0, 8.0)]).ready_while_refusing(0.0) == 6.0
    assert load([(t, 0, 200) for t in (1.5, 3.0, 5.0, 8.0)]).ready_while_refusing(4.0) == 4.0
    honest = [(1.5, 0, 200), (3.0, 0, 503), (5.0, 0, 0), (8.0, 0, 503), (9.5, 0, 200)]
    assert load(honest).ready_while_refusing(0.0) == 0.0
    late = [(3.0, 0, 503), (4.0, 0, 200), (8.0, 0, 200)]  # ready again at 4, still refusing
    assert load(late).ready_while_refusing(0.0) == 5.0
