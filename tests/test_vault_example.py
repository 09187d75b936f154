"""The repository's example vault (examples/vault) imported and read back through the API:
titles, aliases, resolved and unresolved links, attachments, the skipped bad note."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from kbgraph.api import context_of
from kbgraph.sources.manifest import Manifest
from kbgraph.sources.sync import sync_once
from kbgraph.store import Store
from tests.support import ADMIN, Service
from tests.vault_files import VAULT, AppSink


def test_example_vault(service: Service, tmp_path: Path) -> None:
    store = context_of(service.app).service.store
    with Manifest(tmp_path / "manifest.sqlite") as manifest:
        report = sync_once(VAULT, "homelab", AppSink(store), manifest)
    read = report.read
    assert len(read.notes) == 83
    assert read.skipped == [
        ("infra/bad\u200bname.md", "invalid id from path: format character (Unicode Cf)")
    ]
    seq = store.kb_seq("homelab")

    def concept(cid: str) -> dict:
        response = service.call(ADMIN, "GET", f"/v1/kbs/homelab/concepts/{quote(cid)}", seq)
        assert response.status_code == 200, cid
        return response.json()

    immich = concept("services/Immich")
    assert immich["title"] == "Photo library (Immich)" and "Immich" in immich["aliases"]
    assert concept("network/Reverse proxy")["aliases"] == ["Caddy"]  # a single string
    assert "media server" in concept("services/Jellyfin")["aliases"]
    assert concept("network/Network overview")["title"] == "Network overview"  # not its # line
    assert concept("infra/old/Firewall")["status"] == "deprecated"
    conventions = concept("Conventions")
    assert set(conventions["links"]) == {
        "infra/Server atlas",
        "services/Vaultwarden",
        "infra/backups/Backup with rsync",
        "infra/backups/Backup with restic",
        "network/IP address plan",
    }  # fmt: skip  -- nothing from its code blocks
    assert "not-a-tag" not in conventions["tags"] and "homelab/network" in conventions["tags"]
    tls = concept("network/TLS certificates")["links"]
    assert "network/Reverse proxy" in tls  # Reverse%20proxy.md
    assert "network/Firewall" in tls and "infra/old/Firewall" not in tls  # the shortest path
    assert {"network/DNS", "network/AdGuard Home"} <= set(
        concept("runbooks/Troubleshoot DNS")["links"]
    )
    assert "infra/storage/ZFS snapshots" in concept("infra/storage/ZFS pool")["links"]
    assert concept("network/Café network")["id"] == "network/Café network"
    start = concept("Start here")["links"]
    assert "household/Emergency handover" in start  # an embed of a note is a link
    state = {c.id: c for c in store.load().kbs["homelab"].concepts}
    assert len(state) == 83
    assert not [cid for cid in state if cid.startswith("attachments/") or "." in cid]
    assert not [link for c in state.values() for link in c.links
                if link.endswith((".png", ".pdf", ".canvas"))]  # fmt: skip
    assert {"Kubernetes migration", "Solar panels"} <= set(state["Inbox"].links)  # unresolved
    status = service.call(ADMIN, "GET", "/v1/kbs/homelab/status", seq).json()
    assert status["concepts"] == 83
    hits = service.call(ADMIN, "GET", "/v1/kbs/homelab/search?q=grandpa&limit=3", seq).json()
    assert hits["hits"][0]["id"] == "household/Olek"  # only its aliases say "Grandpa"


def test_demo_syncs_the_example_vault_only_once(tmp_path: Path) -> None:
    from kbgraph import cli

    store, manifest = str(tmp_path / "kbgraph.db"), tmp_path / "homelab-manifest.sqlite"
    first = cli.sync_demo_vault(cli.EXAMPLE_VAULT, store, manifest)
    assert "83 notes" in first and "sent 83 upserts" in first
    again = cli.sync_demo_vault(cli.EXAMPLE_VAULT, store, manifest)  # a restart of the demo
    assert "sent 0 upserts and 0 deletes, 83 notes unchanged" in again
    with Store(store) as reopened:
        assert len(reopened.load().kbs[cli.VAULT_KB].concepts) == 83
