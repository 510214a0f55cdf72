"""TrainingWindow's float path never imports torch: checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def test_float_path_never_imports_torch() -> None:
    """A trainer that logs plain numbers does not pay for importing torch."""
    code = (
        "import sys\nfrom metrics_core import TrainingWindow\nw = TrainingWindow()\n"
        "w.add(1.0, 10, 0.5, False, 1.0)\nw.summary(1e-3)\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
