"""A real MediaWiki for the tests: Debian's ``mediawiki`` package on ``php -S``, loopback only.

The install (``/usr/share/mediawiki``) is laid out again in a temporary folder as symlinks,
so nothing of the system's is written; ``maintenance/install.php`` makes a SQLite wiki there
with an administrator, and ``MW_INSTALL_PATH`` / ``MW_CONFIG_FILE`` point the web server and
the maintenance scripts at it. The settings add a ``read`` protection level, enforced by a
``getUserPermissionsErrors`` hook: core MediaWiki has no per-page read protection, and this
is how an extension (Lockdown and the like) hides a page from readers.

Missing packages fail the tests that need them with the command that installs them, unless
``KBGRAPH_MEDIAWIKI_TESTS=0`` says the MediaWiki tests are off (then they skip).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

INSTALL: Final = Path("/usr/share/mediawiki")
PACKAGES: Final = "mediawiki php-cli php-sqlite3"
ENV_SWITCH: Final = "KBGRAPH_MEDIAWIKI_TESTS"
ADMIN: Final = "Admin"
PASSWORD: Final = "kbgraph-admin-password-1"
START_SECONDS: Final = 90  # install.php and the first answer, on a loaded machine
CALL_SECONDS: Final = 60
SETTINGS: Final = r"""
# kbgraph's tests: a read protection level, enforced per page as an extension would
$wgRestrictionTypes[] = 'read';
$wgHooks['getUserPermissionsErrors'][] = static function ( $title, $user, $action, &$result ) {
    if ( $action !== 'read' ) {
        return true;
    }
    $services = \MediaWiki\MediaWikiServices::getInstance();
    $store = $services->getRestrictionStore();
    $rights = $services->getPermissionManager();
    foreach ( $store->getRestrictions( $title, 'read' ) as $level ) {
        $right = $level === 'sysop' ? 'protect' : $level;
        if ( $level !== '' && !$rights->userHasRight( $user, $right ) ) {
            $result = [ 'badaccess-group0' ];
            return false;
        }
    }
    return true;
};
$wgRCMaxAge = 30 * 24 * 3600;
$wgShowExceptionDetails = true;
"""


def missing() -> str | None:
    """What is missing to run a MediaWiki here, or None."""
    php = shutil.which("php")
    if php is None or not (INSTALL / "maintenance" / "install.php").is_file():
        return "no php or no MediaWiki install"
    modules = subprocess.run([php, "-m"], capture_output=True, text=True, timeout=60).stdout
    if "pdo_sqlite" not in modules.split():
        return "php has no pdo_sqlite"
    return None


def require() -> None:
    """Fail (or skip, when the switch says the MediaWiki tests are off) without MediaWiki."""
    problem = missing()
    if problem is None:
        return
    message = (
        f"{problem}: the MediaWiki tests need Debian's packages {PACKAGES}"
        f" (apt-get install --no-install-recommends {PACKAGES});"
        f" {ENV_SWITCH}=0 turns these tests off"
    )
    if os.environ.get(ENV_SWITCH) == "0":
        pytest.skip(message)
    pytest.fail(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Wiki:
    """A running wiki: its URL, its files, and an administrator's API session."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.root = folder / "mw"
        self.url = f"http://127.0.0.1:{port}"
        self.api = f"{self.url}/api.php"
        self.env = {
            **os.environ,
            "MW_INSTALL_PATH": str(self.root),
            "MW_CONFIG_FILE": str(self.root / "LocalSettings.php"),
        }
        self.admin = httpx.Client(timeout=CALL_SECONDS)
        self._token = ""

    def php(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            ["php", *args], cwd=self.root, env=self.env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    def dump(self, path: Path) -> Path:
        """``dumpBackup.php --current``: every page's current revision, as XML."""
        path.write_text(self.php("maintenance/dumpBackup.php", "--current", "--quiet"))
        return path

    def call(self, method: str, **params: str) -> dict[str, Any]:
        params = {"format": "json", "formatversion": "2", **params}
        if method == "GET":
            answer = self.admin.get(self.api, params=params)
        else:
            answer = self.admin.post(self.api, data=params)
        answer.raise_for_status()
        body: dict[str, Any] = answer.json()
        assert "error" not in body, body
        return body

    def login(self) -> None:
        token = self.call("GET", action="query", meta="tokens", type="login")
        done = self.call(
            "POST", action="clientlogin", username=ADMIN, password=PASSWORD,
            logintoken=token["query"]["tokens"]["logintoken"], loginreturnurl=self.url,
        )  # fmt: skip
        assert done["clientlogin"]["status"] == "PASS", done
        self._token = self.call("GET", action="query", meta="tokens")["query"]["tokens"][
            "csrftoken"
        ]

    def write(self, action: str, **params: str) -> dict[str, Any]:
        """An administrator's change (``edit``, ``move``, ``delete``, ``undelete``,
        ``protect``) with the session's CSRF token."""
        if not self._token:
            self.login()
        return self.call("POST", action=action, token=self._token, **params)

    def edit(self, title: str, text: str) -> None:
        done = self.write("edit", title=title, text=text, summary="kbgraph test")
        assert done["edit"]["result"] == "Success", done

    def newest_change(self) -> int:
        """The id of the newest recent change (the follower reads up to it)."""
        answer = self.call("GET", action="query", list="recentchanges", rcprop="ids", rclimit="1")
        changes = answer["query"]["recentchanges"]
        return int(changes[0]["rcid"]) if changes else 0


@contextmanager
def running_wiki(folder: Path) -> Iterator[Wiki]:
    """Install a wiki into ``folder`` and serve it with ``php -S`` until the block ends."""
    port = free_port()
    wiki = Wiki(folder, port)
    wiki.root.mkdir(parents=True)
    for entry in INSTALL.iterdir():
        if entry.name not in ("LocalSettings.php", "images", "cache"):
            (wiki.root / entry.name).symlink_to(entry)
    (wiki.root / "images").mkdir()
    data = folder / "data"
    data.mkdir()
    wiki.php(
        "maintenance/install.php", f"--confpath={wiki.root}", "--dbtype=sqlite",
        f"--dbpath={data}", "--dbname=wiki", f"--server={wiki.url}", "--scriptpath=",
        "--lang=en", f"--pass={PASSWORD}", "KbgraphWiki", ADMIN,
    )  # fmt: skip
    with (wiki.root / "LocalSettings.php").open("a") as settings:
        settings.write(SETTINGS)
    log = (folder / "php-server.log").open("wb")
    server = subprocess.Popen(
        ["php", "-S", f"127.0.0.1:{port}", "-t", str(wiki.root)],
        cwd=wiki.root, env=wiki.env, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert server.poll() is None, (folder / "php-server.log").read_text()[-2000:]
            try:
                answer = httpx.get(
                    wiki.api, params={"action": "query", "meta": "siteinfo", "format": "json"},
                    timeout=max(1.0, deadline - time.monotonic()),
                )  # fmt: skip
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"MediaWiki did not answer in {START_SECONDS} s"
            time.sleep(0.2)
        yield wiki
    finally:
        wiki.admin.close()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        log.close()
