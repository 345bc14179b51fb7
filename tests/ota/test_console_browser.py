"""The operator console in a real browser: Debian's chromium through chromedriver, against a real server, mosquitto
and agents. Screenshots of every page go to the test's directory (and to ``$EDGESDK_SCREENSHOTS`` when set: see
scripts/console_screenshot.sh, which refreshes the README's)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import cli
from edgesdk.ota_server.console.display import board
from edgesdk.ota_server.store.fleet_db import DeviceState
from tests.ota.conftest import wait_for
from tests.ota.console_client import TOKEN

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: Every visible form control must have a label: <label for>, a wrapping <label>, or aria-label(ledby).
UNLABELLED = """
return Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea')).filter(function (c) {
  return !(c.labels && c.labels.length) && !c.getAttribute('aria-label') && !c.getAttribute('aria-labelledby');
}).map(function (c) { return c.outerHTML; });"""
#: Wider than the window means the page scrolls sideways (tables scroll inside their own box instead).
OVERFLOW = "return document.documentElement.scrollWidth - window.innerWidth;"


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    assert not missing, f"{missing} missing: scripts/setup.sh installs chromium and chromium-driver (as root)"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
                              options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


class Shots:
    """Saves screenshots into the test's directory and, with ``$EDGESDK_SCREENSHOTS``, into that folder too."""

    def __init__(self, driver, folder: Path) -> None:
        self.driver, self.folder = driver, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.taken: list[Path] = []

    def __call__(self, name: str) -> None:
        path = self.folder / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), name
        self.taken.append(path)
        extra = os.environ.get("EDGESDK_SCREENSHOTS")
        if extra:
            Path(extra).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(extra) / path.name)


def text_of(driver, selector: str) -> str:
    """The element's text read in one script call (the live view replaces rows; a held element goes stale)."""
    return driver.execute_script("var e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
                                 selector)


def accessible(driver, page: str) -> None:
    assert driver.execute_script(UNLABELLED) == [], f"unlabelled form controls on {page}"


def test_an_operator_logs_in_watches_a_rollout_live_and_aborts_it(console_fleet, browser, bundles, tmp_path):
    from selenium.webdriver.common.by import By

    running, agents = console_fleet
    server, base = running.ota, running.url
    shots = Shots(browser, tmp_path / "screenshots")
    # A device whose agent said its board (as a state report carries "profile" and "arch"), in a group of its own.
    server.db.upsert_devices([DeviceState("pi5", "yard", "online", "digits", "1.0.0", (), time.time(),
                                          profile="raspberry-pi-5", arch="aarch64")])

    # A wrong token is refused, the right one opens the fleet.
    browser.get(f"{base}/ui/")
    assert browser.current_url.endswith("/ui/login")
    accessible(browser, "login")
    browser.find_element(By.ID, "token").send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for(lambda: "wrong or missing admin token" in text_of(browser, "[role=alert]"), timeout=10,
             what="the refusal")
    shots("login-refused")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()
    wait_for(lambda: browser.current_url.endswith("/ui/"), timeout=10, what="the fleet page")
    rows = browser.find_elements(By.CSS_SELECTOR, "section[aria-labelledby=devices-heading] tbody tr")
    assert sorted(r.find_element(By.TAG_NAME, "a").text for r in rows) == ["cam0", "cam1", "cam2", "door", "pi5"]
    headings = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "section[aria-labelledby=devices-heading] th")]
    assert headings[3] == "Board" and text_of(browser, "tr[data-device='pi5'] td.board") == "raspberry-pi-5 (aarch64)"
    for cam in ("cam0", "cam1", "cam2"):  # real agents: the board they report, or "unknown" from an agent that does not
        found = server.db.device(cam)
        assert text_of(browser, f"tr[data-device='{cam}'] td.board") == board(found.profile, found.arch)
    accessible(browser, "fleet")
    shots("fleet")

    # One device.
    browser.find_element(By.LINK_TEXT, "cam1").click()
    wait_for(lambda: "Device cam1" in text_of(browser, "h1"), timeout=10, what="the device page")
    assert "digits 1.0.0" in browser.page_source
    shots("device")

    # A rollout started from the command line, watched without a reload.
    pushed = CliRunner().invoke(cli, ["push", str(bundles["2.0.0"]), "--group", "cams", "--no-analysis", "--canary", "30%",
                                      "--waves", "60,100", "--manual", "--health-window", "0s", "--server", base,
                                      "--token", TOKEN, "--json"], catch_exceptions=False)
    assert pushed.exit_code == 0, pushed.output
    rollout = json.loads(pushed.stdout)["id"]
    browser.get(f"{base}/ui/rollouts/{rollout}")
    committed = "#stages tr[data-stage='0'] .done"
    wait_for(lambda: text_of(browser, committed).strip() == "1", timeout=60,
             what="the canary committed on the open page")
    assert text_of(browser, "#stages tr[data-stage='0'] td").strip() == "1 of 3 (canary)"
    # The canary's verdict, with figures as the analysis stores them (whether or not the engine judged it already:
    # a stored verdict for the stage is the one the engine keeps), and the manual rollout waits for promote.
    verdict = {"stage": 1, "version": "2.0.0", "passed": True, "reason": "canary p99 6.1 ms within 1.5x of 5.4 ms",
               "canary": {"devices": 1, "p99_ms": 6.1, "error_rate": 0.0},
               "baseline": {"devices": 2, "p99_ms": 5.4, "error_rate": 0.01, "source": "live"},
               "checks": [{"name": "p99_ratio", "value": 1.13, "canary": 6.1, "baseline": 5.4, "limit": 1.5,
                           "passed": True}], "limits": {"max_p99_ratio": 1.5}}
    assert server.db.set_verdict(rollout, 0, verdict, None)
    wait_for(lambda: server.status(rollout, targets=False).phase == "waiting_for_promote", timeout=10,
             what="waiting for promote")
    browser.get(f"{base}/ui/rollouts/{rollout}")
    assert text_of(browser, "#verdict-result") == "passed" and text_of(browser, "#verdict-reason") == verdict["reason"]
    figures = browser.execute_script("""return Array.from(document.querySelectorAll('#verdict-figures tbody tr'))
        .map(function (r) { return Array.from(r.cells).map(function (c) { return c.textContent; }); });""")
    assert ["p99_ms", "6.1", "5.4"] in figures and ["error_rate", "0", "0.01"] in figures
    assert browser.find_element(By.ID, "phase").is_displayed() and text_of(browser, "#phase") == "waiting for promote"
    shots("rollout-verdict")
    browser.execute_script("window.notReloaded = true;")
    promoted = time.monotonic()
    result = CliRunner().invoke(cli, ["rollout", "promote", rollout, "--server", base, "--token", TOKEN])
    assert result.exit_code == 0, result.output
    wait_for(lambda: "not sent" not in text_of(browser, "#stages tr[data-stage='1']"),
             timeout=10, what="stage 2 shown as sent")
    assert text_of(browser, "#stages tr[data-stage='1'] td").strip() == "2 of 3"
    # The live view follows the phase: waiting for promote again once stage 2 passes its own analysis.
    wait_for(lambda: browser.find_element(By.ID, "phase").is_displayed()
             == (server.status(rollout, targets=False).phase == "waiting_for_promote"), timeout=10,
             what="the phase shown as the server has it")
    # Read in one script call: the live view replaces the note, so a held element can go stale.
    stamp, title, shown = browser.execute_script(
        "var t = document.querySelector('#live-note time');"
        " return t ? [t.getAttribute('datetime'), t.getAttribute('title'), t.textContent] : [null, null, ''];")
    assert stamp is not None and stamp == title
    assert shown.endswith(" s ago") and stamp.endswith("Z")
    print(f"stage change shown {time.monotonic() - promoted:.2f} s after the promote command returned")
    assert browser.execute_script("return window.notReloaded === true;"), "the page reloaded"
    wait_for(lambda: "updated" in text_of(browser, "#live-note"), timeout=10, what="the live view's render to finish")
    assert text_of(browser, "#deferred") == "0" and text_of(browser, "#late") == "none"
    accessible(browser, "rollout")
    shots("rollout-live")

    # A forged POST (a form without the CSRF token, as another page would send) is refused.
    browser.execute_script("""
        var form = document.createElement('form'); form.method = 'post';
        form.action = arguments[0]; var confirm = document.createElement('input');
        confirm.type = 'hidden'; confirm.name = 'confirm'; confirm.value = 'yes'; form.appendChild(confirm);
        document.body.appendChild(form); form.submit();""", f"{base}/ui/rollouts/{rollout}/abort")
    wait_for(lambda: "CSRF" in browser.page_source, timeout=10, what="the refusal page")
    assert server.status(rollout, targets=False).state == "running"

    # Abort from the console: a confirmation, then the devices go back.
    browser.get(f"{base}/ui/rollouts/{rollout}")
    browser.find_element(By.CSS_SELECTOR, "button.abort").click()
    wait_for(lambda: "Abort rollout" in text_of(browser, "h1"), timeout=10, what="the confirmation page")
    accessible(browser, "confirm")
    shots("confirm-abort")
    browser.find_element(By.XPATH, "//button[contains(., 'Yes, abort')]").click()
    wait_for(lambda: text_of(browser, "#state") == "aborted", timeout=10, what="aborted shown")
    wait_for(lambda: all(a.current_version() == ("digits", "1.0.0") for a in agents), timeout=90,
             what="every device back on 1.0.0")
    shots("rollout-aborted")
    assert text_of(browser, "#stages tr[data-stage='2'] td").strip() == "3 of 3 (never sent)"
    assert not browser.find_elements(By.CSS_SELECTOR, "button.rollback")  # the abort already sent the devices back
    assert "No rollback" in text_of(browser, "#no-rollback")
    assert not browser.find_element(By.ID, "phase").is_displayed()  # an aborted rollout waits for nothing

    browser.get(f"{base}/ui/repository")
    accessible(browser, "repository")
    shots("repository")
    browser.find_element(By.LINK_TEXT, "Groups").click()
    wait_for(lambda: "Groups" in text_of(browser, "h1"), timeout=10, what="the groups page")
    assert "digits 1.0.0" in text_of(browser, "tr[data-group='lobby']")
    accessible(browser, "groups")
    shots("groups")

    # At 375 px wide no page scrolls sideways.
    browser.set_window_size(375, 800)
    for page in ("/ui/", "/ui/devices/cam1", f"/ui/rollouts/{rollout}", "/ui/rollouts", "/ui/repository", "/ui/groups"):
        browser.get(base + page)
        assert browser.execute_script(OVERFLOW) <= 0, f"{page} is wider than 375 px"
    browser.get(f"{base}/ui/")
    shots("fleet-375px")
    assert len(shots.taken) == 10
