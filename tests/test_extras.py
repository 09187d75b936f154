"""The extras: a core without them serves; what needs a missing one names it; the demo's
synthetic KB is kbgraph's own.

Each run is a subprocess in which the extras' modules cannot be imported (``sys.modules[name]
= None`` makes ``import name`` raise ImportError, as when the package is not installed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kbgraph.extras import EXTRAS
from kbgraph.sources import demokb
from tests.support import ROOT, cli_without, python_without

EVERY_EXTRA = sorted({module for pairs in EXTRAS.values() for module, _ in pairs})


def _requirement_name(requirement: str) -> str:
    for stop in "<>=!;[ ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.lower()


def _distributions(extras: dict[str, list[str]], extra: str) -> set[str]:
    """What pip installs for ``extra``: its packages, and those of the extras it names
    (``kbgraph[vault]``)."""
    names: set[str] = set()
    for requirement in extras[extra]:
        if requirement.startswith("kbgraph["):
            for named in requirement[len("kbgraph[") : -1].split(","):
                names |= _distributions(extras, named)
        else:
            names.add(_requirement_name(requirement))
    return names


def test_extras_name_the_packages_pyproject_lists() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for extra, pairs in EXTRAS.items():
        assert _distributions(extras, extra) == {d.lower() for _, d in pairs}, extra
    assert extras["all"] == [f"kbgraph[{','.join(EXTRAS)}]"]
    assert "kbgraph[all]" in extras["test"]
    core = {_requirement_name(r) for r in project["dependencies"]}
    for pairs in EXTRAS.values():  # an extra's package is not in the core
        assert not core & {dist.lower() for _, dist in pairs}


def test_the_core_serves_without_any_extra(tmp_path: Path) -> None:
    (tmp_path / "kbgraph.toml").write_text('[store]\npath = "kb.db"\n')
    code = """
from starlette.testclient import TestClient
from kbgraph.api import create_app
from kbgraph.config import load_config
event = {"specversion": "1.0", "id": "e1", "source": "t", "type": "concept.upserted",
         "subject": "a", "data": {"version": 1, "title": "A", "links": ["b"]}}
app = create_app(load_config("kbgraph.toml"))
with TestClient(app, base_url="http://127.0.0.1") as client:
    sent = client.post("/v1/kbs/k/events", json=event,
                       headers={"content-type": "application/cloudevents+json"})
    assert sent.status_code == 200, sent.text
    seen = {"X-Min-Seq": str(sent.json()["seq"])}  # the projection follows the store
    print(client.get("/v1/kbs/k/status", headers=seen).json()["concepts"])
print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED and sys.modules[m]))
"""
    done = python_without(code, EVERY_EXTRA, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "[]"]


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["import", "vault", "--kb", "k", "--config", "kbgraph.toml"], "vault"),
        (["sync", "vault", "--kb", "k", "--url", "http://127.0.0.1:9", "--watch"], "vault"),
        (
            ["cluster", "skip", "--config", "c.toml", "--position", "1", "--reason", "x"],
            "jetstream",
        ),
        (["demo", "--dir", "demo"], "vault"),
    ],
)
def test_a_command_names_its_missing_extra(tmp_path: Path, args: list[str], extra: str) -> None:
    done = cli_without(args, EVERY_EXTRA, tmp_path)
    assert done.returncode == 2
    assert f"pip install 'kbgraph[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "demo").exists()  # nothing written before the refusal


@pytest.mark.parametrize(
    ("settings", "extra"),
    [
        (
            '[log]\nkind = "jetstream"\n[log.jetstream]\nservers = ["nats://127.0.0.1:9"]\n'
            'mac_secret_env = "M"\n',
            "jetstream",
        ),
        ('[embeddings]\nprovider = "local"\n', "local"),
        (
            '[embeddings]\nprovider = "openai"\nurl = "http://127.0.0.1:9/v1"\nmodel = "m"\n',
            "openai",
        ),
    ],
)
def test_a_config_names_its_missing_extra(tmp_path: Path, settings: str, extra: str) -> None:
    (tmp_path / "c.toml").write_text('[store]\npath = "kb.db"\n' + settings)
    modules = [module for module, _ in EXTRAS[extra]]
    done = cli_without(["serve", "--config", "c.toml", "--port", "9"], modules, tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"pip install 'kbgraph[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "kb.db").exists()
    with_it = cli_without(["serve", "--config", "c.toml", "--workers", "0"], [], tmp_path)
    assert "pip install" not in with_it.stderr and "--workers" in with_it.stderr  # installed


def test_help_lists_every_command_without_the_extras(tmp_path: Path) -> None:
    done = cli_without(["--help"], EVERY_EXTRA, tmp_path)
    assert done.returncode == 0, done.stderr
    for command in ("serve", "mcp", "demo", "backup", "import", "sync", "cluster"):
        assert f"    {command} " in done.stdout
    assert "(needs pip install 'kbgraph[vault]')" in done.stdout


def test_the_demo_kb_comes_from_kbgraph_not_loadtest(tmp_path: Path) -> None:
    code = """
from kbgraph import cli
from kbgraph.store import Store
print(cli.seed_demo("kb.db", 40))
with Store("kb.db") as store:
    print(sum(len(c.links) for c in store.load().kbs["demo"].concepts))
print("loadtest" in sys.modules and sys.modules["loadtest"] is not None)
"""
    done = python_without(code, ["loadtest"], tmp_path)
    assert done.returncode == 0, done.stderr
    seq, links, loadtest_imported = done.stdout.split()
    assert seq == "40" and loadtest_imported == "False"
    assert int(links) == sum(len(set(c["links"])) for c in demokb.seed_kb(40))  # deduplicated


def test_loadtest_builds_on_the_demo_generator() -> None:
    from loadtest import synthetic

    assert synthetic.seed_kb is demokb.seed_kb
    concepts = demokb.demo_concepts(30)
    assert concepts == demokb.demo_concepts(30)  # deterministic
    assert [c["id"] for c in concepts] == demokb.kb_ids(30)
    assert all(c["text"].startswith(c["title"] + ": a " + c["type"]) for c in concepts)


def test_the_example_vault_is_found_in_a_checkout() -> None:
    assert demokb.example_vault() == ROOT / "examples" / "vault"
    assert (demokb.example_vault() / "Start here.md").is_file()
