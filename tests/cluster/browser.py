"""A student in JupyterHub, in a real browser: Debian's chromium, headless,
driven by Playwright. Each step's screenshot goes to the directory the
caller names (under $DELEGATE_ARTIFACTS, default /var/lib/delegate/artifacts).
Shared by tests/cluster/test_hub.py and tests/acceptance/."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from stacklib import run

PORT = int(os.environ.get("DELEGATE_JUPYTER_PORT", "8888"))
URL = f"https://127.0.0.1:{PORT}"
ARTIFACTS_ROOT = Path(os.environ.get("DELEGATE_ARTIFACTS", "/var/lib/delegate/artifacts"))


def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        # Debian's chromium (no browser download from the internet).
        apt = ("apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium")
        if run(*apt, timeout=900).returncode != 0:
            run("apt-get", "update", "-q", timeout=600)
            run(*apt, timeout=900, check=True)
        path = shutil.which("chromium")
    assert path, "chromium not installed"
    return path


@contextlib.contextmanager
def browser_for(artifacts: Path) -> Iterator:
    """A headless chromium; screenshots go to ARTIFACTS (emptied of an
    earlier run's first)."""
    from playwright.sync_api import sync_playwright

    artifacts.mkdir(parents=True, exist_ok=True)
    for old in artifacts.glob("*.png"):
        old.unlink()
    print(f"\nscreenshots of the browser test: {artifacts}")
    exe = chromium_path()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class HubSession:
    """One student's browser context and notebook page."""

    def __init__(self, browser, user: str, password: str, artifacts: Path):
        self.user = user
        self.password = password
        self.artifacts = artifacts
        self.ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(120_000)
        self.step = 0

    def shot(self, what: str) -> None:
        self.step += 1
        path = self.artifacts / f"{self.user}-{self.step:02d}-{what}.png"
        self.page.screenshot(path=str(path), full_page=True)

    def login(self, lab: bool = True) -> None:
        p = self.page
        p.goto(f"{URL}/hub/login")
        self.shot("login-page")
        p.fill("#username_input", self.user)
        p.fill("#password_input", self.password)
        p.click("#login_submit")
        if not lab:
            p.wait_for_url(re.compile(r"/(hub|user)/"))
            return
        # The hub starts the server, then JupyterLab loads.
        p.wait_for_url(re.compile(rf"/user/{self.user}/lab"), timeout=180_000)
        p.wait_for_selector(".jp-LauncherCard", timeout=180_000)
        self.shot("lab")

    def new_notebook(self) -> None:
        p = self.page
        p.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
        p.wait_for_selector(".jp-Notebook .jp-Cell .cm-content")
        # The kernel is up (the status bar says so once it has connected).
        p.wait_for_selector(".jp-StatusBar-TextItem:has-text('| Idle')", timeout=120_000)
        self.shot("notebook")

    def _run_last_cell(self, code: str):
        """Types CODE into the last cell, over whatever it held, and runs
        it; returns the cell. (A notebook the workspace restores may end in
        a cell with text its autosave kept: the acceptance day of stop 64
        typed Ann's call after a stale `delegate.jobs()`.)"""
        p = self.page
        cells = p.locator(".jp-Notebook .jp-Cell")
        cell = cells.nth(cells.count() - 1)
        cell.locator(".cm-content").click()
        p.keyboard.press("Control+A")
        p.keyboard.insert_text(code)
        p.keyboard.press("Shift+Enter")
        return cell

    def _dropped(self, cell, start: float, what: str) -> bool:
        """A run sent while the kernel's connection was still settling is
        dropped by JupyterLab (the prompt stays "[ ]:"): as a person would,
        run the cell again (the caller does it once)."""
        prompt = cell.locator(".jp-InputArea-prompt")
        if time.monotonic() - start > 15 and prompt.inner_text().strip() == "[ ]:":
            self.shot(what + "-not-run")
            cell.locator(".cm-content").click()
            self.page.keyboard.press("Control+Enter")
            return True
        return False

    def _finished(self, cell) -> bool:
        """The cell ran to its end (its prompt has a number)."""
        return bool(re.fullmatch(r"\[\d+\]:", cell.locator(".jp-InputArea-prompt").inner_text().strip()))

    @staticmethod
    def _rendered(out, until: str, patience: float = 5) -> None:
        """A finished cell's output may render a moment after its prompt's
        number: waits at most `patience` seconds for UNTIL in it."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline and until not in (out.inner_text() if out.count() else ""):
            time.sleep(0.2)

    def _run_until(self, code: str, until: str, what: str, timeout: float, period: float, sample=None) -> str:
        """Types CODE into the last cell, runs it, reads its output every
        PERIOD seconds (each reading given to SAMPLE) until it holds UNTIL
        or the cell ran to its end; returns the output's text."""
        cell = self._run_last_cell(code)
        out = cell.locator(".jp-OutputArea")
        start = time.monotonic()
        deadline = start + timeout / 1000
        rerun = False
        while time.monotonic() < deadline:
            text = out.inner_text() if out.count() else ""
            if sample is not None:
                sample(text)
            if until in text:
                break
            if self._finished(cell):
                self._rendered(out, until)
                break
            rerun = rerun or self._dropped(cell, start, what)
            time.sleep(period)
        text = out.inner_text() if out.count() else ""
        self.shot(what)
        assert until in text, f"{self.user}: cell output without {until!r}: {text!r}"
        return text

    def run_cell(self, code: str, until: str, what: str, timeout=240_000) -> str:
        """Types CODE into the last cell, runs it, waits until its output
        holds UNTIL; returns the output's text."""
        return self._run_until(code, until, what, timeout, 1.0)

    def watch_cell(
        self, code: str, seen: str, until: str, what: str, timeout=300_000
    ) -> tuple[list[str], str]:
        """Runs CODE in the last cell and samples its output every half
        second until it holds UNTIL; returns every distinct line that held
        SEEN on the way (the live lines' states) and the final text. A
        screenshot is taken at each new state (its clock aside)."""
        states: list[str] = []
        kinds: set[str] = set()

        def sample(text: str) -> None:
            for line in text.splitlines():
                if seen in line and line not in states:
                    states.append(line)
                    kind = re.sub(r" · [0-9hms ]+$", "", line)
                    if kind not in kinds:
                        kinds.add(kind)
                        self.shot(f"{what}-{len(kinds)}")

        text = self._run_until(code, until, what, timeout, 0.5, sample)
        return states, text
