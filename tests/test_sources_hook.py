"""A source plugs into ``kbgraph import`` / ``sync`` by its ``SourceHook`` alone: its options
on both commands, its run when the command line names it, the destination opened for it."""

from __future__ import annotations

import argparse
import threading

import pytest

from kbgraph.cli import build_parser
from kbgraph.sources import command
from kbgraph.sources.hook import OpenSink, SourceHook
from kbgraph.sources.sinks import SECRET_ENV, WebhookSink
from tests.support import SECRET


class Corpus:
    """A source that reads ``--corpus NAME`` (a stand-in for a new source's package)."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str, str]] = []

    def add_arguments(self, parser: argparse.ArgumentParser, name: str) -> None:
        parser.add_argument("--corpus", metavar="NAME")

    def wanted(self, args: argparse.Namespace) -> bool:
        return args.corpus is not None

    def run(
        self, args: argparse.Namespace, open_sink: OpenSink, stop: threading.Event | None
    ) -> int:
        sink = open_sink(args)
        assert isinstance(sink, WebhookSink)  # --url: a signed webhook
        sink.close()
        self.ran.append((args.command, args.corpus, args.kb))
        return 0


@pytest.mark.parametrize("name", ["import", "sync"])
def test_a_registered_source_gets_its_options_and_its_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = Corpus()
    hook = SourceHook(corpus.add_arguments, corpus.wanted, corpus.run)
    monkeypatch.setattr(command, "SOURCES", (*command.SOURCES, hook))
    monkeypatch.setenv(SECRET_ENV, SECRET)
    args = build_parser().parse_args(
        [name, "--corpus", "scifact", "--kb", "beir", "--url", "http://127.0.0.1:9"]
    )
    assert args.func(args) == 0
    assert corpus.ran == [(name, "scifact", "beir")]


def test_without_its_option_the_folder_is_read_as_before(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = Corpus()
    hook = SourceHook(corpus.add_arguments, corpus.wanted, corpus.run)
    monkeypatch.setattr(command, "SOURCES", (*command.SOURCES, hook))
    args = build_parser().parse_args(["import", "--kb", "beir", "--url", "http://127.0.0.1:9"])
    assert args.func(args) == 2 and corpus.ran == []
    assert "DIR: expected the vault folder" in capsys.readouterr().err
