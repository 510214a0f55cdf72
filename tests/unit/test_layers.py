"""The package shows its plan: a folder per layer, imports going one way, no import circle, no
module too long, and every import path users were shown still working."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.layers import DASHBOARD_LAYERS, dashboard_layer

PACKAGE = REPO / "metrics_core"

# Lowest first: a module may import its own layer and the layers before it, never one after it.
LAYERS = (
    ("metrics_core.errors", "metrics_core.text"),
    ("metrics_core.write",),
    ("metrics_core.read",),
    ("metrics_core.analysis",),
    ("metrics_core.buckets",),
    ("metrics_core.roots",),
    ("metrics_core.sql",),
    ("metrics_core.alerts",),
    ("metrics_core.imports",),
    ("metrics_core.integrations",),
    ("metrics_core.dashboard",),
    ("metrics_core.cli",),
    ("metrics_core.testing",),
)
# Users were shown these; each is kept, as a thin alias where the code moved into a layer.
PUBLIC_NAMES = {
    "metrics_core": ("MetricsWriter", "TrainingWindow", "TrainingState", "RunContext"),
    "metrics_core.reader": ("RunReader",),
    "metrics_core.runs": ("find_runs", "run_status"),
    "metrics_core.session": ("training_session",),
    "metrics_core.summary": ("summarise",),
    "metrics_core.logging_bridge": ("capture_logger",),
    "metrics_core.object_storage": ("open_bucket_run", "s3_filesystem"),
}
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    """Every module of the package but the app's script and pages that the wheel ships beside it."""
    return {module_name(path): path for path in PACKAGE.rglob("*.py") if "entry" not in path.parts}


def imports(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` imports anywhere in it: at module level, under
    ``if TYPE_CHECKING:`` and inside functions alike (a lazy import hides a circle, it does not
    remove it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = product_modules()
    known = set(paths)
    return {name: imports(path, known) - {name} for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the path that closes it (depth-first search)."""
    found, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                found.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target, [*stack, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def layer_of(module: str) -> int | None:
    """The rank of ``module``'s layer; ``None`` for the package's public face (``metrics_core``,
    ``__main__`` and the alias modules), which sits above every layer."""
    for rank, prefixes in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return rank
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if (low := layer_of(source)) is not None and (high := layer_of(target)) is not None and high > low
    )


def is_alias(path: Path) -> bool:
    """A module that only re-exports: a docstring, imports and ``__all__``."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue
        return False
    return True


def own_modules(folder: Path) -> tuple[list[str], list[str]]:
    """A folder's real modules and its subpackages (``__init__`` and aliases are not real modules)."""
    real = [p.name for p in folder.glob("*.py") if p.name != "__init__.py" and not is_alias(p)]
    packages = [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
    return sorted(real), sorted(packages)


def test_the_import_graph_is_read_from_the_package() -> None:
    """The graph sees the read layers in their order and lazy imports too (so an empty list means something)."""
    graph = import_graph()
    assert "metrics_core.read.line_follower" in graph["metrics_core.read.run_reader"]
    assert "metrics_core.read.run_file" in graph["metrics_core.read.line_follower"]
    assert "metrics_core.read.session_model" in graph["metrics_core.read.run_digest"]
    assert "metrics_core.roots.bucket_root" in graph["metrics_core.roots.runs_root"]  # imported in open_root


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import circle anywhere in metrics_core, lazy imports included."""
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    """The oracle itself: a three-module circle is reported."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_every_layer_imports_only_the_layers_below_it() -> None:
    """write -> read -> analysis -> buckets -> roots -> sql -> alerts -> dashboard -> cli: never back."""
    assert upward_imports(import_graph()) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    """The oracle itself: the read core importing the dashboard is reported, the other way is not."""
    graph = {
        "metrics_core.read.run_reader": {"metrics_core.dashboard.store.run_store"},
        "metrics_core.dashboard.store.run_store": {"metrics_core.read.run_reader"},
    }
    assert upward_imports(graph) == ["metrics_core.read.run_reader -> metrics_core.dashboard.store.run_store"]


def test_every_module_of_the_package_is_in_a_layer_or_its_public_face() -> None:
    """A new module lands in a layer's folder; only aliases and the package's entry points stand at the top."""
    entry_points = ("metrics_core", "metrics_core.__main__")
    unplaced = [
        name
        for name, path in product_modules().items()
        if layer_of(name) is None and name not in entry_points and not is_alias(path)
    ]
    assert unplaced == []


def test_the_folders_show_the_layers() -> None:
    """metrics_core/ keeps only its public face; each layer is a folder, and so is each part of the dashboard."""
    real, packages = own_modules(PACKAGE)
    assert len(real) <= 8, real
    assert len(set(packages) - {"dashboard", "integrations"}) >= 4, packages
    dashboard_real, dashboard_packages = own_modules(PACKAGE / "dashboard")
    assert len(dashboard_real) <= 12, dashboard_real
    assert {"store", "views", "figures", "live", "server"} <= set(dashboard_packages)


def test_no_module_is_over_the_line_limit() -> None:
    """A module that long usually holds two jobs."""
    long = {
        name: n for name, path in product_modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


@pytest.mark.parametrize("module", sorted(PUBLIC_NAMES))
def test_every_import_path_users_were_shown_still_works(module: str) -> None:
    """The README's imports keep working after the move, each name the object its layer defines."""
    imported = importlib.import_module(module)
    for name in PUBLIC_NAMES[module]:
        assert callable(getattr(imported, name)), f"{module}.{name}"


# -- inside the dashboard: store < views < figures < live < clients < server < its own modules and pages

DASHBOARD = PACKAGE / "dashboard"
# What the views may read of the store: the snapshot and the facts of its rows, never the store itself.
VIEWS_READ_OF_STORE = {"store.snapshot", "store.rows", "store.run_config"}


def dashboard_graph() -> dict[str, set[str]]:
    """Each dashboard module and the dashboard modules it imports, lazy imports included."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    known = set(paths)
    return {
        name: {target for target in imports(path, known) - {name} if target.startswith("metrics_core.dashboard.")}
        for name, path in paths.items()
        if name.startswith("metrics_core.dashboard.")
    }


def upward_dashboard_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for each import of a higher dashboard layer than the importer's own."""
    return sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if dashboard_layer(target) > dashboard_layer(name)
    )


def test_the_dashboard_graph_counts_late_imports() -> None:
    """The graph sees a function-level import (``sql_box`` imports the query module when asked) and
    the layers in their order (so an empty list of upward imports means something)."""
    graph = dashboard_graph()
    assert "metrics_core.sql.query_process" not in graph["metrics_core.dashboard.sql_box"]  # outside the dashboard
    assert "metrics_core.sql.query_process" in imports(DASHBOARD / "sql_box.py", {"metrics_core.sql.query_process"})
    assert "metrics_core.dashboard.views.chart_specs" in graph["metrics_core.dashboard.figures.run_charts"]
    assert "metrics_core.dashboard.figures.chart_memo" in graph["metrics_core.dashboard.live.feed"]
    assert (
        dashboard_layer("metrics_core.dashboard.store.snapshot")
        < dashboard_layer("metrics_core.dashboard.views.memo")
        < dashboard_layer("metrics_core.dashboard.server.serving")
        < dashboard_layer("metrics_core.dashboard.widgets")
    )


def test_the_dashboard_imports_only_downward() -> None:
    """store < views < figures < live < clients < server < the dashboard's own modules (pages above all): no
    module imports a layer above its own, not even inside a function, so a snapshot reaches a chart
    through each layer once, in order."""
    assert upward_dashboard_imports(dashboard_graph()) == []


def test_the_views_read_only_the_snapshot_of_the_store() -> None:
    """The views are functions of a snapshot: they read ``RunView`` and the facts of its rows,
    never the store that makes snapshots (``run_store``, ``run_entry``)."""
    graph = dashboard_graph()
    read = {
        target.removeprefix("metrics_core.dashboard.")
        for name, targets in graph.items()
        if dashboard_layer(name) == DASHBOARD_LAYERS.index("views")
        for target in targets
        if dashboard_layer(target) == DASHBOARD_LAYERS.index("store")
    }
    assert read <= VIEWS_READ_OF_STORE, read - VIEWS_READ_OF_STORE


def test_the_upward_import_finder_finds_one() -> None:
    """The oracle itself: a view importing a figure module is reported, a figure importing a view is not."""
    graph = {
        "metrics_core.dashboard.views.a": {"metrics_core.dashboard.figures.b"},
        "metrics_core.dashboard.figures.b": {"metrics_core.dashboard.views.a"},
        "metrics_core.dashboard.widgets": {"metrics_core.dashboard.server.c"},
    }
    assert upward_dashboard_imports(graph) == [("metrics_core.dashboard.views.a", "metrics_core.dashboard.figures.b")]


# -- Streamlit's internals stay behind one fence: dashboard/server/ ------------------------------------

FENCE = DASHBOARD / "server"
# The tests' and benchmarks' harness drives a served dashboard from outside, as a browser: it may
# name Streamlit's URL paths (the health check), which the app's own code leaves to the fence.
TESTING = PACKAGE / "testing"
# Streamlit's public API, as its documentation lists it: ``st.*``, the components and testing APIs.
PUBLIC_STREAMLIT = {"streamlit", "streamlit.components.v1", "streamlit.components.v2", "streamlit.testing.v1"}


def outside_the_fence() -> list[Path]:
    """Every Python module of the app but the fence's: the package, app.py and the pages."""
    modules = [*PACKAGE.rglob("*.py"), REPO / "app.py", *(REPO / "pages").glob("*.py")]
    return sorted(path for path in modules if FENCE not in path.parents and TESTING not in path.parents)


def private_streamlit_uses(path: Path) -> list[str]:
    """What ``path`` uses of Streamlit that is not its public API (a module outside
    ``PUBLIC_STREAMLIT``, a name starting with "_", ``st.runtime`` / ``st.web``), and every string
    that names Streamlit's own URL paths (``_stcore``), docstrings included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            if node.module in PUBLIC_STREAMLIT:
                modules += [f"{node.module}.{alias.name}" for alias in node.names if alias.name.startswith("_")]
                modules += [
                    f"{node.module}.{alias.name}" for alias in node.names if _is_module(node.module, alias.name)
                ]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "st":
            modules = [f"streamlit.{node.attr}"] if node.attr.startswith("_") or node.attr in ("runtime", "web") else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "_stcore" in node.value:
            found.append(f"line {node.lineno}: the string {node.value[:60]!r}")
            continue
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in modules
                  if name.split(".")[0] == "streamlit" and name not in PUBLIC_STREAMLIT]  # fmt: skip
    return found


def _is_module(package: str, name: str) -> bool:
    """Whether ``from package import name`` names a module of Streamlit's (public only if listed)."""
    import importlib.util

    return importlib.util.find_spec(f"{package}.{name}") is not None if package == "streamlit" else False


def test_only_the_server_fence_uses_streamlits_internals() -> None:
    """No module outside dashboard/server/ imports a private Streamlit module or name, or names a
    path Streamlit serves (``_stcore``): an upgrade that changes one breaks the fence's tests
    (tests/unit/test_serving.py, tests/browser/test_serving.py), not a page."""
    found = {str(path.relative_to(REPO)): private_streamlit_uses(path) for path in outside_the_fence()}
    assert {path: uses for path, uses in found.items() if uses} == {}


def test_the_fence_check_finds_private_uses(tmp_path: Path) -> None:
    """The oracle itself: each kind of private use is reported, public ones are not; and the fence
    holds what it fences (so the check is not empty by accident)."""
    module = tmp_path / "m.py"
    module.write_text(
        "import streamlit as st\nfrom streamlit.components.v2 import component\n"
        "from streamlit.runtime.pages_manager import PagesManager\nfrom streamlit import config, _private\n"
        "st._internal\nURL = '/_stcore/health'\n"
    )
    assert private_streamlit_uses(module) == [
        "line 3: streamlit.runtime.pages_manager",
        "line 4: streamlit._private",
        "line 4: streamlit.config",
        "line 5: streamlit._internal",
        "line 6: the string '/_stcore/health'",
    ]
    assert private_streamlit_uses(FENCE / "serving.py") and private_streamlit_uses(FENCE / "page_head.py")


def test_the_fence_is_small() -> None:
    """At most five modules behind the fence (serving, its head tags, its gzip copies, its access
    check and its connection guard), none over the house's 450 lines."""
    modules = [path for path in FENCE.glob("*.py") if path.name != "__init__.py"]
    assert len(modules) <= 5, modules
    assert max(len(path.read_text().splitlines()) for path in modules) <= 450


def test_the_dashboard_keeps_at_most_twelve_modules_of_its_own() -> None:
    """The dashboard's own top-level modules (its layers live in subpackages) stay few: a new job
    goes to the layer it belongs to."""
    assert len([path for path in DASHBOARD.glob("*.py") if path.name != "__init__.py"]) <= 12
