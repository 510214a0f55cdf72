"""Every module path and dotted name the docs and docstrings give names something that exists.

ARCHITECTURE.md sends a newcomer to the module docstrings; a name there that moved away sends them
nowhere.  Scanned: docs/*.md, README.md and tests/README.md, and the docstrings and comments of the
project's Python files (``metrics_core/``, ``pages/``, ``app.py``, ``benchmarks/``, ``examples/``).
What is checked, each only where it surely means the project (the source is read by ``ast``,
nothing is imported):

* ``metrics_core.a.b`` dotted names: a module, then a name it defines or imports, then a member of
  that class;
* paths under the project's top directories (``metrics_core/read/``, ``tests/unit/test_x.py``), and
  backticked ``name.py`` files and relative paths whose first part is a project directory
  (``figures/chart_memo``): some project path ends with them;
* backticked ``a.b``: ``a`` a project class (``RunView.frames``), module or package
  (``run_reader.RunReader``, ``alerts.AlertEvaluator``), or no module at all before a project
  function or class (``storage.open_regular``): see ``short_resolves``.

A backticked ``frame.columns``, ``pd.DataFrame`` or ``store.view`` (a variable) is not checked.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "metrics_core"
CODE = (PACKAGE, "pages", "benchmarks", "examples")
SCANNED = (*CODE, "tests")
TOP = ("metrics_core", "tests", "docs", "benchmarks", "pages", "examples", ".ci", ".github")
DOTTED = re.compile(r"(?<![\w./])metrics_core(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(re.escape(top) for top in TOP) + r")/[\w./-]*[\w/]")
BACKTICKED = re.compile(r"`{1,2}([^`\s]+)`{1,2}")
CLASS_THROUGH = re.compile(r"(?<![\w.`])[a-z_][a-z0-9_]*\.[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*(?![\w`(])")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
RELATIVE = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
PYTHON_PROSE = re.compile(r'"""(?:[^"\\]|\\.|"(?!""))*"""|\'\'\'.*?\'\'\'|#[^\n]*', re.DOTALL)
SELF_ASSIGNED = re.compile(r"\bself\.(\w+)\s*(?::[^=\n]+)?=(?!=)")
DATA_FILE = re.compile(r"\.(?:md|toml|json|jsonl|parts|html|txt|yaml|yml|csv|parquet|js|css|lock)$")
# Words a docstring puts before an attribute that are not the project module of the same name: a
# variable (``self.rules``, ``args.root``), a library (``pd.DataFrame``), the browser's
# ``window.Plotly``, Streamlit's ``server.baseUrlPath`` option.
NOT_MODULES = frozenset(
    {"self", "cls", "args", "pd", "np", "st", "go", "os", "sys", "time", "json", "orjson", "math", "window", "server"}
)


@dataclass
class Module:
    """A project module as its source defines it: the functions and classes it defines (with each
    class's members), and the other names it binds (imports and assignments)."""

    defined: set[str] = field(default_factory=set)
    members: dict[str, set[str]] = field(default_factory=dict)
    bases: dict[str, list[str]] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)


@cache
def modules() -> dict[str, Module]:
    """Every project module by dotted name (``metrics_core.read.run_reader``, ``tests.support``)."""
    found = {}
    for top in CODE:
        for path in (ROOT / top).rglob("*.py"):
            if "vendor" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = _module(path)
    for path in ROOT.glob("*.py"):
        found[path.stem] = _module(path)
    return found


def _module(path: Path) -> Module:
    source = path.read_text(encoding="utf-8")
    module = Module()
    assigned = set(SELF_ASSIGNED.findall(source))  # ``self.x = ``: a member of the module's classes
    for node in _top_level(ast.parse(source).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            module.defined.add(node.name)
            if isinstance(node, ast.ClassDef):
                module.members[node.name] = _members(node) | assigned
                module.bases[node.name] = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module.bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        else:
            module.bound.update(_targets(node))
    return module


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body``, and of its ``if``/``try`` blocks (``TYPE_CHECKING`` imports)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                yield from _top_level(handler.body)
        else:
            yield node


def _targets(node: ast.stmt) -> set[str]:
    """The names an assignment binds (``A = B = 1``, ``x: int``, ``a, b = ...``)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return set()
    return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}


def _members(node: ast.ClassDef) -> set[str]:
    """A class's methods and class attributes."""
    members = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            members.update(_targets(item))
    return members


@cache
def module_tails() -> dict[str, list[str]]:
    """Each module's (and package's) last name: the modules a short reference may mean."""
    tails: dict[str, list[str]] = {}
    for name in modules():
        tails.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return tails


@cache
def defined_anywhere() -> dict[str, set[str]]:
    """Every function and class defined at some module's top level, with its members and its
    bases' (the union over the classes of that name)."""
    found: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for module in modules().values():
        for name in module.defined:
            found.setdefault(name, set()).update(module.members.get(name, ()))
            bases.setdefault(name, set()).update(module.bases.get(name, ()))
    for name in found:
        seen, todo = {name}, list(bases[name])
        while todo:
            base = todo.pop()
            if base in found and base not in seen:
                seen.add(base)
                found[name] |= found[base]
                todo += bases[base]
    return found


@cache
def project_paths() -> frozenset[str]:
    """Every file and directory of the project, from the root (a directory's path ends in ``/``)."""
    paths = set()
    for top in TOP:
        for path in (ROOT / top).rglob("*"):
            if "__pycache__" not in path.parts:
                relative = path.relative_to(ROOT).as_posix()
                paths.add(relative + "/" if path.is_dir() else relative)
    paths.update(path.name + "/" if path.is_dir() else path.name for path in ROOT.iterdir())
    return frozenset(paths | installed_paths())


def installed_paths() -> set[str]:
    """What pyproject.toml installs under ``metrics_core/`` from elsewhere in the checkout
    (``package-dir``: the app's script, pages and Streamlit config as ``dashboard/entry/``)."""
    import tomllib  # Python 3.11+, as this tier's other readers of pyproject.toml

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    paths = set()
    for package, directory in setuptools.get("package-dir", {}).items():
        installed = package.replace(".", "/")
        paths.add(installed + "/")
        paths.update(f"{installed}/{path.name}" for path in (ROOT / directory).glob("*.py"))
        data = setuptools.get("package-data", {}).get(package, [])
        paths.update(f"{installed}/{pattern}" for pattern in data if (ROOT / directory / pattern).exists())
    return paths


@cache
def directories() -> frozenset[str]:
    return frozenset(path.rstrip("/").rsplit("/", 1)[-1] for path in project_paths() if path.endswith("/"))


# -- resolving -----------------------------------------------------------------------------------


def dotted_resolves(dotted: str) -> bool:
    """``metrics_core.a.b.c``: its longest module prefix, then a name the module defines or binds,
    then (of a class it defines) a member."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in modules():
            module, rest = modules()[name], parts[end:]
            if not rest:
                return True
            if rest[0] not in module.defined | module.bound:
                return False
            if len(rest) == 1 or rest[0] not in module.members:
                return True  # a name, or an imported one's member: its own module's
            return rest[1] in module.members[rest[0]] | defined_anywhere()[rest[0]]
    return False


def short_resolves(dotted: str) -> bool | None:
    """A backticked ``a.b``: None when it surely names no project module; else whether it resolves.

    ``a`` a project class: ``b`` one of its members.  ``a`` a module or package (the last part of
    its dotted name): some module ending in ``a`` has the rest, or ``b`` is a member of one of its
    classes (``rules.add``, ``rules`` a ``RunRules``).  ``a`` no module, but ``b`` a project
    function or class (``storage.open_regular``): a module that is not there.  A plain word
    before a plain word (``store.view``, ``session.state``) is as often a variable's attribute as
    a module's name: not checked."""
    parts = dotted.split(".")
    first, second = parts[0], parts[1]
    defined = defined_anywhere()
    if first in NOT_MODULES:
        return None
    if first[0].isupper() and first in defined:
        return second in defined[first]
    candidates = [name for name in module_tails().get(first, ()) if name == first or name.endswith("." + first)]
    if candidates:
        if any(dotted_resolves(name + dotted[len(first) :]) for name in candidates):
            return True
        if any(second in members for name in candidates for members in modules()[name].members.values()):
            return True
        return False if _distinctive(first) or _distinctive(second) else None
    return False if second in defined and _distinctive(second) else None


def _distinctive(name: str) -> bool:
    """A class, a constant or a snake_case name: no word a sentence or a variable uses by chance."""
    name = name.strip("_")
    return bool(name) and (name[0].isupper() or "_" in name)


def path_resolves(path: str) -> bool:
    """A path from the project's root: a file or directory that exists (a pattern aside)."""
    path = path.rstrip(".")
    if "*" in path or "<" in path:
        return True
    paths = project_paths()
    return path in paths or path.rstrip("/") in paths or path.rstrip("/") + "/" in paths


def tail_resolves(path: str) -> bool:
    """Some project path ends with ``path`` (a ``.py`` may be left off)."""
    tail = path.strip("/")
    name = tail.rsplit("/", 1)[-1]
    return any(
        known in (tail, f"{tail}.py") or known.endswith((f"/{tail}", f"/{tail}.py"))
        for known in by_name().get(name, ()) + by_name().get(f"{name}.py", ())
    )


@cache
def by_name() -> dict[str, tuple[str, ...]]:
    """The project's paths (without a directory's ``/``) by their last part."""
    found: dict[str, list[str]] = {}
    for path in project_paths():
        path = path.rstrip("/")
        found.setdefault(path.rsplit("/", 1)[-1], []).append(path)
    return {name: tuple(paths) for name, paths in found.items()}


# -- what is scanned -----------------------------------------------------------------------------


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(first line, text) of each block of a file's prose: a markdown file whole; of Python, its
    triple-quoted strings (docstrings) and comments, found by a regular expression (tokenizing
    every file costs seconds)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        yield 1, text
        return
    for found in PYTHON_PROSE.finditer(text):
        if "." in found.group() or "/" in found.group():
            yield text.count("\n", 0, found.start()) + 1, found.group()


def scanned() -> Iterator[Path]:
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield ROOT / "README.md"
    yield ROOT / "tests" / "README.md"
    yield from sorted(ROOT.glob("*.py"))
    for top in SCANNED:
        yield from sorted(
            path for path in (ROOT / top).rglob("*.py") if "vendor" not in path.parts and path != Path(__file__)
        )


def unresolved(path: Path) -> Iterator[str]:
    """Each reference of ``path``'s prose that names nothing, as ``file:line: reference``."""
    where = path.relative_to(ROOT)
    for first, block in prose(path):
        for found in DOTTED.finditer(block):
            if not dotted_resolves(found.group()):
                yield f"{where}:{first + block.count(chr(10), 0, found.start())}: {found.group()}"
        for found in PATH.finditer(block):
            if not path_resolves(found.group()):
                yield f"{where}:{first + block.count(chr(10), 0, found.start())}: {found.group()}"
        for found in CLASS_THROUGH.finditer(block):  # unquoted ``module.Class``
            if short_resolves(found.group()) is False:
                yield f"{where}:{first + block.count(chr(10), 0, found.start())}: {found.group()}"
        for found in BACKTICKED.finditer(block):
            quoted = found.group(1).split("(")[0].rstrip(".,:;")
            if quoted.startswith((*TOP, "/", ".")):
                continue  # a path from the root (checked above) or of the system
            if quoted.endswith(".py"):
                wrong = not tail_resolves(quoted)
            elif "/" in quoted:
                head = quoted.strip("/").split("/")[0]
                wrong = bool(RELATIVE.fullmatch(quoted)) and head in directories() and not tail_resolves(quoted)
            else:
                named = bool(NAME.fullmatch(quoted)) and not DATA_FILE.search(quoted)
                wrong = named and short_resolves(quoted) is False
            if wrong:
                yield f"{where}:{first + block.count(chr(10), 0, found.start())}: `{quoted}`"


def test_every_module_path_and_dotted_name_in_the_docs_names_something_that_exists() -> None:
    """Each reference that names nothing is listed with its file and line."""
    missing = [reference for path in scanned() for reference in unresolved(path)]
    assert not missing, "names that resolve to nothing:\n" + "\n".join(missing)


def test_the_check_names_what_moved_and_leaves_variables_and_libraries_alone() -> None:
    """A name that moved fails, its new name passes, and a variable's or a library's attribute is
    not taken for the project's."""
    assert dotted_resolves("metrics_core.read.run_reader.RunReader.frame")
    assert not dotted_resolves("metrics_core.read.storage.open_regular")
    assert not dotted_resolves("metrics_core.read.run_reader.RunReader.no_such_member")
    assert short_resolves("run_file.open_regular") and short_resolves("evaluator.AlertEvaluator")
    assert short_resolves("rules.add")  # ``rules`` a ``RunRules``
    assert short_resolves("storage.open_regular") is False and short_resolves("alerts.AlertEvaluator") is False
    assert short_resolves("RunReader.no_such_member") is False
    assert {short_resolves(name) for name in ("pd.DataFrame", "frame.columns", "store.view", "np.nan")} == {None}
    assert tail_resolves("figures/chart_memo") and tail_resolves("dashboard/entry/app.py")
    assert not tail_resolves("live/assets/")
