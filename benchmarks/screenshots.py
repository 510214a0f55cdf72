"""Screenshots of every dashboard page — desktop (1400×900), phone (390 wide) and dark — into docs/screenshots/.

    .venv/bin/python benchmarks/screenshots.py [--out docs/screenshots]

Starts the real dashboard on a fresh demo root (the demo's sweep: four runs, the live one of three
sessions and two crashes), in headless Debian Chromium, and saves compressed PNGs (each well under
300 KB).  A second server with ``theme.base dark`` gives the dark shots.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metrics_core.dashboard.demo import STORY_RUN  # noqa: E402
from metrics_core.testing.live_server import chromium, streamlit_server  # noqa: E402

PAGES = {
    "runs": "/",
    "run": f"/run?run={STORY_RUN}",
    "sessions": f"/sessions?run={STORY_RUN}",
    "compare": f"/compare?run={STORY_RUN}&run=lr0.02-seed0",
    "sweep": "/sweep",
}
# Charts each page draws at least (the run page's first screen; the compare page's five default
# metrics; the sweep's two swept keys): the shot waits for them, not for the first one alone.
CHARTS = {"runs": 0, "run": 2, "sessions": 1, "compare": 5, "sweep": 2}
# Every chart drawn and laid out at its height: a chart still being drawn is a title over a sliver.
SETTLED_JS = """n => {
  const charts = [...document.querySelectorAll('.js-plotly-plot')];
  const drawn = g => g.querySelector('.main-svg') && g.getBoundingClientRect().height > 100;
  return charts.length >= n && charts.every(drawn);
}"""
VIEWS = {"desktop": {"width": 1400, "height": 900}, "phone": {"width": 390, "height": 844}}


def make_root(root: Path) -> object:
    """The demo's sweep, as its supervisor writes it (replayed sessions, then live)."""
    import subprocess

    demo = subprocess.Popen([sys.executable, "-m", "metrics_core.dashboard.demo", str(root)], cwd=REPO,
                            stdout=subprocess.DEVNULL)  # fmt: skip
    live = root / STORY_RUN / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the live session has a few windows
        text = live.read_text(errors="replace") if live.exists() else ""
        if text.count('"session_id":"demo-s3"') > 8:
            break
        time.sleep(0.5)
    return demo


def png(raw: bytes) -> bytes:
    """A palette PNG (256 colours): a fifth of the bytes of Chromium's, charts still crisp."""
    try:
        from PIL import Image
    except ImportError:
        return raw
    image = Image.open(io.BytesIO(raw)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


# The page's height: Streamlit scrolls an inner container, not the document, so Chromium's
# full-page screenshot would stop at the window's edge.  The main block's bottom, unscrolled.
PAGE_HEIGHT_JS = """() => Math.ceil(
  document.querySelector('[data-testid=stMainBlockContainer]').getBoundingClientRect().bottom)"""
MAX_HEIGHT = 8000


def opened(context: object, url: str, name: str, view: dict) -> object:
    """A tab of ``context`` showing the page in a window of ``view``'s size, its charts drawn."""
    page = context.new_page()
    page.set_viewport_size(view)
    page.goto(url)
    if name == "runs":
        page.wait_for_selector("[data-testid=stDataFrame]", timeout=60_000)
    page.wait_for_timeout(1500)  # the grid paints, the charts still to come start
    page.wait_for_function(SETTLED_JS, arg=CHARTS[name], timeout=60_000)
    page.wait_for_timeout(1000)
    return page


def shoot(browser: object, url: str, out: Path, suffix: str, view: dict) -> None:
    for name, path in PAGES.items():
        context = browser.new_context(viewport=view, device_scale_factor=1)
        try:
            page = opened(context, url + path, name, view)
            if suffix != "desktop" or name != "run":  # the whole page, not the window's first screen
                # Opened anew in a window as tall as the page: a window resized under a page leaves
                # Streamlit's layout of the old size (a chart under the next section).
                height = min(MAX_HEIGHT, max(view["height"], page.evaluate(PAGE_HEIGHT_JS)))
                page.close()
                page = opened(context, url + path, name, {"width": view["width"], "height": height})
            target = out / f"{name}-{suffix}.png"
            target.write_bytes(png(page.screenshot()))
            print(f"{target}  {target.stat().st_size // 1024} KB")
        finally:
            context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        root.mkdir()
        demo = make_root(root)
        try:
            with chromium() as browser:
                with streamlit_server(root) as url:
                    for suffix, view in VIEWS.items():
                        shoot(browser, url, args.out, suffix, view)
                os.environ["STREAMLIT_THEME_BASE"] = "dark"
                with streamlit_server(root) as url:
                    shoot(browser, url, args.out, "dark", VIEWS["desktop"])
        finally:
            demo.terminate()  # SIGTERM: the live session ends as interrupted
            demo.wait(timeout=30)


if __name__ == "__main__":
    main()
