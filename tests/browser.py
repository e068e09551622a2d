"""A real headless Chromium (Debian's chromium + chromedriver) driven by selenium, for browser tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service


@contextmanager
def headless_chromium(width: int = 1280, height: int = 1600) -> Iterator[webdriver.Chrome]:
    """Fails (never skips) when Chromium is missing: `fleetsight setup` installs it."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.fail("chromium/chromedriver not installed: run `fleetsight setup --only chromium`")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def console_errors(browser: webdriver.Chrome) -> list[str]:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
