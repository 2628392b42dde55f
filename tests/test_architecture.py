"""The house rules, read from the source: no import loops, and no layer imports a higher one.

Every import counts, at module level or inside a function: a lazy import of a higher layer
is still a dependency on it. docs/architecture.md explains the layers.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

PACKAGE = Path(__file__).resolve().parents[1] / "xbench"

# Lowest first. A module may import its own layer's package and anything below; packages of
# one layer above the first do not import each other (kernels and fabric stay independent).
LAYERS = [
    (
        "xbench.errors",
        "xbench.events",
        "xbench.files",
        "xbench.version",
        "xbench.core",
        "xbench.host",
        "xbench.native",
        "xbench.resources",
        "xbench.ranks",
        "xbench.mpi_leftovers",
    ),
    ("xbench.results",),
    ("xbench.fabric", "xbench.kernels"),
    ("xbench.probe", "xbench.fit", "xbench.cluster", "xbench.compare", "xbench.simulate"),
    ("xbench.validate", "xbench.capabilities", "xbench.launches"),
    ("xbench.report",),
    ("xbench.cli",),
]
# The package's own __init__ is the pure public API (the cost model): layer 0.
ROOT_LAYER = 0


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """xbench modules imported by ``path``, resolved to the most specific module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                for a in node.names
            ]
        else:
            continue
        found.update(n for n in names if n == "xbench" or n.startswith("xbench."))
    return found


def _package(module: str) -> str:
    for layer in LAYERS:
        for pkg in layer:
            if module == pkg or module.startswith(pkg + "."):
                return pkg
    return "xbench"


def _layer(module: str) -> int:
    pkg = _package(module)
    if pkg == "xbench":
        return ROOT_LAYER
    return next(i for i, layer in enumerate(LAYERS) if pkg in layer)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_module_has_a_layer():
    unplaced = [m for m in _modules() if m != "xbench" and _package(m) == "xbench"]
    assert not unplaced, f"give these a layer in LAYERS and docs/architecture.md: {unplaced}"


def test_no_layer_imports_a_higher_one_or_a_sibling():
    bad = []
    for module, deps in _graph().items():
        mine, pkg = _layer(module), _package(module)
        for dep in deps:
            theirs, other = _layer(dep), _package(dep)
            if theirs > mine or (theirs == mine > 0 and other != pkg):
                bad.append(f"{module} (layer {mine}) imports {dep} (layer {theirs})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_loops():
    graph = _graph()
    # Package __init__ files re-export their submodules; an edge from a submodule to its own
    # package's __init__ is how Python loads it, not a loop of ours.
    for module in graph:
        graph[module] = {d for d in graph[module] if not module.startswith(d + ".")}
    state: dict[str, int] = {}
    loops = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                loops.append(" -> ".join(stack[stack.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not loops, "\n".join(loops)


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("xbench.core.costmodel", ("numpy", "torch", "mpi4py", "pandas")),
        ("xbench.core.profile", ("numpy", "torch", "mpi4py", "pandas")),
    ],
)
def test_the_cost_model_imports_no_heavy_library(module, forbidden):
    """A serving scheduler imports the predicate without MPI, torch, numpy or a GPU."""
    tree = ast.parse(_modules()[module].read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert not roots & set(forbidden)


def test_the_cli_starts_without_pandas_pyarrow_or_torch():
    """Every run of ``xbench`` (``--help``, a refusal, a probe's ranks' launcher) imports the
    whole command tree first; pandas and pyarrow there would about double its start, torch
    more. The commands import them when they run."""
    code = (
        "import sys; import xbench.cli.app; "
        "print(sorted(m for m in ('pandas', 'pyarrow', 'torch', 'mpi4py') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_summarizing_samples_leaves_scipy_stats_unloaded():
    """probe, kernel and validate summarize their samples (median intervals from a binomial
    CDF); scipy.stats' import would add most of a second to each of those commands.
    compare, which tests hypotheses, imports it when it runs."""
    code = (
        "import sys; import xbench.probe.summary, xbench.kernels.summary, xbench.core.stats; "
        "from xbench.core.stats import summarize; summarize([1.0, 2.0, 3.0, 4.0, 5.0]); "
        "print('scipy.stats' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_fitting_and_reporting_leave_torch_unloaded():
    """fit, report and compare read stored samples; torch (about 1.7 s to import) is for the
    commands that run kernels. Reading the backend registry (which backends a fit skips)
    must not load it through the kernels package."""
    code = (
        "import sys; import xbench.fit.profile_fit, xbench.kernels.summary, xbench.report, "
        "xbench.compare, xbench.kernels.backend; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_refused_decide_answers_before_loading_pandas():
    """``decide`` parses its options before it loads the grid's pandas: a mistyped option
    is answered without waiting for pandas' import, which would double the wait."""
    code = (
        "import sys; from xbench.cli.app import app\n"
        "try:\n    app(['decide', '--payload', '1KB', '--rows', '1,,4'])\n"
        "except SystemExit as stop:\n    print(stop.code, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "2 False", out.stdout + out.stderr
    assert "empty item" in out.stderr


# Standard-library modules added after the lowest Python pyproject.toml admits, by the
# version that added them
NEWER_STDLIB = {"tomllib": (3, 11)}


def test_stdlib_modules_newer_than_the_lowest_python_are_imported_under_a_version_check():
    """``xbench check --config`` imported tomllib unchecked: on Python 3.10, which
    requires-python admits, it was a ModuleNotFoundError traceback. Each such import sits
    under ``if sys.version_info >= ...``."""
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    lowest = tuple(
        int(p) for p in re.search(r'requires-python = ">=(\d+)\.(\d+)"', pyproject).groups()
    )
    newer = {name for name, added in NEWER_STDLIB.items() if added > lowest}
    unchecked = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        checked = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "version_info" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            unchecked += [
                f"{where} {n}"
                for n in names
                if n.split(".")[0] in newer and id(node) not in checked
            ]
    assert not unchecked, unchecked
