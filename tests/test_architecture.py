"""The shape of the code: layers that import only downward, no import loops, small modules,
words about the project only, and one formatter.

The import graph is read from the source (every ``import`` and ``from ... import``, at module
level and inside functions; ``if TYPE_CHECKING:`` blocks are left out, as they never run).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("policies", "runtime", "autotune")
"""The layers, lowest first: a package may import its own layer and the ones before it."""
AUTOTUNE_LAYERS = ("tuning", "control", "wrap", "workflows", "cli")
"""``autotune``'s subpackages, lowest first, with the same rule."""
MAX_LINES = 400
CODE_DIRS = ("autotune", "runtime", "policies", "bench", "examples", "tests")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for package in PACKAGES
        for p in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules ``module`` imports (a ``from X import y`` of a submodule ``X.y``
    counts as importing ``X.y``)."""
    here = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = _imports(tree, name, path.name == "__init__.py", known)
        graph[name] = {d for d in deps if d != name}
    return graph


def _layer(module: str) -> tuple[int, int]:
    parts = module.split(".")
    top = PACKAGES.index(parts[0])
    if parts[0] == "autotune" and len(parts) > 1 and parts[1] in AUTOTUNE_LAYERS:
        return top, AUTOTUNE_LAYERS.index(parts[1])
    return top, len(AUTOTUNE_LAYERS) if parts[0] == "autotune" else 0


def test_layers_import_only_downward():
    """policies -> runtime -> autotune, and inside autotune tuning -> control -> wrap ->
    workflows -> cli (autotune's top-level modules, such as the ``client`` API, sit above)."""
    upward = []
    for module, deps in _graph().items():
        for dep in deps:
            if dep == "autotune" or module == "autotune":
                continue  # the package's own version string
            if _layer(dep) > _layer(module):
                upward.append(f"{module} imports {dep}")
    assert not upward, "imports that go up a layer:\n" + "\n".join(sorted(upward))


def test_the_checks_see_an_upward_import_and_a_loop():
    """The graph reader itself: a runtime module importing autotune is seen, and so is a
    loop, however deep inside a function the import sits."""
    src = "def f():\n    from autotune.tuning import knobs\n"
    deps = _imports(ast.parse(src), "runtime.x", False, {"autotune.tuning.knobs"})
    assert deps == {"autotune.tuning.knobs"}
    assert _layer("autotune.tuning.knobs") > _layer("runtime.x")
    assert _cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == [["a.x", "a.y", "a.z"]]
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import autotune.cli\n"
    assert _imports(ast.parse(guarded), "runtime.x", False, set()) == set()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return groups


def test_no_import_loops():
    loops = _cycles(_graph())
    assert not loops, "import loops:\n" + "\n".join(" <-> ".join(g) for g in loops)


def test_no_code_module_is_over_400_lines():
    long = []
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


# Words about how the work on the project was organised, not about the project; spelled in
# pieces so that this file does not hold them itself.
_WORK_WORDS = re.compile(
    r"\b(?:"
    + "|".join(
        [
            "le" + "ases?",
            "le" + "ased",
            "le" + "nt",
            "dev" + r"ice\s+commands?",
            "sit" + "tings?",
            "is" + r"sue\s+[0-9]+",
        ]
    )
    + r")\b",
    re.IGNORECASE,
)
_TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".json", ".yaml", ".yml", ".cfg"}


def test_the_project_speaks_of_itself_alone():
    hits = []
    paths = [ROOT / "README.md"]
    for folder in ("docs", "bench", "tests", "autotune", "runtime", "policies", "examples"):
        paths += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in _TEXT_SUFFIXES)
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _WORK_WORDS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "words about how the work was organised:\n" + "\n".join(hits)


def _ruff() -> list[str]:
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.importorskip("ruff", reason="ruff is a dev dependency: pip install -e '.[dev]'")
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("check", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_is_clean(check):
    """``ruff check`` and ``ruff format --check`` over the whole tree (the code style)."""
    out = subprocess.run(
        [*_ruff(), *check, "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_no_formatter_suppressions():
    """``ruff format`` wins: no ``fmt: skip``/``fmt: off`` markers in the code."""
    marker = re.compile(r"#\s*fmt:\s*(?:skip|off)\b")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in CODE_DIRS
        for p in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if marker.search(line) and p.name != Path(__file__).name
    ]
    assert not found, "formatter suppressions: " + ", ".join(found)
