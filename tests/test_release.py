"""The release's small promises: one version string, the changelog naming it, py.typed in the
package, `serve --help` showing its defaults, the demo script installing no test set-up.
(The wheel itself, installed without the checkout, is scripts/wheel-smoke.sh's.)"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version

import pytest

import kbgraph
from kbgraph import cli
from tests.support import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_one_version_string(capsys: pytest.CaptureFixture[str]) -> None:
    want = PYPROJECT["project"]["version"]
    assert kbgraph.__version__ == version("kbgraph") == want
    try:
        cli.main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.strip() == f"kbgraph {want}"
    assert f"## {want} " in (ROOT / "CHANGELOG.md").read_text()


def test_py_typed_ships_in_the_package() -> None:
    assert (ROOT / "kbgraph" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["kbgraph"]


def test_serve_help_describes_itself_with_defaults() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kbgraph", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "Serve the HTTP API" in text
    for default in ("127.0.0.1", "8080", "1", "info"):
        assert f"(default: {default})" in text
    assert "(default: None)" not in text


def test_the_demo_script_installs_no_test_setup() -> None:
    script = (ROOT / "scripts" / "demo.sh").read_text()
    commands = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    run = "\n".join(commands)
    assert "setup.sh" not in run and "apt-get" not in run and "[test]" not in run
    assert "pip install" in run and "-e '.[vault,local]'" in run
    assert "installing kbgraph[vault,local]" in run  # it says what it installs
