"""Screenshots of every dashboard page — desktop, phone (390×844) and dark — into docs/screenshots/.

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
VIEWS = {"desktop": {"width": 1400, "height": 1000}, "phone": {"width": 390, "height": 844}}


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


def shoot(browser: object, url: str, out: Path, suffix: str, view: dict) -> None:
    for name, path in PAGES.items():
        context = browser.new_context(viewport=view, device_scale_factor=1)
        try:
            page = context.new_page()
            page.goto(url + path)
            if name != "runs":
                page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0",
                                       timeout=60_000)  # fmt: skip
            else:
                page.wait_for_selector("[data-testid=stDataFrame]", timeout=60_000)
            page.wait_for_timeout(2500)  # the last charts draw, the grid paints
            target = out / f"{name}-{suffix}.png"
            target.write_bytes(png(page.screenshot(full_page=suffix != "desktop" or name != "run")))
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
