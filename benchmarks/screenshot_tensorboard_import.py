"""The README's picture of a TensorBoard run imported: a run killed twice and resumed from its
last checkpoint each time, as three event files, on the sessions page.

    .venv/bin/python benchmarks/screenshot_tensorboard_import.py [--out docs/screenshots]

Writes the logdir with TensorBoard's own ``tensorboard.summary.Writer`` (one writer a process,
each with its wall times), imports it with ``python -m metrics_core import tensorboard``'s
function, serves the dashboard on the root, and saves the sessions page from headless Chromium.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.screenshots import png  # noqa: E402
from metrics_core.imports.tensorboard_import import import_logdir  # noqa: E402
from metrics_core.testing.live_server import chromium, streamlit_server  # noqa: E402

RUN = "bert-finetune"
# (first step, last step logged) per process; each restart resumes from the last checkpoint (every 1,000 steps).
PROCESSES = ((0, 2450), (2000, 4700), (4000, 6000))
EVERY = 25
START = 1_765_000_000.0  # wall time of the first process
STEP_S = 1.6  # seconds a step
RESTART_S = 900.0  # the scheduler's gap before each restart


def write_logdir(logdir: Path) -> None:
    from tensorboard.summary import Writer

    rng, wall = random.Random(7), START
    for first, last in PROCESSES:
        writer = Writer(str(logdir / RUN))
        for step in range(first, last + 1, EVERY):
            at = wall + (step - first) * STEP_S
            loss = 0.9 + 2.6 * math.exp(-step / 1400) + rng.gauss(0, 0.04)
            writer.add_scalar("train/loss", loss, step, wall_time=at)
            lr = 3e-4 * min(1.0, step / 500) * (1 - step / 7000)
            writer.add_scalar("train/learning_rate", lr, step, wall_time=at)
            writer.add_scalar("train/grad_norm", 0.8 + rng.random() * 0.4, step, wall_time=at)
            if step % 500 == 0:
                writer.add_scalar("eval/loss", loss + 0.15, step, wall_time=at)
        writer.close()
        wall += (last - first) * STEP_S + RESTART_S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logdir, root = Path(tmp) / "tb", Path(tmp) / "runs"
        write_logdir(logdir)
        print("\n".join(import_logdir(logdir, root).lines()))
        with chromium() as browser, streamlit_server(root) as url:
            context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
            try:
                page = context.new_page()
                page.goto(f"{url}/sessions?run={RUN}")
                page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0",
                                       timeout=60_000)  # fmt: skip
                page.wait_for_timeout(2500)  # the last charts draw, the grid paints
                target = args.out / "sessions-tensorboard-import.png"
                target.write_bytes(png(page.screenshot(full_page=True)))
                print(f"{target}  {target.stat().st_size // 1024} KB")
            finally:
                context.close()


if __name__ == "__main__":
    main()
