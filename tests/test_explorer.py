"""The explorer page (issue 14) in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium) against a real ``kbgraph serve`` holding the example vault.

The page's list must equal the API's answer, a click on a node must show its text, a narrowed
token's page must never show a hidden title. Every wait is on a condition, never a sleep.
Screenshots go to a temp dir; ``KBGRAPH_UPDATE_SCREENSHOTS=1`` writes them to ``docs/`` for the
README and docs/agents.md instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kbgraph.names import collection_of
from kbgraph.store import Store
from tests import webhook_client as wc
from tests.support import ROOT, SECRET, bearer, start_server, stop

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ADMIN, NARROW = "explorer-admin-token", "explorer-network-token"
QUESTION = "how do I back up the photos from my phone"

if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    message = (
        "BROWSER TESTS SKIPPED: Debian's chromium and chromium-driver are not installed "
        "(scripts/setup.sh installs them with apt-get where it can)"
    )
    warnings.warn(message, stacklevel=1)
    print(f"\n*** {message} ***\n", file=sys.stderr)
    pytest.skip(message, allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service as DriverService  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("explorer")
    config = folder / "kbgraph.toml"
    config.write_text(
        f'[store]\npath = "kb.db"\n[webhooks]\nsecrets = ["{SECRET}"]\n'
        f'[[tokens]]\nname = "admin"\ntoken = "{ADMIN}"\nadmin = true\n'
        f'[[tokens]]\nname = "network"\ntoken = "{NARROW}"\n'
        'rules = [{ kb = "homelab", collections = ["network"] }]\n'
    )
    subprocess.run(
        [sys.executable, "-m", "kbgraph", "import", str(ROOT / "examples" / "vault"),
         "--kb", "homelab", "--config", str(config), "--manifest", str(folder / "m.sqlite"),
         "--quiet"],
        check=True, cwd=ROOT, capture_output=True, timeout=120,
    )  # fmt: skip
    proc = start_server(config)
    try:
        yield proc.url, folder / "kb.db"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,800"):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=DriverService(CHROMEDRIVER), options=options)
    try:
        set_viewport(driver, 1280, 800)
        yield driver
    finally:
        driver.quit()


def set_viewport(driver: webdriver.Chrome, width: int, height: int) -> None:
    """The page's own size, set through the DevTools protocol's device metrics: sizing the
    window instead left the page whatever the headless browser made of it (once 657 px high
    for an 800 px window), and a resize reaches the page asynchronously."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    wait(
        driver,
        lambda d: (
            d.execute_script("return [window.innerWidth, window.innerHeight]") == [width, height]
        ),
    )


def wait(driver: webdriver.Chrome, condition, seconds: float = 20):
    return WebDriverWait(driver, seconds).until(lambda d: condition(d))


def open_page(driver: webdriver.Chrome, base: str, token: str) -> None:
    driver.get(f"{base}/ui")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{base}/ui")
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token, Keys.ENTER)
    wait(driver, lambda d: not d.find_element(By.ID, "kb").get_property("disabled"))


def ask(driver: webdriver.Chrome, question: str) -> list[dict]:
    renders = "return document.getElementById('answer').dataset.renders || '0'"
    before = driver.execute_script(renders)
    box = driver.find_element(By.ID, "query")
    box.clear()
    box.send_keys(question, Keys.ENTER)
    wait(driver, lambda d: d.execute_script(renders) != before)
    return driver.execute_script(
        "return [...document.querySelectorAll('#answer li')].map(li => ({"
        " id: li.dataset.id, kind: li.dataset.kind,"
        " title: li.querySelector('.title').textContent,"
        " meta: li.querySelector('.meta').textContent}))"
    )


def shown_in_full(driver: webdriver.Chrome, concept_id: str) -> None:
    """Waits until the detail panel shows the concept: text, links and link suggestions."""
    wait(driver, lambda d: d.find_element(By.ID, "detail").get_attribute("data-id") == concept_id)


def api(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    headers = bearer(token)
    return httpx.request(method, f"{base}{path}", headers=headers, json=body).json()


def test_the_page_is_self_contained_and_strict(served: tuple[str, Path]) -> None:
    base, _ = served
    page = httpx.get(f"{base}/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "http" not in page.text.replace("http-equiv", "")  # no outside URL at all
    licence = httpx.get(f"{base}/ui/static/vendor/cytoscape.LICENSE")
    assert licence.status_code == 200 and "Cytoscape Consortium" in licence.text
    assert httpx.get(f"{base}/ui/static/../config.py").status_code == 404


def test_the_list_equals_the_api_answer(browser: webdriver.Chrome, served: tuple) -> None:
    base, _ = served
    open_page(browser, base, ADMIN)
    limit = browser.find_element(By.ID, "limit")
    limit.clear()
    limit.send_keys("30")  # past the seeds: results come into the list too
    listed = ask(browser, QUESTION)
    body = {"query": QUESTION, "limit": 30}
    answer = api(base, ADMIN, "POST", "/v1/kbs/homelab/tools/graph_context", body)
    # the list is `ranked`, what an agent reads: seeds (hops 0) and results in one order
    expected = [("seed" if r["hops"] == 0 else "result", r) for r in answer["ranked"]]
    assert len(listed) == len(expected) >= 6
    assert {kind for kind, _ in expected} == {"seed", "result"}
    for row, (kind, item) in zip(listed, expected, strict=True):
        assert (row["id"], row["kind"], row["title"]) == (item["id"], kind, item["title"])
        assert row["meta"].startswith(f"score {item['score']:.4f}")
        if kind == "result":
            assert f"hops {item['hops']} · via {item['via']}" in row["meta"]
    labels = browser.execute_script(
        "return window.kbgraphExplorer.cy.nodes().map(n => [n.id(), n.data('label')])"
    )
    drawn = dict(labels)
    for _, item in expected:  # every seed and result is drawn, labelled with its title
        assert drawn[item["id"]] == item["title"]
    shot = screenshot_path("explorer.png")
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe  # no CSP violation, no failed request


def test_search_by_each_mode_lists_the_api_hits(browser: webdriver.Chrome, served: tuple) -> None:
    base, _ = served
    open_page(browser, base, ADMIN)
    renders = "return document.getElementById('answer').dataset.renders || '0'"
    box = browser.find_element(By.ID, "query")
    box.clear()
    box.send_keys(QUESTION)
    for mode in ("lexical", "vector", "hybrid"):
        Select(browser.find_element(By.ID, "mode")).select_by_value(mode)
        before = browser.execute_script(renders)
        browser.find_element(By.ID, "search-button").click()
        wait(browser, lambda d, before=before: d.execute_script(renders) != before)
        listed = browser.execute_script(
            "return [...document.querySelectorAll('#answer li')].map(li => li.dataset.id)"
        )
        query = httpx.QueryParams({"q": QUESTION, "limit": 10, "mode": mode})
        hits = api(base, ADMIN, "GET", f"/v1/kbs/homelab/search?{query}")["hits"]
        assert listed == [hit["id"] for hit in hits] and listed, mode


def test_clicking_a_node_shows_its_text(browser: webdriver.Chrome, served: tuple) -> None:
    base, _ = served
    open_page(browser, base, ADMIN)
    listed = ask(browser, QUESTION)
    target = listed[-1]["id"]
    x, y = browser.execute_script(
        "const p = window.kbgraphExplorer.cy.getElementById(arguments[0]).renderedPosition();"
        "return [p.x, p.y];",
        target,
    )
    graph = browser.find_element(By.ID, "graph")
    size = graph.size
    ActionChains(browser).move_to_element_with_offset(
        graph, int(x - size["width"] / 2), int(y - size["height"] / 2)
    ).click().perform()
    concept = api(base, ADMIN, "GET", f"/v1/kbs/homelab/concepts/{target}")
    wait(browser, lambda d: d.find_element(By.ID, "detail-title").text == concept["title"])
    assert browser.find_element(By.ID, "detail-text").text.strip() == concept["text"].strip()
    backlinks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#detail-backlinks button")]
    assert backlinks == concept["backlinks"]


def test_keyboard_path_and_suggestions(browser: webdriver.Chrome, served: tuple) -> None:
    base, _ = served
    open_page(browser, base, ADMIN)
    listed = ask(browser, QUESTION)
    first, last = listed[0]["id"], listed[-1]["id"]
    button = browser.find_element(By.CSS_SELECTOR, f"#answer li[data-id='{first}'] button")
    button.send_keys(Keys.ENTER)  # a list item is a button: Enter opens it
    wait(browser, lambda d: d.find_element(By.ID, "detail-title").text == listed[0]["title"])
    suggested = api(base, ADMIN, "POST", "/v1/kbs/homelab/tools/link_suggest", {"id": first})
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#detail-suggestions li"))
         == max(1, len(suggested["candidates"])))  # fmt: skip
    browser.find_element(By.ID, "path-from").send_keys(Keys.ENTER)
    browser.find_element(By.CSS_SELECTOR, f"#answer li[data-id='{last}'] button").send_keys(
        Keys.ENTER
    )
    wait(browser, lambda d: d.find_element(By.ID, "path-to").is_enabled())
    browser.find_element(By.ID, "path-to").send_keys(Keys.ENTER)
    path = api(base, ADMIN, "POST", "/v1/kbs/homelab/tools/graph_path",
               {"source": first, "target": last})  # fmt: skip
    names = " → ".join(step["title"] or step["id"] for step in path["path"])
    wait(browser, lambda d: d.find_element(By.ID, "path-result").text.startswith(names))
    highlighted = browser.execute_script(
        "return window.kbgraphExplorer.cy.nodes('.path').map(n => n.id()).sort()"
    )
    assert highlighted == sorted(step["id"] for step in path["path"])


def test_api_errors_are_shown_as_the_api_says(browser: webdriver.Chrome, served: tuple) -> None:
    base, _ = served
    browser.get(f"{base}/ui")
    browser.execute_script("sessionStorage.clear()")
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys("not-a-token", Keys.ENTER)
    wait(browser, lambda d: d.find_element(By.ID, "error").is_displayed())
    assert browser.find_element(By.ID, "error").text == "missing or unknown bearer token"


# Everything the page shows as text except a visible concept's own words (its text and the
# snippets cut from it, which may name anything the author wrote), and every concept it draws.
SHOWN_JS = """
const copy = document.body.cloneNode(true);
for (const e of copy.querySelectorAll('#detail-text, .snippet')) e.remove();
const cy = window.kbgraphExplorer.cy;
return {
  text: copy.textContent,
  ids: [...document.querySelectorAll('[data-id]')].map(e => e.dataset.id),
  nodes: cy ? cy.nodes().map(n => [n.id(), n.data('label')]) : [],
};
"""


def assert_nothing_hidden(driver: webdriver.Chrome, hidden: dict[str, str]) -> set[str]:
    """No hidden concept's title or id in the page's text, its list or its graph; returns the
    concept ids the graph draws."""
    shown = driver.execute_script(SHOWN_JS)
    for node_id, node_label in shown["nodes"]:
        assert node_id not in hidden and node_label not in hidden.values(), node_id
    assert not set(shown["ids"]) & hidden.keys()
    for concept_id, title in hidden.items():
        for word in {concept_id, title}:
            assert not re.search(rf"(?<!\w){re.escape(word)}(?!\w)", shown["text"]), word
    return {node_id for node_id, _ in shown["nodes"]}


def test_a_narrowed_page_never_shows_a_hidden_title(
    browser: webdriver.Chrome, served: tuple
) -> None:
    base, db = served
    with Store(db, read_only=True) as store:
        concepts = store.load().kbs["homelab"].concepts
    visible = {c.id: c.title or c.id for c in concepts if collection_of(c.id) == "network"}
    hidden = {c.id: c.title or c.id for c in concepts if c.id not in visible}
    assert len(hidden) > 40 and visible
    assert not set(hidden.values()) & set(visible.values())
    open_page(browser, base, NARROW)
    kbs = browser.find_element(By.ID, "kb").text
    assert kbs.startswith("homelab (") and f"({len(visible)} concepts" in kbs
    drawn: set[str] = set()
    for question in (QUESTION, "dns router wifi vpn", "backup restore photos immich"):
        listed = ask(browser, question)
        drawn |= assert_nothing_hidden(browser, hidden)
        for row in listed[:3]:
            item = f"#answer li[data-id='{row['id']}'] button"
            browser.find_element(By.CSS_SELECTOR, item).click()
            shown_in_full(browser, row["id"])
            assert_nothing_hidden(browser, hidden)
    assert drawn and drawn <= visible.keys()  # it showed something, all of it visible
    set_viewport(browser, 420, 900)  # readable on a narrow window
    shot = screenshot_path("explorer-narrow.png")
    browser.save_screenshot(str(shot))
    set_viewport(browser, 1280, 800)
    assert shot.stat().st_size > 10_000


def test_the_page_follows_the_kb(browser: webdriver.Chrome, served: tuple) -> None:
    base, _ = served
    open_page(browser, base, ADMIN)
    ask(browser, "zeppelin hangar")
    assert browser.find_elements(By.CSS_SELECTOR, "#answer li") == []
    event = wc.upsert("services/Zeppelin hangar", title="Zeppelin hangar",
                      text="Where the zeppelin sleeps.")  # fmt: skip
    body, headers = wc.delivery(SECRET, [event])
    assert httpx.post(f"{base}/v1/kbs/homelab/events", content=body,
                      headers=headers).status_code == 200  # fmt: skip
    wait(browser, lambda d: [e.get_attribute("data-id") for e in
                             d.find_elements(By.CSS_SELECTOR, "#answer li")][:1]
         == ["services/Zeppelin hangar"], seconds=30)  # fmt: skip


def screenshot_path(name: str) -> Path:
    if os.environ.get("KBGRAPH_UPDATE_SCREENSHOTS") == "1":
        return ROOT / "docs" / name
    folder = Path(os.environ.get("PYTEST_SCREENSHOT_DIR", "/tmp")) / "kbgraph-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / name, ignore_errors=True)
    return folder / name


def test_dot_segments_in_an_id_never_leave_the_kb(browser: webdriver.Chrome, served: tuple) -> None:
    """An id that climbs out of its path ("x/../../../elsewhere/concepts/c") is fetched as
    itself, never as another KB's concept the browser's ".." handling would reach."""
    base, _ = served
    climbing = "x/../../../elsewhere/concepts/c"
    for kb, cid, title in (("homelab", climbing, "Climber"), ("elsewhere", "c", "Elsewhere")):
        body, headers = wc.delivery(SECRET, [wc.upsert(cid, title=title)])
        sent = httpx.post(f"{base}/v1/kbs/{kb}/events", content=body, headers=headers)
        assert sent.status_code == 200
    open_page(browser, base, ADMIN)
    fetched = browser.execute_async_script(
        """const [id, token, done] = arguments;
        window.kbgraphExplorer.state.kb = "homelab";
        const path = window.kbgraphExplorer.conceptPath(id);
        fetch(path, { headers: { Authorization: `Bearer ${token}`, "X-Min-Seq": "1" } })
          .then((r) => r.json()).then((data) => done([path, data]));""",
        climbing,
        ADMIN,
    )
    path, data = fetched
    assert path == "/v1/kbs/homelab/concepts/x%2F..%2F..%2F..%2Felsewhere%2Fconcepts%2Fc"
    assert (data["id"], data["title"]) == (climbing, "Climber")
    for alone in (".", ".."):
        refused = browser.execute_script(
            "try { window.kbgraphExplorer.conceptPath(arguments[0]); return null; }"
            " catch (e) { return e.message; }",
            alone,
        )
        assert refused == f'concept id "{alone}" cannot be opened here'


def test_an_imported_logseq_graph_is_shown(browser: webdriver.Chrome, served: tuple) -> None:
    """Issue 39: the example Logseq graph imported beside the vault, as KB ``lab``; its
    namespaced pages (``Network/Router``) are listed, drawn and opened by their names."""
    base, db = served
    subprocess.run(
        [sys.executable, "-m", "kbgraph", "import", str(ROOT / "examples" / "logseq"),
         "--kb", "lab", "--config", str(db.parent / "kbgraph.toml"),
         "--manifest", str(db.parent / "lab.sqlite"), "--quiet"],
        check=True, cwd=ROOT, capture_output=True, timeout=120,
    )  # fmt: skip
    open_page(browser, base, ADMIN)
    wait(browser, lambda d: "lab (" in d.find_element(By.ID, "kb").text, seconds=30)
    Select(browser.find_element(By.ID, "kb")).select_by_value("lab")
    wait(browser, lambda d: d.execute_script("return window.kbgraphExplorer.state.kb") == "lab")
    listed = ask(browser, "DHCP firewall")
    first = [(row["id"], row["title"]) for row in listed][:1]
    assert first == [("Network/Router", "Network/Router")]
    browser.find_element(By.CSS_SELECTOR, "#answer li[data-id='Network/Router'] button").click()
    shown_in_full(browser, "Network/Router")
    concept = api(base, ADMIN, "GET", "/v1/kbs/lab/concepts/Network%2FRouter")
    assert browser.find_element(By.ID, "detail-title").text == "Network/Router"
    backlinks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#detail-backlinks button")]
    assert backlinks == concept["backlinks"] and "Home Lab" in backlinks
    drawn = browser.execute_script("return window.kbgraphExplorer.cy.nodes().map((n) => n.id())")
    assert "Network/Router" in drawn
