"""Headless Chromium for page tests, driven through the DevTools protocol (tornado's
websocket client, no extra package): open a page, wait for a JavaScript condition,
evaluate expressions, take a screenshot. Loopback only."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
    "--window-size=1280,1000",
]


def missing_reason() -> str | None:
    """Why page tests can't run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing (Debian package `chromium`)"
    return None


class Page:
    """One tab, driven synchronously (each call runs its own event loop turn)."""

    def __init__(self, ws_url: str):
        self.ws_url = ws_url
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._conn = self._loop.run_until_complete(self._connect())

    async def _connect(self):
        from tornado.websocket import websocket_connect

        return await websocket_connect(self.ws_url, max_message_size=256 * 1024 * 1024)

    async def _call(self, method: str, params: dict) -> dict:
        ident = next(self._ids)
        await self._conn.write_message(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = await self._conn.read_message()
            if message is None:
                raise RuntimeError("chromium closed the DevTools connection")
            reply = json.loads(message)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def call(self, method: str, **params) -> dict:
        return self._loop.run_until_complete(asyncio.wait_for(self._call(method, params), 60))

    def goto(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0):
        """Evaluate `expression` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                value = self.evaluate(expression)
                if value:
                    return value
            time.sleep(0.3)
        raise TimeoutError(f"{expression!r} still {value!r} after {timeout} s")

    def screenshot(self, path: str) -> bytes:
        data = base64.b64decode(
            self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        )
        with open(path, "wb") as file:
            file.write(data)
        return data

    def close(self) -> None:
        # tornado's close writes a frame, which needs this page's loop to be the running one
        self._loop.run_until_complete(self._close())
        self._loop.close()

    async def _close(self) -> None:
        self._conn.close()


@contextlib.contextmanager
def chromium() -> Iterator[Page]:
    """A headless Chromium with one blank tab; killed (by its own pid) on exit."""
    profile = tempfile.mkdtemp(prefix="dagtune-chromium-")
    process = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    page = None
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and Path(port_file).read_text().strip()):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"chromium did not start (exit code {process.poll()})")
            time.sleep(0.1)
        port = int(Path(port_file).read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        tab = next(t for t in targets if t.get("type") == "page")
        page = Page(tab["webSocketDebuggerUrl"])
        yield page
    finally:
        if page is not None:
            page.close()
        process.kill()
        process.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


# JavaScript: what the dagtune page shows, read through Bokeh's document models
RENDERED = """(() => {
  if (!window.Bokeh || !Bokeh.documents.length) return null;
  const doc = Bokeh.documents[0];
  const tree = doc.get_model_by_name('dagtune-tree');
  const curves = doc.get_model_by_name('dagtune-curves');
  const counters = doc.get_model_by_name('dagtune-counters');
  if (!tree || !curves || !counters) return null;
  const data = (fig) => fig.renderers.map(r => r.data_source.data);
  const pieces = data(tree).map(d => (d.state || []).length).reduce((a, b) => Math.max(a, b), 0);
  const lines = data(curves).map(d => (d.xs || []).length).reduce((a, b) => Math.max(a, b), 0);
  return {pieces: pieces, lines: lines, counters: counters.text,
          states: data(tree).flatMap(d => Array.from(d.state || [])),
          trials: data(tree).flatMap(d => Array.from(d.trials || [])),
          critical: data(tree).map(d => (d.width && !d.state) ? d.x0.length : 0).reduce((a, b) => a + b, 0),
          figures: [tree, curves].filter(fig => {
            const view = Bokeh.index.find_one(fig);
            return view != null && view.has_finished() && view.frame.bbox.width > 0 && view.frame.bbox.height > 0;
          }).length};
})()"""

# JavaScript: where each figure's plotting area (its frame, inside the axes) is on the page,
# in CSS pixels of the whole page (what a full-page screenshot shows at device scale 1),
# with the data range shown along x
FRAMES = """(() => {
  const doc = Bokeh.documents[0];
  const out = {scale: window.devicePixelRatio};
  for (const name of ['dagtune-tree', 'dagtune-curves']) {
    const view = Bokeh.index.find_one(doc.get_model_by_name(name));
    const r = view.el.getBoundingClientRect();
    const f = view.frame.bbox;
    out[name] = {left: r.left + window.scrollX + f.left, top: r.top + window.scrollY + f.top,
                 width: f.width, height: f.height,
                 x_start: view.model.x_range.start, x_end: view.model.x_range.end};
  }
  return out;
})()"""


def rendered_when(condition: str = "true") -> str:
    """JavaScript: what `RENDERED` reads, once `condition` (on `info`) holds; else null."""
    return f"(() => {{ const info = {RENDERED}; return info && ({condition}) ? info : null; }})()"
