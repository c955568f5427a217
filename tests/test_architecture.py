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
import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: The floors, lowest first (docs/ARCHITECTURE.md). A top-level name (a subpackage or a module at the package root)
#: may import any name of a lower floor, and none of its own floor's other entries.
FLOORS: list[set[str]] = [
    {"__init__", "errors", "progress", "console", "distributed", "hardware", "allocator", "manifests"},
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
    {"cli"},
]


#: The public API (docs/ARCHITECTURE.md, "The public API"): the modules code outside the package may import. Everything
#: else is internal and moves with the package.
PUBLIC_API = {
    "fourm_kfp.cli",  # the command line (main)
    "fourm_kfp.config.loader",  # load_config: a preset with its overrides
    "fourm_kfp.storage",  # open_store and the Store interface
    "fourm_kfp.tokenizers.bundle",  # load_tokenizers: a train-tokenizers output
    "fourm_kfp.model.saved_model",  # load_model: a pretrain output
    "fourm_kfp.evaluation.any_to_any",  # AnyToAny: any-to-any generation with a model and its tokenizers
    "fourm_kfp.model.ml4m",  # ml-4m's checkpoint format, both ways
    "fourm_kfp.labelers.base",  # a labeler plug-in's interface
    "fourm_kfp.labelers.registry",  # the labelers installed
    "fourm_kfp.testing",  # the tests' and benches' fixtures: a local S3 endpoint, random teacher folders
}
EXPERIMENTS = REPO / "experiments"


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
    assert "fourm_kfp.launchers.kfp_steps" in graph["fourm_kfp.components.pretrain"]


#: The longest a component's body may be (docs/ARCHITECTURE.md): the work is in the launchers, not in the component.
COMPONENT_BODY_LINES = 20


def _component_bodies() -> dict[str, int]:
    """``<file>:<function>`` -> the lines of its body (the docstring not counted), for each function of components/."""
    lengths = {}
    for path in sorted((REPO / "components").glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                lengths[f"{path.name}:{node.name}"] = body[-1].end_lineno - body[0].lineno + 1 if body else 0
    return lengths


def test_a_component_body_is_short():
    lengths = _component_bodies()
    assert "pretrain.py:pretrain" in lengths
    long = {name: lines for name, lines in lengths.items() if lines > COMPONENT_BODY_LINES}
    assert not long, f"component bodies over {COMPONENT_BODY_LINES} lines (move the work to launchers/): {long}"


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


def _internal_imports(path: Path) -> list[str]:
    """The internal ``fourm_kfp`` modules (not of :data:`PUBLIC_API`) a script outside the package imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "fourm_kfp" and a.name not in PUBLIC_API}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fourm_kfp":
            found |= {f"{node.module}.{a.name}" if node.module == "fourm_kfp" else node.module for a in node.names
                      if node.module not in PUBLIC_API and f"{node.module}.{a.name}" not in PUBLIC_API}
    return sorted(found)


def _pin(script: Path) -> Path | None:
    """The ``COMMIT`` file that pins ``script``'s folder (or the nearest folder above it, up to experiments/)."""
    for folder in script.parents:
        if (folder / "COMMIT").is_file():
            return folder / "COMMIT"
        if folder == EXPERIMENTS:
            return None
    return None


def _pinned_commit(pin: Path) -> str:
    lines = [line.strip() for line in pin.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert lines and re.fullmatch(r"[0-9a-f]{40}", lines[0]), f"{pin}: the first line is not a full commit id"
    return lines[0]


def test_the_public_api_is_the_documented_one():
    """Each module of PUBLIC_API is named in docs/ARCHITECTURE.md's section on the public API, and exists."""
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = doc.split("## The public API", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(fourm_kfp(?:\.\w+)+)`", section))
    assert named == PUBLIC_API
    missing = [module for module in sorted(PUBLIC_API) if importlib.util.find_spec(module) is None]
    assert not missing, missing


def test_the_example_plug_in_uses_only_the_public_api():
    scripts = sorted((REPO / "examples").rglob("*.py"))
    assert scripts
    internal = [f"{s.relative_to(REPO)}: {m}" for s in scripts for m in _internal_imports(s)]
    assert not internal, internal


def test_experiments_use_the_public_api_or_are_pinned_to_a_commit():
    """An experiment script that imports an internal module runs against the package of the commit its folder is
    pinned to (``COMMIT``, experiments/run.sh), never against today's: the lab is outside the package's import
    graph, and a refactor of the package has nothing to change there."""
    unpinned = []
    for script in sorted(EXPERIMENTS.rglob("*.py")):
        internal = _internal_imports(script)
        if internal and _pin(script) is None:
            unpinned.append(f"{script.relative_to(REPO)}: {', '.join(internal)}")
    assert not unpinned, "experiment scripts that import internals but are pinned to no commit:\n  " + \
        "\n  ".join(unpinned)


def _in_history(commit: str) -> bool:
    return subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


def test_a_pinned_script_is_the_one_of_its_commit():
    """experiments/run.sh runs this tree's copy of a script against its commit's package: the copy must be the
    commit's (an edited script is pinned again, to a commit that holds the edit). Checked where the clone has the
    commit."""
    pins = sorted(EXPERIMENTS.rglob("COMMIT"))
    assert pins
    checked = 0
    for pin in pins:
        commit = _pinned_commit(pin)
        if not _in_history(commit):
            continue
        scripts = [str(p.relative_to(REPO)) for p in pin.parent.rglob("*") if p.suffix in (".py", ".sh")]
        changed = subprocess.run(["git", "-C", str(REPO), "diff", "--name-only", commit, "--", *scripts],
                                 capture_output=True, text=True, check=True).stdout.split()
        assert not changed, f"{pin.parent.relative_to(REPO)}: scripts changed since {commit}: {changed}"
        checked += 1
    if not checked:
        pytest.skip("a shallow clone: no pinned commit is in its history")
