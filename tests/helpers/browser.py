"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`): open a page at a
window width, measure its layout with a JavaScript expression, and take a full-page screenshot.

The protocol's messages are JSON objects separated by a NUL byte; Chromium reads them from file
descriptor 3 and writes to descriptor 4. No network port is opened: the browser reaches only the URL
it is given (the tests' dashboards on 127.0.0.1). Tests skip when CHROMIUM is not installed
(Debian's package: `apt-get install -y chromium`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--remote-debugging-pipe")
TIMEOUT_S = 60.0

# Where the page is wider than its window: the document's width and every element whose right edge passes
# the window's, outside any box that scrolls by itself.
OVERFLOW = """(() => {
  const width = document.documentElement.clientWidth;
  const inScroller = (e) => { for (let p = e.parentElement; p; p = p.parentElement) {
    const s = getComputedStyle(p).overflowX; if (s === 'auto' || s === 'scroll') return true; } return false; };
  const over = [...document.body.querySelectorAll('*')]
    .filter((e) => e.getBoundingClientRect().right > width + 0.5 && !inScroller(e))
    .map((e) => e.tagName + ' ' + Math.round(e.getBoundingClientRect().right));
  const scrolled = [...document.querySelectorAll('.scroll')].filter((e) => e.scrollWidth > e.clientWidth + 0.5)
    .map((e) => (e.previousElementSibling || {}).textContent);
  return {width: width, scrollWidth: document.documentElement.scrollWidth, over: over.slice(0, 20),
          scrolled: scrolled};
})()"""


class Browser:
    """One headless Chromium with a throw-away profile; `page` opens a URL at a window size."""

    def __init__(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="rcswarm-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        def pipe_fds() -> None:
            """In the child, before exec: the pipe's ends on descriptors 3 and 4 (by way of descriptors above
            both, so that neither end is overwritten before it is copied)."""
            import fcntl

            reading = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD, 10)
            writing = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD, 10)
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        # pass_fds keeps 3 and 4 open: the child closes the other descriptors after pipe_fds has run.
        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), env={**os.environ, "HOME": self._profile}, preexec_fn=pipe_fds,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0

    def close(self) -> None:
        os.close(self._to_browser)
        os.close(self._from_browser)
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("chromium did not answer on its DevTools pipe")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its DevTools pipe (exit {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             wait_for: str | None = None) -> dict[str, Any]:
        """Call `method` and return its result; with `wait_for`, return that event's params once it arrives
        after the call."""
        self._next_id += 1
        call = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            call["sessionId"] = session
        os.write(self._to_browser, json.dumps(call).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        result: dict[str, Any] | None = None
        while True:
            message = self._message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result = message["result"]
                if wait_for is None:
                    return result
            elif wait_for is not None and message.get("method") == wait_for and result is not None:
                return message["params"]

    def page(self, url: str, width: int, height: int = 900) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        self.send("Page.enable", session=session)
        self.send("Page.navigate", {"url": url}, session, wait_for="Page.loadEventFired")
        return Page(self, session)


class Page:
    """An open page: evaluate expressions in it, screenshot it."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def evaluate(self, expression: str) -> Any:
        answer = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression[:80]}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def overflow(self) -> dict[str, Any]:
        """The document's width and scroll width, the elements past the window's right edge outside a box that
        scrolls by itself, and the titles of the tables whose own box scrolls."""
        return self.evaluate(OVERFLOW)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (beyond the window's height too) at the window's width."""
        shot = self.browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                 self.session)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
