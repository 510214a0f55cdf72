"""The package shows its plan: a folder per layer, imports going one way, no import circle, no
module too long, and every import path users were shown still working."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.support import REPO

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
    ("metrics_core.integrations",),
    ("metrics_core.dashboard",),
    ("metrics_core.cli",),
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
    graph = {"metrics_core.read.run_reader": {"metrics_core.dashboard.store.run_store"},
             "metrics_core.dashboard.store.run_store": {"metrics_core.read.run_reader"}}
    assert upward_imports(graph) == ["metrics_core.read.run_reader -> metrics_core.dashboard.store.run_store"]


def test_every_module_of_the_package_is_in_a_layer_or_its_public_face() -> None:
    """A new module lands in a layer's folder; only aliases and the package's entry points stand at the top."""
    unplaced = [name for name, path in product_modules().items()
                if layer_of(name) is None and name not in ("metrics_core", "metrics_core.__main__") and not is_alias(path)]
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
    long = {name: n for name, path in product_modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("module", sorted(PUBLIC_NAMES))
def test_every_import_path_users_were_shown_still_works(module: str) -> None:
    """The README's imports keep working after the move, each name the object its layer defines."""
    imported = importlib.import_module(module)
    for name in PUBLIC_NAMES[module]:
        assert callable(getattr(imported, name)), f"{module}.{name}"
