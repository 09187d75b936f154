"""Every loadtest script runs the one way the docs show it: ``python -m loadtest.<name>``.

Each script (a module of ``loadtest/`` with a ``__main__`` block) is started that way from the
repository's root with ``--help``: it must import (no ``ModuleNotFoundError`` from a module
that only worked run as a file) and its usage line must name that same command, so ``--help``
never teaches another form; a description taken from the docstring is its whole first
paragraph, not its first line. ``--help`` exits before any benchmark work, so this stays cheap.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.support import ROOT, scripts


def test_the_scripts_are_found() -> None:
    found = scripts()
    assert {"abuse", "bench_api", "bench_ingest", "eval_retrieval"} <= set(found), found


def cut_description(name: str, out: str) -> str | None:
    """The first line of the script's docstring when ``--help`` shows it but not the whole
    first paragraph it begins (a description cut mid-sentence), else None. Compared without
    whitespace: argparse wraps the text again, at spaces and hyphens."""
    module = ROOT / "loadtest" / f"{name or '__main__'}.py"
    doc = ast.get_docstring(ast.parse(module.read_text())) or ""
    first_line, paragraph = doc.split("\n")[0], doc.split("\n\n")[0]
    shown = "".join(out.split())
    if "".join(first_line.split()) in shown and "".join(paragraph.split()) not in shown:
        return first_line
    return None


def test_each_script_runs_as_a_module() -> None:
    """All at once (each is a fresh interpreter importing numpy and friends), then checked."""
    names = [*scripts(), ""]  # "" is the load test itself: python -m loadtest
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", f"loadtest.{name}" if name else "loadtest", "--help"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    }
    failures = []
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        command = f"python -m loadtest.{name}" if name else "python -m loadtest"
        if proc.returncode != 0:
            failures.append(f"{command} --help: exit {proc.returncode}: {err.strip()[-300:]}")
        elif not out.startswith(f"usage: {command} "):
            failures.append(f"{command} --help: usage line is {out.splitlines()[:1]}")
        elif cut := cut_description(name, out):
            failures.append(f"{command} --help: the description stops after {cut!r}")
    assert not failures, "\n".join(failures)
