"""The web console (``bulldozer ui``) in a real browser: headless Chromium driven through
WebDriver lists aliases, opens a version, looks a key up and rolls back, and the page shows
what the DAL holds. Cross-site and token-less actions are refused; user data is escaped."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bulldozer.names import short_version
from bulldozer.warehouse.sample import create_sample_warehouse, overwrite_sample
from tests.conftest import REPO
from tests.integration.services import chromedriver
from tests.integration.test_run import KEY, table
from tests.integration.test_run import _cli as run_cli

pytestmark = pytest.mark.integration

ARTIFACTS = REPO / "build" / "test-artifacts"
SECRET = "tok-3f9a-never-shown"


def _cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(list(args), home, env)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two versions of user_item_scores (v2 live) and ``bulldozer ui`` serving them."""
    home = tmp_path_factory.mktemp("console")
    create_sample_warehouse(home, rows=1_500)
    runs = []
    template = REPO / "templates" / "move_data_to_kv_dal.yaml"
    spec = home / "delta.yaml"  # v2: a delta from v1, compared with it before its flip
    spec.write_text(
        template.read_text()
        .replace("  quality_gates:", "  shadow_read: {sample: 500, seed: 1, examples: 1}\n  quality_gates:")
        .replace("  duplicate_keys: fail", "  mode: delta\n  duplicate_keys: fail")
    )
    for variant in (None, 1):
        if variant is not None:
            overwrite_sample(table(home), rows=1_500, variant=variant)
        result = _cli(home, "run", str(spec), "--json")
        assert result.returncode == 0, result.stderr
        runs.append(json.loads(result.stdout)["version"])
    # the store served with authentication: the console acts with the operator's token
    auth, port_file = home / "auth.json", home / "dal.port"
    token_sha256 = hashlib.sha256(SECRET.encode()).hexdigest()
    auth.write_text(
        json.dumps({"principals": {"ops": {"token_sha256": token_sha256, "permissions": {"*": ["admin"]}}}})
    )
    dal = subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", "serve", "--path", str(home / "kv"), "--port", "0",
         "--port-file", str(port_file), "--auth-config", str(auth)],
        stderr=subprocess.DEVNULL, env={**os.environ, "BULLDOZER_HOME": str(home)}, cwd=REPO,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert dal.poll() is None and time.monotonic() < deadline, "the DAL did not start"
        time.sleep(0.05)
    env = {"BULLDOZER_ENDPOINT": f"127.0.0.1:{port_file.read_text().strip()}", "BULLDOZER_TOKEN": SECRET}
    server = subprocess.Popen(
        [sys.executable, "-m", "bulldozer.cli.main", "ui", "--port", "0", "--token", SECRET,
         "--endpoint", env["BULLDOZER_ENDPOINT"]],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "BULLDOZER_HOME": str(home)}, cwd=REPO,
    )  # fmt: skip
    assert server.stderr is not None
    url = ""
    for line in server.stderr:
        m = re.search(r"console: (http://\S+/)", line)
        if m:
            url = m.group(1)
            break
    assert url, "bulldozer ui did not say where it listens"
    try:
        yield {"home": home, "url": url, "v1": runs[0], "v2": runs[1], "env": env}
    finally:
        dal.terminate()
        dal.wait(timeout=30)
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
    ):
        options.add_argument(flag)
    # Chromium's profile and its singleton socket folder go under the test's temporary folder,
    # not /tmp (each run left an org.chromium.Chromium.* folder there)
    scratch = tmp_path_factory.mktemp("chromium")
    options.add_argument(f"--user-data-dir={scratch / 'profile'}")
    service = Service(chromedriver(), env={**os.environ, "TMPDIR": str(scratch)})
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _then_loaded(browser: Any, action: Callable[[], object]) -> None:
    """Do ``action`` (a click, a navigation) and wait until the page it leads to has loaded.

    The old page is marked with a window property; the wait ends when a window without it has
    finished loading. (Waiting for the old root element to go stale raced Chrome's own detaching
    of the node: "Node with given id does not belong to the document".)"""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_script("window.__bulldozerOldPage = true")
    action()
    WebDriverWait(browser, 30, ignored_exceptions=(WebDriverException,)).until(
        lambda b: b.execute_script(
            "return window.__bulldozerOldPage === undefined && document.readyState === 'complete'"
        )
    )


def test_list_open_look_up_and_roll_back_in_a_browser(console: dict[str, Any], browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    v1, v2 = console["v1"], console["v2"]
    browser.get(console["url"])
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-alias="user_item_scores"]')
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == "user_item_scores" and cells[1] == short_version(v2) and cells[3] == "1,500"

    _then_loaded(browser, row.find_element(By.LINK_TEXT, "user_item_scores").click)
    states = {
        tr.get_attribute("data-version"): tr.find_elements(By.TAG_NAME, "td")[1].text
        for tr in browser.find_elements(By.CSS_SELECTOR, "#versions tbody tr")
    }
    assert states == {v2: "ACTIVE", v1: "RETIRED"}
    assert browser.find_element(By.ID, "live").text.startswith(f"live: {short_version(v2)}")

    _then_loaded(browser, browser.find_element(By.LINK_TEXT, short_version(v2)).click)
    assert browser.find_element(By.ID, "state").text.startswith("ACTIVE")
    assert browser.find_element(By.ID, "records").text == "1,500"
    assert "message ValueMessage" in browser.find_element(By.ID, "proto").text
    stages = [
        tr.find_element(By.TAG_NAME, "td").text for tr in browser.find_elements(By.CSS_SELECTOR, "#stages tr")[1:]
    ]
    assert "load" in stages and "flip" in stages
    shadow = browser.find_element(By.ID, "shadow-read").text
    assert shadow.startswith(f"500 sampled keys vs {v1}") and "100.0% of the rest changed" in shadow
    example = browser.find_elements(By.CSS_SELECTOR, "#shadow-examples tbody tr")[0].find_elements(By.TAG_NAME, "td")
    assert example[0].text == "changed" and "price" in example[2].text and "→" in example[2].text
    assert browser.find_element(By.ID, "delta").text.startswith(f"a delta from {v1}")

    browser.find_element(By.ID, "lookup-key").send_keys(json.dumps(KEY))
    _then_loaded(browser, browser.find_element(By.ID, "lookup-submit").click)
    value = json.loads(browser.find_element(By.ID, "lookup-value").text)
    cli = _cli(
        console["home"], "get", f"user_item_scores@{short_version(v2)}", "--key", json.dumps(KEY), env=console["env"]
    )
    assert value == json.loads(cli.stdout)  # the page shows what `get` prints: readable values
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", value["signup_date"])

    key = browser.find_element(By.ID, "lookup-key")
    key.clear()
    key.send_keys('{"user_id": 1')
    _then_loaded(browser, browser.find_element(By.ID, "lookup-submit").click)
    assert browser.find_element(By.ID, "lookup-error").text.startswith("the key is not JSON")

    _then_loaded(browser, lambda: browser.get(console["url"] + "a/user_item_scores"))
    hostile = '<img src=x onerror="document.title=1">bad prices'
    browser.find_element(By.ID, "rollback-reason").send_keys(hostile)
    browser.find_element(By.ID, "rollback-confirm").send_keys("wrong")
    _then_loaded(browser, browser.find_element(By.ID, "rollback-submit").click)
    assert "type the alias name" in browser.find_element(By.ID, "error").text  # refused, nothing moved

    _then_loaded(browser, lambda: browser.get(console["url"] + "a/user_item_scores"))
    Select(browser.find_element(By.ID, "rollback-to")).select_by_value(v1)
    browser.find_element(By.ID, "rollback-reason").send_keys(hostile)
    browser.find_element(By.ID, "rollback-confirm").send_keys("user_item_scores")
    _then_loaded(browser, browser.find_element(By.ID, "rollback-submit").click)
    notice = browser.find_elements(By.ID, "notice")
    assert notice, browser.find_element(By.TAG_NAME, "main").text  # the page says why when it did not roll back
    assert notice[0].text == f"rolled back user_item_scores: {v2} → {v1}"
    assert browser.find_element(By.ID, "live").text.startswith(f"live: {short_version(v1)}")
    newest = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")[0].find_elements(By.TAG_NAME, "td")
    assert newest[5].text == hostile and browser.title.endswith("Bulldozer console")  # shown as text, not run
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "console-after-rollback.png"))

    shown = json.loads(_cli(console["home"], "alias", "show", "user_item_scores", "--json", env=console["env"]).stdout)
    assert shown["namespace"] == v1  # the DAL agrees with the page
    assert SECRET not in browser.page_source


def test_cross_site_and_token_less_actions_are_refused(console: dict[str, Any]) -> None:
    url = console["url"]
    with httpx.Client(base_url=url, timeout=30) as http:
        page = http.get("a/user_item_scores")
        assert (
            page.headers["x-frame-options"] == "DENY"
            and "frame-ancestors 'none'" in page.headers["content-security-policy"]
        )
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token and SECRET not in page.text
        form = {"csrf": token.group(1), "confirm": "yes", "pinned": "true"}
        evil = http.post("a/user_item_scores/pin", data=form, headers={"Origin": "http://evil.example"})
        assert evil.status_code == 403 and "cross-site" in evil.text
        site = http.post("a/user_item_scores/pin", data=form, headers={"Sec-Fetch-Site": "cross-site"})
        assert site.status_code == 403
        missing = http.post("a/user_item_scores/pin", data={**form, "csrf": "forged"})
        assert missing.status_code == 403 and "token" in missing.text
        # DNS rebinding: a page of evil.example whose name now points at this machine is, to the
        # browser, same-origin with itself; its requests name its own host, which is refused
        port = url.rstrip("/").rsplit(":", 1)[1]
        rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        assert http.get("a/user_item_scores", headers={"Host": rebound["Host"]}).status_code == 400
        assert http.post("a/user_item_scores/pin", data=form, headers=rebound).status_code == 400
        assert http.get("a/user_item_scores", headers={"Host": f"localhost:{port}"}).status_code == 200
        shown = json.loads(
            _cli(console["home"], "alias", "show", "user_item_scores", "--json", env=console["env"]).stdout
        )
        assert shown["pinned"] is False  # none of them pinned it
        ok = http.post("a/user_item_scores/pin", data=form, headers={"Origin": url.rstrip("/")})
        assert ok.status_code == 303
        shown = json.loads(
            _cli(console["home"], "alias", "show", "user_item_scores", "--json", env=console["env"]).stdout
        )
        assert shown["pinned"] is True
        spoofed = http.get("a/user_item_scores", params={"done": "call +1 555 to restore service", "sig": "0" * 32})
        assert "call +1 555" not in spoofed.text  # only the console's own signed notices are shown
        unknown = http.get("a/no_such_alias")
        assert unknown.status_code == 404 and "does not point at any version" in unknown.text
        bad = http.get("a/user_item_scores/v/zz")
        assert bad.status_code == 404 and "4 characters or more" in bad.text
        deep = http.get(f"a/user_item_scores/v/{shown['namespace']}", params={"key": "[" * 5_000})
        assert deep.status_code == 200 and "the key is nested too deeply to be a key" in deep.text


def test_a_version_whose_stored_parts_do_not_read_is_a_page_saying_so() -> None:
    """A version another tool made (or an older DAL took) whose stored schema does not load
    made its page fail with a 500; a run record whose gate lacks a field made the alias's
    page fail too (the templates are strict). The version's page says what is wrong, and the
    alias's shows the version without the record."""
    from starlette.testclient import TestClient

    from bulldozer.console.app import create_app
    from bulldozer.kv import KvClient, KvDal, create_engine
    from bulldozer.kv.types import NamespaceRecord

    engine = create_engine({"type": "memory"})
    client = KvClient.in_process(KvDal(engine))
    # past the DAL's rules, as a store another tool wrote holds it
    engine.create_namespace(
        NamespaceRecord(
            name="x__v1", alias="x", value_descriptor_set=b"garbage", key_message="a.K", value_message="a.V"
        )
    )
    client.seal("x__v1", 0, 0)
    client.compare_and_set_alias("x", "", "x__v1")
    run = {"run_id": "r", "job": "x", "alias": "x", "outcome": "succeeded", "gates": [{"gate": "min_rows"}]}
    client.set_labels("x__v1", {"bulldozer.run": json.dumps(run)})
    pages = TestClient(create_app(client), base_url="http://127.0.0.1")
    version = pages.get("/a/x/v/x__v1")
    assert version.status_code == 400, version.text
    assert "the version&#39;s stored schema cannot be read: it does not parse as a protobuf" in version.text
    alias = pages.get("/a/x")
    assert alias.status_code == 200 and "x__v1" in alias.text
