"""The config views import no store: checked in a fresh interpreter (the pure half is in
tests/unit/test_config.py)."""

from __future__ import annotations

from tests.support import REPO


def test_config_never_imports_the_store() -> None:
    """config.py reads a snapshot through its ``ConfigSource`` protocol: importing it alone (its
    source included, typing-only imports too) never reaches ``dashboard.store``, which imports it."""
    import ast
    import subprocess
    import sys

    source = (REPO / "metrics_core" / "dashboard" / "views" / "config_tables.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert "metrics_core.dashboard.store.run_store" not in imported
    code = (
        "import sys, metrics_core.dashboard.views.config_tables; "
        "print('metrics_core.dashboard.store.run_store' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
