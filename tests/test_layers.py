"""The house's floors: every import of a verispec module goes down (or sideways within a floor), there is no import
circle, and only the CLI imports verispec modules inside functions (for start-up time). Read from the source with
``ast``, so a function-level import cannot hide an arrow that runs up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "verispec"

#: bottom to top; a module belongs to the floor of its longest matching prefix
FLOORS: list[tuple[str, ...]] = [
    ("registry", "defaults", "options", "compat"),
    ("core",),
    ("analysis", "backends", "models", "eval.tasks", "eval.sandbox", "eval.metrics", "eval.store", "eval.stats",
     "integrations"),
    ("drafters",),
    ("runtime",),
    ("api", "toy"),
    # vLLM's sweep engine and certification sit with the harness: they use the runtime's types, the analysis and
    # the test statistics, while the plug-in itself stays on the floor of the rules it imports
    ("eval", "server", "audit", "integrations.vllm.engine", "integrations.vllm.certify", "integrations.lmeval"),
    ("studies",),
    ("cli", "__main__"),
    # the test suite's helpers: imported by tests only (no production module may import them)
    ("testing",),
]
#: where verispec modules may be imported inside functions: the CLI (start-up time) and the integrations (their
#: patches import the host engine, which exists only in the host's processes)
LAZY_OK = ("cli", "integrations")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor_of(module: str) -> int:
    best, floor = -1, None
    for i, prefixes in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, floor = len(p), i
    if floor is None:
        raise AssertionError(f"verispec.{module} belongs to no floor: add it to FLOORS")
    return floor


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported verispec module, at function level?) for every import in ``path``, TYPE_CHECKING blocks aside."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = nested or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module.startswith("verispec."):
                    base = child.module.removeprefix("verispec.")
                    # ``from verispec.a import b``: b may be a submodule of a
                    subs = [f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in _module_names()]
                    out.extend((m, inner) for m in subs or [base])
                elif child.module == "verispec":
                    out.extend((alias.name, inner) for alias in child.names)
            elif isinstance(child, ast.Import):
                out.extend((a.name.removeprefix("verispec."), inner) for a in child.names
                           if a.name.startswith("verispec."))
            visit(child, inner)

    visit(tree, False)
    return out


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py")) if _module_name(p)}


def _module_names() -> set[str]:
    return set(MODULES)


def _resolve(name: str) -> str:
    """``from verispec.x import y``: y may be a submodule (x.y) or a name in x."""
    return name if name in MODULES else name.rsplit(".", 1)[0] if name.rsplit(".", 1)[0] in MODULES else name


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_go_down(module):
    here = floor_of(module)
    for name, nested in _imports(MODULES[module]):
        target = _resolve(name)
        assert floor_of(target) <= here, f"verispec.{module} (floor {here}) imports verispec.{target} " \
                                         f"(floor {floor_of(target)}): an arrow that runs up"
        if nested:
            assert module.startswith(LAZY_OK), f"verispec.{module} imports verispec.{target} inside a function"


def test_no_import_circles():
    graph = {m: {_resolve(n) for n, _ in _imports(p)} & set(MODULES) for m, p in MODULES.items()}
    # a package's __init__ re-exporting its submodules is not a circle with them
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    state: dict[str, int] = {}
    path: list[str] = []

    def dfs(m: str) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = path[path.index(t):] + [t]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if t not in state:
                dfs(t)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from verispec.cli.main import main\n")
    assert _imports(bad) == [("cli.main", True)]
    assert floor_of("cli.main") > floor_of("core.rules")


@pytest.mark.parametrize("code", [
    "import verispec",
    "import verispec.eval.report",
    "from click.testing import CliRunner; from verispec.cli.main import main; "
    "assert CliRunner().invoke(main, ['--help']).exit_code == 0",
])
def test_start_up_loads_no_torch(code):
    """`import verispec`, the report module and `verispec --help` load neither torch nor transformers."""
    import subprocess
    import sys

    probe = code + "; import sys; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
