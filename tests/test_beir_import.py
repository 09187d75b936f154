"""``kbgraph import --beir``: a BEIR corpus, one concept a line; a re-import sends only what
changed (and any sequence of corpus edits ends where a fresh import of the last file does);
a bad line or id refuses the file, named, with nothing sent."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbgraph.cli import main
from kbgraph.events import Event
from kbgraph.sources import deliver as deliver_module
from kbgraph.sources.beir import corpus as corpus_module
from kbgraph.sources.beir.command import SOURCE
from kbgraph.sources.deliver import SourceConcept
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sinks import SECRET_ENV, LocalSink
from kbgraph.store import DeliveryResult, Store
from tests.support import ADMIN, SECRET, bearer, running, served_config

ROWS = [
    {"_id": "doc1", "title": "Teutberga", "text": "A queen of Lotharingia.", "metadata": {}},
    {"_id": "doc2", "title": "", "text": "No title: BEIR allows it."},
    {"_id": "wiki/Lothair II", "title": "Lothair II", "text": "King of Lotharingia."},
]


def write(path: Path, rows: list[dict] | list[str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def config(tmp: Path) -> Path:
    path = tmp / "kbgraph.toml"
    path.write_text('[store]\npath = "kb.db"\n')
    return path


def run(tmp: Path, corpus: Path, *more: str) -> int:
    argv = ["import", "--beir", str(corpus), "--kb", "kb", "--config", str(config(tmp))]
    return main([*argv, "--manifest", str(tmp / "manifest.sqlite"), *more])


def state(tmp: Path) -> dict[str, tuple]:
    with Store(tmp / "kb.db") as store:
        kb = store.load().kbs.get("kb")
    if kb is None:
        return {}
    return {c.id: (c.title, c.text, sorted(c.links), c.aliases, c.tags) for c in kb.concepts}


def versions(tmp: Path) -> dict[str, int]:
    with Store(tmp / "kb.db") as store:
        kb = store.load().kbs.get("kb")
    return {c.id: c.version for c in kb.concepts} if kb else {}


def test_import_reimport_edit_and_remove(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write(tmp_path / "corpus.jsonl", ROWS)
    assert run(tmp_path, corpus) == 0
    assert "3 passages; sent 3 upserts and 0 deletes, 0 passages unchanged" in (
        capsys.readouterr().out
    )
    assert state(tmp_path) == {
        "doc1": ("Teutberga", "A queen of Lotharingia.", [], [], []),
        "doc2": ("", "No title: BEIR allows it.", [], [], []),
        "wiki/Lothair II": ("Lothair II", "King of Lotharingia.", [], [], []),
    }
    first = versions(tmp_path)
    assert run(tmp_path, corpus) == 0  # nothing changed: nothing sent
    assert "sent 0 upserts and 0 deletes, 3 passages unchanged" in capsys.readouterr().out
    assert versions(tmp_path) == first

    write(corpus, [ROWS[0] | {"text": "Queen."}, ROWS[1], ROWS[2]])
    assert run(tmp_path, corpus) == 0
    assert "sent 1 upserts and 0 deletes, 2 passages unchanged" in capsys.readouterr().out
    assert state(tmp_path)["doc1"][1] == "Queen."
    now = versions(tmp_path)
    assert now["doc1"] > first["doc1"] and now["doc2"] == first["doc2"]

    write(corpus, [ROWS[0] | {"text": "Queen."}, ROWS[2]])
    assert run(tmp_path, corpus) == 0
    assert "sent 0 upserts and 1 deletes, 2 passages unchanged" in capsys.readouterr().out
    assert sorted(state(tmp_path)) == ["doc1", "wiki/Lothair II"]


def test_a_gzipped_corpus_and_blank_lines(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl.gz"
    lines = ["", json.dumps(ROWS[0]), "   ", json.dumps(ROWS[2]), ""]
    with gzip.open(corpus, "wt", encoding="utf-8") as file:
        file.write("\n".join(lines))
    assert run(tmp_path, corpus, "--quiet") == 0
    assert sorted(state(tmp_path)) == ["doc1", "wiki/Lothair II"]


def test_bad_lines_are_named_and_nothing_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus_module, "MAX_LINE_BYTES", 2000)
    monkeypatch.setattr(corpus_module, "MAX_TEXT_BYTES", 100)
    rows = [
        ROWS[0],
        '{"_id": 5, "title": "x"}',
        '{"title": "no id"}',
        "not json",
        "[1, 2]",
        {"_id": "doc9", "title": 7},
        {"_id": "doc10", "title": "t" * 1025},
        {"_id": "doc11", "text": "x" * 3000},
        ROWS[2],
        {"_id": "doc1", "text": "again"},
        {"_id": "doc12", "text": "é" * 60},
    ]
    corpus = write(tmp_path / "corpus.jsonl", rows)
    assert run(tmp_path, corpus) == 1
    err = capsys.readouterr().err
    assert "bad lines, nothing sent" in err
    for expected in (
        "line 2: Expected `str`, got `int` - at `$._id`",
        "line 3: Object missing required field `_id`",
        "line 4: not a JSON object",
        "line 5: Expected `object`, got `array`",
        "line 6: Expected `str`, got `int` - at `$.title`",
        "line 7: Expected `str` of length <= 1024 - at `$.title`",
        "line 8: longer than 2,000 bytes",
        "line 10: `_id` 'doc1' is line 1's too",
        "line 11: `text` longer than 100 bytes",
    ):
        assert expected in err, expected
    assert "line 9" not in err and "line 1:" not in err
    assert not (tmp_path / "kb.db").exists()  # checked before the store is opened


@pytest.mark.parametrize(
    ("cid", "problem"),
    [
        ("", "empty"),
        ("a//b", "empty segment"),
        ("/lead", "empty segment"),
        ("tab\there", "control character"),
        ("bidi\u202eid", "format character"),
        ("x" * 513, "longer than 512 characters"),
    ],
)
def test_invalid_ids_refuse_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cid: str, problem: str
) -> None:
    corpus = write(tmp_path / "corpus.jsonl", [ROWS[0], {"_id": cid, "text": "x"}])
    assert run(tmp_path, corpus) == 1
    err = capsys.readouterr().err
    assert "line 2: `_id`" in err and f"invalid concept id: {problem}" in err
    assert "\u202e" not in err  # printed escaped: it cannot reorder the reader's terminal
    assert not (tmp_path / "kb.db").exists()


def test_command_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write(tmp_path / "corpus.jsonl", ROWS)
    conf = str(config(tmp_path))
    cases = [
        (["--beir", str(tmp_path / "nope.jsonl"), "--kb", "kb"], "nope.jsonl: no such file"),
        ([str(tmp_path), "--beir", str(corpus), "--kb", "kb"], "give either DIR or --beir"),
        (["--beir", str(corpus), "--kb", "Bad KB"], "--kb 'Bad KB': expected a KB name"),
        (["--beir", str(corpus), "--mediawiki-dump", str(corpus), "--kb", "kb"],
         "give one source in place of DIR"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(["import", *argv, "--config", conf]) == 2
        assert message in capsys.readouterr().err
    gz = tmp_path / "cut.jsonl.gz"
    whole = gzip.compress("".join(f'{{"_id": "a{i}"}}\n' for i in range(1000)).encode())
    gz.write_bytes(whole[: len(whole) // 2])  # cut short
    assert run(tmp_path, gz) == 1
    assert "cannot read it" in capsys.readouterr().err


def test_a_replaced_store_gets_every_passage_again(tmp_path: Path) -> None:
    corpus = write(tmp_path / "corpus.jsonl", ROWS)
    assert run(tmp_path, corpus, "--quiet") == 0
    for leftover in tmp_path.glob("kb.db*"):
        leftover.unlink()  # the store is deleted; the manifest stays
    assert run(tmp_path, corpus, "--quiet") == 0
    assert sorted(state(tmp_path)) == ["doc1", "doc2", "wiki/Lothair II"]


passage = st.fixed_dictionaries(
    {
        "_id": st.sampled_from(["a", "b", "c/d", "Café", "e f"]),
        "title": st.sampled_from(["", "A", "Title"]),
        "text": st.sampled_from(["", "one", "two words", "ünïcode"]),
    }
)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(passage, max_size=5), min_size=1, max_size=5))
def test_imports_in_turn_equal_a_fresh_import(corpora: list[list[dict]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        (tmp / "synced").mkdir()
        (tmp / "fresh").mkdir()
        corpus = tmp / "corpus.jsonl"
        seen: dict[str, int] = {}
        for rows in corpora:
            unique = list({row["_id"]: row for row in rows}.values())  # a repeat is refused
            write(corpus, unique)
            assert run(tmp / "synced", corpus, "--quiet") == 0
            now = versions(tmp / "synced")
            assert all(now[c] >= seen[c] for c in now.keys() & seen.keys())
            seen.update(now)
        assert run(tmp / "fresh", corpus, "--quiet") == 0
        assert state(tmp / "synced") == state(tmp / "fresh")


class WatchedSink:
    """A local sink that records, at each delivery, how many lines the reader had yielded."""

    def __init__(self, inner: LocalSink, read: list[int]) -> None:
        self.inner, self.dest, self.read, self.seen = inner, inner.dest, read, []

    def send(self, kb: str, events: list[Event]) -> DeliveryResult:
        self.seen.append((self.read[0], len(events)))
        return self.inner.send(kb, events)

    def kb_seq(self, kb: str) -> int | None:
        return self.inner.kb_seq(kb)

    def close(self) -> None:
        self.inner.close()


def test_deliveries_go_while_the_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming: a delivery is sent once full, before the reader has gone further; the
    deletes go last."""
    monkeypatch.setattr(deliver_module, "BATCH_EVENTS", 4)
    rows = [{"_id": f"p{i}", "text": f"passage {i}"} for i in range(10)]
    corpus = write(tmp_path / "corpus.jsonl", rows)
    read = [0]

    def counted() -> Iterator[SourceConcept]:
        for concept in corpus_module.concepts(corpus):
            read[0] += 1
            yield concept

    sink = WatchedSink(LocalSink(tmp_path / "kb.db"), read)
    with Manifest(tmp_path / "manifest.sqlite") as manifest:
        sent = deliver_module.deliver("kb", sink, manifest, counted(), source=SOURCE)
        assert (sent.upserted, sink.seen) == (10, [(5, 4), (9, 4), (10, 2)])
        write(corpus, rows[:3])
        sink.seen.clear()
        read[0] = 0
        sent = deliver_module.deliver(
            "kb", sink, manifest, counted(), source=SOURCE, everything=True
        )
        assert (sent.unchanged, sent.deleted, sink.seen) == (3, 7, [(3, 4), (3, 3)])
    sink.close()
    assert sorted(state(tmp_path)) == ["p0", "p1", "p2"]


@pytest.mark.slow
def test_import_over_the_signed_webhook(tmp_path: Path) -> None:
    corpus = write(tmp_path / "corpus.jsonl", ROWS)
    env = {**os.environ, SECRET_ENV: SECRET}
    with running(served_config(tmp_path)) as url:
        command = [sys.executable, "-m", "kbgraph", "import", "--beir", str(corpus), "--kb",
                   "remote", "--url", url, "--manifest", str(tmp_path / "m.sqlite")]  # fmt: skip
        for expected in ("sent 3 upserts", "sent 0 upserts and 0 deletes, 3 passages unchanged"):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and expected in done.stdout, done.stderr
        answer = httpx.get(
            f"{url}/v1/kbs/remote/concepts/wiki/Lothair II",
            headers=bearer(ADMIN),
            timeout=10,
        )
        assert (answer.json()["title"], answer.json()["links"]) == ("Lothair II", [])


def test_a_line_gone_bad_after_the_check_stops_the_reading(tmp_path: Path) -> None:
    """The file changed between the check and the sending: the reader stops at the bad line,
    naming it (what was sent before it stays recorded; a re-run checks the file again)."""
    corpus = write(tmp_path / "corpus.jsonl", [ROWS[0], '{"_id": ""}', ROWS[2]])
    read = corpus_module.concepts(corpus)
    assert next(read).id == "doc1"
    with pytest.raises(corpus_module.CorpusError, match="line 2: `_id` '': invalid concept id"):
        next(read)
