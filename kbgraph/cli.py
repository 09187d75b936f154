"""The command line: ``kbgraph serve``, ``kbgraph mcp`` (stdio) and the one-command ``kbgraph
demo`` (docs/configuration.md, docs/agents.md); ``kbgraph import`` and ``kbgraph sync`` live in
``kbgraph.sources.command`` (section 7).

``serve`` checks the config before anything starts (a wrong config exits 2 with a message
naming the key) and refuses, also with exit 2, to run with authentication off — no webhook
secret or no token — on an address other than loopback. uvicorn then builds the app in each
worker from ``kbgraph.api:app_from_env`` (``factory=True``), the config path passed in the
``KBGRAPH_CONFIG`` environment variable, so ``--workers N`` works. (The factory named to
uvicorn is ``kbgraph.cli:app_factory``, which also shortens the GIL switch interval in each
worker; see ``GIL_SWITCH_INTERVAL``.)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import ipaddress
import os
import secrets
import shlex
import sqlite3
import sys
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final

from kbgraph import __version__
from kbgraph.config import CONFIG_ENV, Config, ConfigError, load_config
from kbgraph.extras import EXIT_USAGE, add_unavailable, config_problem, missing
from kbgraph.extras import problem as extra_problem
from kbgraph.http.port import port_problem
from kbgraph.sources.demokb import demo_concepts, example_vault
from kbgraph.store.opening import store_folder_problem, store_problem

APP_FACTORY: Final = "kbgraph.cli:app_factory"
# The event loop, the store's writer thread and the projection follower share the GIL. At
# Python's default 5 ms switch interval, a thread coming back from SQLite (or any C call that
# released the GIL) can wait up to 5 ms to run again: with a busy event loop that made the
# writer about 3x slower per event. 0.5 ms bounds that wait for <1% switching overhead.
GIL_SWITCH_INTERVAL: Final = 0.0005
DEMO_KB: Final = "demo"
VAULT_KB: Final = "homelab"
BACKUP_PROGRESS_BYTES: Final = 64 << 20  # a smaller store is copied before a bar says much
EXAMPLE_VAULT: Final = example_vault()


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1; any other address (0.0.0.0 too) is not."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def auth_problem(config: Config, host: str) -> str | None:
    """Why the service must not start on ``host`` with ``config``, or None."""
    if is_loopback(host):
        return None
    missing = []
    if not config.webhooks.secrets:
        missing.append("no webhook secret ([webhooks] secrets)")
    if not config.tokens:
        missing.append("no bearer token ([[tokens]])")
    if not missing:
        return None
    return (
        f"refusing to serve on non-loopback address {host!r} with authentication off: "
        f"{' and '.join(missing)}; configure both, or bind to 127.0.0.1"
    )


def unsigned_problem(config: Config) -> str | None:
    """Why tokens beside unsigned deliveries must not start unless ``[webhooks] unsigned``
    says they are meant: a locked read door beside an open write door is almost always a
    forgotten secret, and anyone reaching the port could write what agents then read."""
    if not config.tokens or config.webhooks.secrets or config.webhooks.unsigned:
        return None
    return (
        "[[tokens]] are set but there is no webhook secret ([webhooks] secrets): every KB"
        " without secrets of its own would take unsigned deliveries; set [webhooks] secrets,"
        " or [webhooks] unsigned = true if that is meant"
    )


def _fail(message: str) -> int:
    print(f"kbgraph: {message}", file=sys.stderr)
    return EXIT_USAGE


def _load(path: str) -> Config | None:
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(f"kbgraph: config {path}: {exc}", file=sys.stderr)
        return None
    needs = config_problem(config)
    if needs:
        print(f"kbgraph: config {path}: {needs}", file=sys.stderr)
        return None
    return config


def app_factory() -> Any:
    """uvicorn's factory in every worker process: tune the GIL hand-off, then build the app
    with ``kbgraph.api.app_from_env`` (the config path comes from ``KBGRAPH_CONFIG``)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    from kbgraph.api import app_from_env

    return app_from_env()


def run_server(
    config: Config,
    config_path: Path,
    host: str,
    port: int,
    workers: int,
    log_level: str = "info",
    access_log: bool = False,
) -> None:
    """Serve with uvicorn (uvloop + httptools, bounded by ``kbgraph.http.server``); the app factory
    and the protocol read the config path from env."""
    import uvicorn

    from kbgraph.http.server import PROTOCOL

    os.environ[CONFIG_ENV] = str(config_path.resolve())
    # kbgraph's own messages (start-up, checkpoints, the log) beside uvicorn's, at its level
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["loggers"]["kbgraph"] = {
        "handlers": ["default"],
        "level": log_level.upper(),
        "propagate": False,
    }
    loop = "auto"
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - Windows
        pass
    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=host,
        port=port,
        workers=workers,
        loop=loop,
        http=PROTOCOL,
        ws="none",
        timeout_keep_alive=config.limits.keep_alive_seconds,  # type: ignore[arg-type]
        log_level=log_level,
        log_config=log_config,
        access_log=access_log,
        timeout_graceful_shutdown=10,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return EXIT_USAGE
    problem = auth_problem(config, args.host) or unsigned_problem(config)
    problem = problem or store_folder_problem(config.store.path)
    problem = problem or port_problem(args.host, args.port)
    if problem:
        return _fail(problem)
    if args.workers < 1:
        return _fail("--workers: expected at least 1")
    from kbgraph.log import backends

    warming = _warm_up_beside() if args.workers == 1 else None
    problem = backends.serving_problem(config) or store_problem(config.store.path)
    if warming is not None:
        warming.join()
    if problem:
        return _fail(problem)
    stop_helpers = backends.start_helpers(config, Path(args.config), args.workers, args.log_level)
    try:
        run_server(
            config,
            Path(args.config),
            args.host,
            args.port,
            args.workers,
            args.log_level,
            args.access_log,
        )
    finally:
        if stop_helpers is not None:
            stop_helpers()
    return 0


def _warm_up_beside() -> threading.Thread:
    """The app's modules imported and the kernels compiled (or loaded from numba's cache) in
    a thread, while ``serve`` with one worker (which runs the app in this process) checks its
    store or restores a snapshot, a fetch that waits on the network: seconds off a fresh
    node's start. Whatever fails here fails again, and is said, where the app starts."""

    def run() -> None:
        with contextlib.suppress(Exception):
            import kbgraph.api  # noqa: F401 (imported for the app)
            from kbgraph.projection import warm_up as warm_up_projection
            from kbgraph.service import warm_up

            warm_up()
            warm_up_projection()

    thread = threading.Thread(target=run, name="kbgraph-warm-up", daemon=True)
    thread.start()
    return thread


def cmd_mcp(args: argparse.Namespace) -> int:
    """``kbgraph mcp``: the MCP tools of one KB over stdio, as one token sees it (docs/agents.md).

    Reads the store read-only and follows its log as every server process does, so deliveries
    the service acknowledges show up here too. Logs go to stderr: stdout is the protocol's.
    """
    config = _load(args.config)
    if config is None:
        return EXIT_USAGE
    from kbgraph.names import is_kb_name

    if not is_kb_name(args.kb):
        return _fail(f"--kb: {args.kb!r} is not a KB name")
    rules = None
    if args.token is not None:
        grants = [g for g in config.token_index().values() if g.name == args.token]
        if not grants:
            return _fail(f"--token: no token named {args.token!r} in {args.config}")
        if not grants[0].admin:
            rules = grants[0].rules.get(args.kb)
            if not rules:
                return _fail(f"--token: {args.token!r} has no rule for KB {args.kb!r}")
    import anyio

    from kbgraph.http.mcp import serve_stdio
    from kbgraph.service import Service

    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    service = Service(config, read_only=True)  # the one builder: store, projections, kernels
    try:
        service.open()
    except (OSError, sqlite3.Error) as exc:
        return _fail(f"store {config.store.path}: {exc}")
    try:
        anyio.run(
            serve_stdio,
            service.projections,
            args.kb,
            rules,
            config.embeddings.query_timeout_seconds,
        )
    finally:
        service.stop()
    return 0


# --- the demo ------------------------------------------------------------------------------

_DEMO_CONFIG: Final = """\
# Written by `kbgraph demo`: a fresh webhook secret and admin token for this demo only.
[store]
path = "kbgraph.db"

[webhooks]
secrets = ["{secret}"]

[[tokens]]
name = "admin"
token = "{token}"
admin = true
"""


def write_demo_config(path: Path) -> None:
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    path.write_text(_DEMO_CONFIG.format(secret=secret, token=secrets.token_urlsafe(24)))


def seed_demo(store_path: str, size: int) -> int:
    """Seed the ``demo`` KB through ``Store.append`` when it is empty; its seq after."""
    from kbgraph.events import ConceptUpserted, Event, UpsertData
    from kbgraph.store import Store

    with Store(store_path) as store:
        if store.kb_seq(DEMO_KB) > 0:
            return store.kb_seq(DEMO_KB)
        events: list[Event] = [
            ConceptUpserted(
                specversion="1.0",
                id=f"demo-seed-{concept['id']}",
                source="kbgraph://demo",
                subject=concept["id"],
                data=UpsertData(
                    version=1,
                    title=concept.get("title", ""),
                    type=concept.get("type", ""),
                    text=concept.get("text", ""),
                    tags=list(concept.get("tags", [])),
                    links=list(concept.get("links", [])),
                ),
            )
            for concept in demo_concepts(size)
        ]
        seq = 0
        for start in range(0, len(events), 500):
            seq = store.append(DEMO_KB, events[start : start + 500]).seq
        return seq


def sync_demo_vault(vault: Path, store_path: str, manifest_path: Path) -> str:
    """Sync the example vault into KB ``homelab`` (only what changed since the last start)."""
    from kbgraph.sources.manifest import Manifest
    from kbgraph.sources.sinks import LocalSink
    from kbgraph.sources.sync import sync_once

    sink = LocalSink(store_path)
    try:
        with Manifest(manifest_path) as manifest:
            report = sync_once(vault, VAULT_KB, sink, manifest)
    finally:
        sink.close()
    return report.summary()


def cmd_demo(args: argparse.Namespace) -> int:
    needs = extra_problem("vault", "kbgraph demo (its example vault)")
    if needs:
        return _fail(needs)
    if args.size < 1:
        return _fail("--size: expected at least 1")
    busy = port_problem("127.0.0.1", args.port)  # before a config, a token or a curl line
    if busy:
        return _fail(busy)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "kbgraph.toml"
    if not config_path.exists():
        write_demo_config(config_path)
        print(f"wrote {config_path} (fresh webhook secret and admin token)")
    config = _load(str(config_path))
    if config is None:
        return EXIT_USAGE
    from kbgraph.log.backends import writes_locally

    if not writes_locally(config):  # the demo seeds its store directly
        return _fail(f"config {config_path}: the demo runs on [log] kind = sqlite")
    problem = unsigned_problem(config) or store_problem(config.store.path)
    if problem:
        return _fail(problem)
    seq = seed_demo(config.store.path, args.size)
    print(f"KB {DEMO_KB!r} (synthetic, for scale) at seq {seq} in {config.store.path}")
    vault = Path(args.vault)
    if vault.is_dir():
        print(f"KB {VAULT_KB!r} from {vault}:")
        print(sync_demo_vault(vault, config.store.path, folder / "homelab-manifest.sqlite"))
    else:
        print(f"no vault at {vault}: KB {VAULT_KB!r} not loaded")
    admin = next((t for t in config.tokens if t.admin and t.token), None)
    base = f"http://127.0.0.1:{args.port}/v1/kbs/{VAULT_KB}"
    if admin is not None and admin.token:
        auth = shlex.quote(f"Authorization: Bearer {admin.token}")
        print(f"\nadmin token: {admin.token}\n\ntry:\n")
        question = "how do I get the photos off my phone"
        print(
            f"  curl -s -H {auth} -H 'Content-Type: application/json' "
            f"""-d '{{"query": "{question}", "limit": 5}}' {base}/tools/graph_context\n"""
        )
        print(f"  curl -s -H {auth} '{base}/search?q=power+cut&limit=3'\n")
    else:
        print("(no plain admin token in the config: use your own token with the API)")
    run_server(config, config_path, "127.0.0.1", args.port, 1, args.log_level, args.access_log)
    return 0


# --- entry point ---------------------------------------------------------------------------


def cmd_backup(args: argparse.Namespace) -> int:
    """A consistent, integrity-checked copy of the store while the service runs."""
    from kbgraph.sources.progress import Progress
    from kbgraph.store.backup import BackupError, backup

    config = _load(args.config)
    if config is None:
        return EXIT_USAGE
    try:
        with Progress("B", quiet=False, min_total=BACKUP_PROGRESS_BYTES, scaled=True) as shown:
            done = backup(Path(config.store.path), Path(args.dest), partial(shown, "copied"))
    except BackupError as exc:
        return _fail(f"backup: {exc}")
    kbs = ", ".join(f"{name} at seq {seq}" for name, seq in done.kbs.items()) or "no KB"
    print(
        f"kbgraph: backup of {config.store.path} written to {done.path}: {done.bytes:,} bytes,"
        f" log end gid {done.gid} ({kbs}), integrity ok, in {done.seconds:.2f} s"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kbgraph", description="Graph retrieval for knowledge bases."
    )
    parser.add_argument("--version", action="version", version=f"kbgraph {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    defaults = argparse.ArgumentDefaultsHelpFormatter
    serve = sub.add_parser(
        "serve",
        help="run the service",
        description="Serve the HTTP API, MCP (streamable HTTP) and the explorer (/ui) on the"
        " store of --config. Refuses a non-loopback --host while no webhook secret or no token"
        " is configured.",
        formatter_class=defaults,
    )
    serve.add_argument(
        "--config", required=True, default=argparse.SUPPRESS, help="the TOML config file"
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve.add_argument("--port", type=int, default=8080, help="the TCP port")
    serve.add_argument(
        "--workers", type=int, default=1, help="server processes (each follows the store)"
    )
    serve.set_defaults(func=cmd_serve)

    mcp = sub.add_parser("mcp", help="serve one KB's tools over MCP on stdin/stdout")
    mcp.add_argument("--config", required=True, help="the TOML config file (its store is read)")
    mcp.add_argument("--kb", required=True, help="the knowledge base to serve")
    mcp.add_argument("--token", help="serve what this token (by name) may see; default: all")
    mcp.set_defaults(func=cmd_mcp)

    demo = sub.add_parser(
        "demo",
        help="write a demo config, seed a demo KB, serve it",
        description="Serve the example vault as KB homelab and a synthetic KB demo on loopback,"
        " with a config and admin token written to --dir on the first run.",
        formatter_class=defaults,
    )
    demo.add_argument("--dir", default="demo", help="the folder of its config and store")
    demo.add_argument("--port", type=int, default=8080, help="the TCP port on 127.0.0.1")
    demo.add_argument("--size", type=int, default=1000, help="concepts of the synthetic KB")
    demo.add_argument("--vault", default=str(EXAMPLE_VAULT), help="the vault served as KB homelab")
    demo.set_defaults(func=cmd_demo)

    backup = sub.add_parser("backup", help="copy the store while the service runs (checked)")
    backup.add_argument("--config", required=True, help="the TOML config file (its store)")
    backup.add_argument("dest", metavar="DEST", help="the copy's file (or a folder for it)")
    backup.set_defaults(func=cmd_backup)

    if missing("vault"):
        add_unavailable(sub, ("import", "sync"), "vault", _fail)
    else:
        from kbgraph.sources.command import add_commands

        add_commands(sub)
    if missing("jetstream"):
        add_unavailable(sub, ("cluster",), "jetstream", _fail)
    else:
        from kbgraph.log.jetstream.commands import add_commands as add_cluster_commands

        add_cluster_commands(sub)

    for command in (serve, demo):
        command.add_argument(
            "--log-level",
            default="info",
            choices=["critical", "error", "warning", "info", "debug"],
            help="the least severe message logged",
        )
        command.add_argument(
            "--access-log", action="store_true", help="log every request (off: it costs throughput)"
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # ``kbgraph`` alone: the help, as for a usage error
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
