"""The dashboard's layers, lowest first, as the layer tests read them (``tests/unit/test_layers.py``
for imports, ``tests/unit/test_one_way_flow.py`` for calls)."""

from __future__ import annotations

# Lowest first.  ``display_text`` is the dashboard's text helper, below everything that shows text
# (as ``metrics_core.text`` is below the package); the dashboard's other own modules (widgets,
# panels, settings, ...) sit above the server, under the pages.
DASHBOARD_LAYERS = ("display_text", "store", "views", "figures", "live", "clients", "server")
OWN_MODULES = len(DASHBOARD_LAYERS)


def dashboard_layer(module: str) -> int:
    """The rank of a ``metrics_core.dashboard`` module: its subpackage's place in ``DASHBOARD_LAYERS``,
    or ``OWN_MODULES`` for the dashboard's other top-level modules."""
    first = module.removeprefix("metrics_core.dashboard.").split(".")[0]
    return DASHBOARD_LAYERS.index(first) if first in DASHBOARD_LAYERS else OWN_MODULES
