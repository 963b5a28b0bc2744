"""Headless Chromium for the dashboard's browser tests and bench/web_bench.py: Debian's
`chromium` driven through its `chromium-driver` (Selenium never downloads a browser or a
driver here). Missing locally: the test is skipped; missing in CI (CI=true): it fails."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]

OPTIONS = (
    "--headless=new",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


def require_browser() -> None:
    """Skip (fail under CI) unless Chromium, its driver and Selenium are installed."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if missing:
        why = f"no {', '.join(missing)} (Debian: apt-get install chromium chromium-driver)"
        # tests/helpers.py's skip_or_fail, inline: bench/web_bench.py imports this module with
        # only tests/e2e on its path
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, but {why}: CI must run this test, not skip it")
        pytest.skip(why)


def start_chromium(profile: Path) -> Any:
    """A headless Chromium WebDriver with a fresh profile in `profile`, keeping the page's
    console messages (CSP violations land there)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*OPTIONS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER)
    return webdriver.Chrome(service=service, options=options)


def console_errors(driver: Any) -> list[str]:
    """The page's SEVERE console messages since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def artifacts_dir() -> Path:
    """Where screenshots go: $GPUQ_TEST_ARTIFACTS, else <repo>/.artifacts."""
    folder = Path(os.environ.get("GPUQ_TEST_ARTIFACTS") or REPO / ".artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(driver: Any, name: str) -> Path:
    """The whole page (not only the window) as artifacts_dir()/name; its path, printed."""
    path = artifacts_dir() / name
    width, height = driver.execute_script(
        "const e = document.documentElement; return [e.scrollWidth, e.scrollHeight];"
    )
    try:
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
        )
        path.write_bytes(base64.b64decode(shot["data"]))
    except Exception:  # a driver without the DevTools protocol: the window only
        driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def quit_driver(driver: Any, profile: Path) -> None:
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
