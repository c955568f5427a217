"""The import rules of docs/ARCHITECTURE.md: every import inside the package points down a floor or stays on its own,
and no two modules import each other (directly or round a longer circle), type-only imports included.

Both rules read the source (``ast``), lazy imports inside functions included, so an arrow that runs back up fails
here whether or not it happens to run at import time. The modules are those of the installed layout: every package
pyproject.toml lists, found where the import system finds it, so ``components/`` and ``pipelines/`` (installed as
``fourm_kfp.components`` and ``fourm_kfp.pipelines`` through the package-dir mapping) are checked with the rest.
"""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: The floors, lowest first (docs/ARCHITECTURE.md). A top-level name (a subpackage or a module at the package root)
#: may import any name of a lower floor, and none of its own floor's other entries.
FLOORS: list[set[str]] = [
    {"__init__", "errors", "progress", "console", "distributed", "hardware", "manifests"},
    {"images"},
    {"storage"},
    {"batch"},
    {"data"},
    {"config"},
    {"contract"},
    {"masking"},
    {"model"},
    {"tokenizers"},
    {"train"},
    {"evaluation"},
    {"labelers"},
    {"testing"},
    {"stages"},
    {"cluster"},
    {"launchers"},
    {"components"},
    {"pipelines"},
    {"pipeline_runs"},
    {"cli_help", "cli_completion"},
    {"cli"},
]


def _installed_modules() -> dict[str, Path]:
    """Module name → source file, for every package pyproject.toml installs, each read from the folder the import
    system finds it in (so the package-dir mapping is followed, as in an installed wheel)."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    modules = {}
    for package in packages:
        folder = Path(importlib.import_module(package).__file__).parent
        for path in folder.glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _imports(path: Path) -> set[str]:
    """Every ``fourm_kfp`` module or name ``path`` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "fourm_kfp"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fourm_kfp":
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (``from pkg import module`` counts as importing the module)."""
    modules = _installed_modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(top: str) -> int:
    for level, names in enumerate(FLOORS):
        if top in names:
            return level
    raise AssertionError(f"fourm_kfp.{top} is on no floor: add it to FLOORS in {__file__} and docs/ARCHITECTURE.md")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """``module -> target`` for each import that runs up a floor or sideways on one."""
    found = []
    for module, targets in sorted(graph.items()):
        here = _top(module)
        for target in sorted(targets):
            there = _top(target)
            if here != there and _floor(there) >= _floor(here):
                found.append(f"{module} -> {target}")
    return found


def _circles(graph: dict[str, set[str]]) -> list[str]:
    """Each import circle found by a depth-first walk, as ``a -> b -> ... -> a``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_every_import_points_down_a_floor():
    upward = _upward(_graph())
    assert not upward, "imports that run up or sideways a floor:\n  " + "\n  ".join(upward)


def test_no_module_imports_itself_round_a_circle():
    circles = _circles(_graph())
    assert not circles, "import circles:\n  " + "\n  ".join(circles)


def test_the_top_floor_s_folders_are_checked():
    """components/ and pipelines/ live outside src/ and are installed into the package: they are in the graph."""
    graph = _graph()
    assert "fourm_kfp.components.pretrain" in graph and "fourm_kfp.pipelines.fourm_pretrain" in graph
    assert "fourm_kfp.launchers.kfp_runtime" in graph["fourm_kfp.components.pretrain"]


def test_the_rules_catch_an_arrow_that_runs_up_and_a_circle():
    """The checks can fail: an added upward import, and an added import that closes a circle, are reported."""
    graph = _graph()
    graph["fourm_kfp.masking.token_loader"] |= {"fourm_kfp.stages.evaluate"}
    graph["fourm_kfp.contract.spec"] |= {"fourm_kfp.contract.runner"}
    assert _upward(graph) == ["fourm_kfp.masking.token_loader -> fourm_kfp.stages.evaluate"]
    assert any(c.startswith("fourm_kfp.contract.") and "fourm_kfp.contract.spec" in c for c in _circles(graph))
    # the circle this layout removed: a launcher that imports the pipeline, whose components import the launchers
    graph["fourm_kfp.launchers.stage"] |= {"fourm_kfp.pipelines.fourm_pretrain"}
    assert "fourm_kfp.launchers.stage -> fourm_kfp.pipelines.fourm_pretrain" in _upward(graph)


def test_nothing_of_the_product_imports_the_test_fixtures():
    """``fourm_kfp.testing`` (the local S3 server, random teacher folders) is for the tests and benches alone."""
    importers = sorted(module for module, targets in _graph().items() if "fourm_kfp.testing" in targets)
    assert not importers, f"product modules that import the test fixtures: {importers}"
