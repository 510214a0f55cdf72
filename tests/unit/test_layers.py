"""The package's modules depend on each other in one direction: no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import REPO

PACKAGE = REPO / "metrics_core"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` depends on at module level, ``if TYPE_CHECKING:`` imports
    included (a circle through annotations is still a circle); an import inside a function is a
    deliberate late dependency and not counted."""
    found = set()
    body = ast.parse(path.read_text()).body
    for node in list(body):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            body.extend(node.body)
    for node in body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    known = set(paths)
    return {name: top_level_imports(path, known) - {name} for name, path in paths.items()}


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


def test_the_import_graph_is_read_from_the_package() -> None:
    """The graph sees the read layers in their order (so an empty cycle list means something)."""
    graph = import_graph()
    assert "metrics_core.read.line_follower" in graph["metrics_core.read.run_reader"]
    assert "metrics_core.read.run_file" in graph["metrics_core.read.line_follower"]
    assert "metrics_core.read.session_model" in graph["metrics_core.read.run_digest"]


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import circle anywhere in metrics_core: each layer imports only layers below it."""
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    """The oracle itself: a three-module circle is reported."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
