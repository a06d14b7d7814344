"""Headless Debian chromium for browser tests, driven by selenium with the system chromedriver.

Nothing is downloaded: the browser and the driver are the apt packages' binaries, passed to
selenium explicitly (so selenium-manager never runs; SE_OFFLINE makes sure). Where they are
missing the test is skipped with the apt line to run, or fails when GPT_OSS_REQUIRE_CLIENTS=1
(CI).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APT_LINE = "apt-get install -y chromium chromium-driver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,860",
    "--lang=en-US",
)


def require_browser() -> None:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if not missing:
        return
    reason = f"{', '.join(missing)} missing: `{APT_LINE}`"
    if os.environ.get("GPT_OSS_REQUIRE_CLIENTS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """A fresh headless chromium (own profile), closed afterwards."""
    require_browser()
    os.environ["SE_OFFLINE"] = "true"

    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        options = Options()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(
            service=Service(executable_path=str(CHROMEDRIVER)), options=options
        )
        try:
            yield driver
        finally:
            driver.quit()


def console_log(driver: WebDriver) -> list[dict[str, Any]]:
    """The page's console messages since the last call (level, message)."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return entries
