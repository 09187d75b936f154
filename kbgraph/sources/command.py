"""``kbgraph import DIR --kb KB`` and ``kbgraph sync DIR --kb KB [--watch]`` (docs/sources.md).

Both send only what changed since the last run (the manifest, see ``manifest``); ``import``
is ``sync`` without ``--watch``. The destination is the local store of ``--config FILE``
(through ``Store.append``, the webhook's own path) or a remote kbgraph at ``--url URL`` by
signed webhook, the secret read from ``KBGRAPH_WEBHOOK_SECRET``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Final

from kbgraph.config import ConfigError, load_config, secret_problem
from kbgraph.extras import EXIT_FAILED
from kbgraph.sources.beir import command as beir
from kbgraph.sources.hook import SourceHook, fail, options_problem
from kbgraph.sources.manifest import Manifest, open_manifest
from kbgraph.sources.mediawiki import command as mediawiki
from kbgraph.sources.progress import Progress
from kbgraph.sources.sinks import SECRET_ENV, LocalSink, Sink, SyncError, WebhookSink
from kbgraph.sources.sync import SyncReport, sync_once, watch
from kbgraph.sources.vault.reader import MAX_NOTE_BYTES, walk

# the sources a command line may name in place of the vault folder (kbgraph.sources.hook)
SOURCES: Final[tuple[SourceHook, ...]] = (mediawiki.HOOK, beir.HOOK)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, text in (
        (
            "import",
            "load a folder of markdown notes (an Obsidian vault, a Logseq graph), a MediaWiki"
            " dump (--mediawiki-dump) or a BEIR corpus (--beir) into a KB",
        ),
        ("sync", "send a folder's changes since the last run; --watch keeps it current"),
    ):
        command = sub.add_parser(name, help=text, description=text)
        command.add_argument(
            "dir", metavar="DIR", nargs="?", help="the vault folder (or Logseq graph)"
        )
        command.add_argument("--kb", required=True, help="the KB to write into")
        where = command.add_mutually_exclusive_group(required=True)
        where.add_argument("--config", help="the TOML config of the local store to write into")
        where.add_argument("--url", help=f"a remote kbgraph's base URL (secret from ${SECRET_ENV})")
        command.add_argument(
            "--retries", type=int, default=5, help="retries of a failed delivery (--url)"
        )
        command.add_argument(
            "--manifest",
            help="what was sent, for re-runs (default DIR/.kbgraph/manifest.sqlite)",
        )
        command.add_argument(
            "--quiet", action="store_true", help="print only problems (no progress either)"
        )
        command.add_argument(
            "--report",
            metavar="FILE",
            help="write the unresolved links, skipped files and warnings to FILE (one a line)",
        )
        command.add_argument(
            "--allow-hardlinks",
            action="store_true",
            help="read notes with more than one name (skipped else: the other may be outside)",
        )
        if name == "sync":
            command.add_argument("--watch", action="store_true", help="keep syncing on changes")
        for source in SOURCES:
            source.add_arguments(command, name)
        command.set_defaults(func=run_command, watch=False)


def open_sink(args: argparse.Namespace) -> Sink | str:
    """The destination of ``args``, or why there is none."""
    if args.url:
        if not args.url.startswith(("http://", "https://")):
            return f"--url {args.url!r}: expected an http:// or https:// URL"
        secret = os.environ.get(SECRET_ENV)
        problem = secret_problem(secret) if secret else "missing"
        if problem:  # before anything is sent: an unsigned delivery is refused, or worse taken
            return (
                f"--url: the webhook secret {SECRET_ENV}: {problem}; set it to a secret the"
                f" server at {args.url} takes (one of its [webhooks] secrets, whsec_ and"
                f" base64): export {SECRET_ENV}=whsec_..."
            )
        return WebhookSink(args.url, secret, attempts=args.retries + 1)

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return f"config {args.config}: {exc}"
    from kbgraph.log.backends import writes_locally
    from kbgraph.store.opening import open_store, store_folder_problem

    if not writes_locally(config):  # writing a node's store directly would fork it
        return (
            f"config {args.config}: [log] kind = {config.log.kind}: a node's store follows the"
            " stream; send with --url to a node instead"
        )

    return store_folder_problem(config.store.path) or LocalSink(open_store(config))


def run_command(args: argparse.Namespace, stop_event: threading.Event | None = None) -> int:
    if sum(source.wanted(args) for source in SOURCES) > 1:
        return fail("give one source in place of DIR (a wiki, a dump, a corpus), not several")
    for source in SOURCES:  # a source named in place of the folder (a wiki, say)
        if source.wanted(args):
            if args.report:
                return fail("--report: written for a folder's import or sync only")
            return source.run(args, open_sink, stop_event)
    if args.dir is None:
        return fail("DIR: expected the vault folder (or a wiki, a corpus: see --help)")
    root = Path(args.dir)
    if not root.exists():
        return fail(f"{args.dir}: no such folder")
    if not root.is_dir():
        return fail(f"{args.dir}: not a folder")
    problem = options_problem(args)
    if problem:
        return fail(problem)
    max_note_bytes = note_bound(args)
    if isinstance(max_note_bytes, str):
        return fail(max_note_bytes)
    manifest_path = Path(args.manifest) if args.manifest else Manifest.default_path(root)
    if not args.watch and not manifest_path.exists() and not walk(root)[0]:
        # a first run over an empty or mistyped folder: said, and nothing made in it
        return fail(
            f"{args.dir}: no notes found (no .md file in it or its folders): check the path",
            EXIT_FAILED,
        )
    sink = open_sink(args)
    if isinstance(sink, str):
        return fail(sink)
    manifest = open_manifest(manifest_path)
    if isinstance(manifest, str):
        sink.close()
        return fail(manifest)
    try:
        with manifest:
            code = _run(root, args, sink, manifest, max_note_bytes)
            if code == 0 and args.watch:
                print(f"watching {root} (Ctrl-C stops)", file=sys.stderr)
                watch(
                    root,
                    lambda: _run(root, args, sink, manifest, max_note_bytes),
                    lambda exc: print(f"kbgraph: {exc}", file=sys.stderr),
                    stop_event,
                )
            return code
    finally:
        sink.close()


def note_bound(args: argparse.Namespace) -> int | str:
    """The bound of a folder's note in bytes that ``--max-page-bytes`` sets (the reader's own,
    ``MAX_NOTE_BYTES``, when not given; never more: a note's text is bounded anyway), or what
    is wrong with it."""
    given: int | None = getattr(args, "max_page_bytes", None)
    if given is None:
        return MAX_NOTE_BYTES
    if given <= 0:
        return "--max-page-bytes: expected a number of bytes above 0"
    return min(given, MAX_NOTE_BYTES)


def _run(
    root: Path, args: argparse.Namespace, sink: Sink, manifest: Manifest, max_note_bytes: int
) -> int:
    try:
        with Progress("notes", quiet=args.quiet) as progress:
            report = sync_once(
                root,
                args.kb,
                sink,
                manifest,
                progress,
                allow_hardlinks=args.allow_hardlinks,
                max_note_bytes=max_note_bytes,
            )
    except SyncError as exc:  # reported; under --watch the next change tries again
        return fail(str(exc), EXIT_FAILED)
    _print(report, args.quiet)
    if args.report:
        try:
            Path(args.report).write_text(report.details())
        except OSError as exc:
            return fail(f"--report {args.report}: {exc.strerror or exc}", EXIT_FAILED)
    return 0


def _print(report: SyncReport, quiet: bool) -> None:
    text = report.summary()
    if quiet:
        text = "\n".join(line for line in text.splitlines()[1:])
    if text:
        print(text, file=sys.stderr if quiet else sys.stdout)
