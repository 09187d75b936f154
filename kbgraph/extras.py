"""The optional parts of kbgraph and what each needs (the extras of ``pyproject.toml``).

The core serves one machine from its SQLite store. A command or a config that needs an extra
whose packages are not installed stops before it starts anything, with a message naming the
extra to install (``pip install 'kbgraph[vault]'``), rather than an ImportError from deep
inside. ``EXTRAS`` names each extra's packages by the module they are imported as. The exit
codes every command shares are here too, beside the one for a missing extra's stop.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from kbgraph.config import Config

EXIT_FAILED: Final = 1  # a command ran and failed (a refusal, an unreachable service)
EXIT_USAGE: Final = 2  # argparse's code: the command line or the config is wrong

VAULT: Final = (
    ("markdown_it", "markdown-it-py"),
    ("mdit_py_plugins", "mdit-py-plugins"),
    ("yaml", "PyYAML"),
    ("watchfiles", "watchfiles"),
    ("httpx", "httpx"),
    ("edn_format", "edn_format"),
)
# extra -> ((module imported, distribution installed), ...): pyproject.toml's lists, by module
# (an extra that names another, kbgraph[vault], holds that one's pairs too)
EXTRAS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "jetstream": (("nats", "nats-py"), ("nkeys", "nkeys"), ("zstandard", "zstandard")),
    "vault": VAULT,
    # the wiki connector rides on the vault's manifest and sinks: kbgraph[vault] too
    "mediawiki": (*VAULT, ("mwxml", "mwxml"), ("mwparserfromhell", "mwparserfromhell")),
    "local": (("wordllama", "wordllama"),),
    "openai": (("httpx", "httpx"),),
}


class MissingExtra(RuntimeError):
    """A feature was asked for whose extra is not installed."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # blocked, or a stand-in without a spec
        return False


def missing(extra: str) -> list[str]:
    """The distributions of ``extra`` whose module cannot be imported here."""
    return [dist for module, dist in EXTRAS[extra] if not _importable(module)]


def problem(extra: str, need: str) -> str | None:
    """Why ``need`` cannot run without ``extra`` (and what to install), or None."""
    absent = missing(extra)
    if not absent:
        return None
    return (
        f"{need} needs the {extra!r} extra ({', '.join(absent)} not installed): "
        f"pip install 'kbgraph[{extra}]'"
    )


def require(extra: str, need: str) -> None:
    """Raise ``MissingExtra`` saying what to install when ``extra`` is missing."""
    message = problem(extra, need)
    if message is not None:
        raise MissingExtra(message)


def config_problem(config: Config) -> str | None:
    """The first setting of ``config`` whose extra is missing, said with the extra, or None."""
    kind = config.log.kind  # a log backend's extra is named as its kind
    if kind in EXTRAS:
        found = problem(kind, f'[log] kind = "{kind}"')
        if found:
            return found
    provider = config.embeddings.provider
    if provider in ("local", "openai"):
        return problem(provider, f'[embeddings] provider = "{provider}"')
    return None


def add_unavailable(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    names: tuple[str, ...],
    extra: str,
    refuse: Callable[[str], int],
) -> None:
    """Commands ``names`` that only say which extra they need, through ``refuse(message)``
    (whose return is the exit code): their extra is not installed."""
    for name in names:
        command = sub.add_parser(name, help=f"(needs pip install 'kbgraph[{extra}]')")
        command.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        message = problem(extra, f"kbgraph {name}") or ""
        command.set_defaults(func=lambda _args, message=message: refuse(message))
