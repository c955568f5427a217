"""Packaging: the wheel installs only the `fourm_kfp` namespace, with configs and the compiled pipeline."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO / "src").parts) for p in (REPO / "src").rglob("__init__.py")}
    found |= {"fourm_kfp.components", "fourm_kfp.pipelines", "fourm_kfp.manifests"}
    assert found == listed


def test_wheel_has_no_generic_top_level_names(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("fourm_kfp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"fourm_kfp", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "fourm_kfp/components/prepare_data.py" in names
    assert "fourm_kfp/pipelines/fourm_pretrain.yaml" in names
    assert "fourm_kfp/configs/smoke/train.yaml" in names
    assert {"fourm_kfp/manifests/base/pytorchjob-template.yaml", "fourm_kfp/manifests/base/trainjob-template.yaml"} \
        <= set(names)  # the launcher renders its jobs from them
    assert "fourm_kfp/manifests/base/rbac.yaml" in names  # fourm-kfp doctor checks the launcher's Role against it
    assert not [n for n in names if n.startswith("fourm_kfp/manifests/") and "template" not in n
                and not n.endswith(("__init__.py", "base/rbac.yaml"))]  # the templates and the Role: no Secrets
    entry_points = [n for n in names if n.endswith("entry_points.txt")]
    assert "fourm-kfp = fourm_kfp.cli:main" in zipfile.ZipFile(wheel).read(entry_points[0]).decode()


def test_cli_works_from_any_directory(tmp_path):
    exe = Path(sys.executable).parent / "fourm-kfp"
    out = subprocess.run([str(exe), "config", "--preset", "smoke", "--set", "data.image_size=32"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert "image_size: 32" in out
    bad = subprocess.run([str(exe), "config", "--set", "data.image_size=x"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "data.image_size: expected an integer" in bad.stderr
    assert "Traceback" not in bad.stderr


def _requirement_name(requirement: str) -> str:
    import re

    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_launch_extra_holds_torchxs_requirements_but_its_stale_urllib3_bound():
    """torchx cannot be an extra itself: its `urllib3<1.27` contradicts kfp's urllib3 pin and pip would refuse the
    extra. So `launch` lists the rest of what torchx requires (read from the installed torchx's metadata), and
    torchx goes in with --no-deps, as the Makefile and `fourm-kfp launch`'s message say."""
    from importlib.metadata import requires

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    launch = {_requirement_name(r) for r in project["optional-dependencies"]["launch"]}
    core = {_requirement_name(r) for r in project["dependencies"]}
    needed = {_requirement_name(r) for r in requires("torchx") if "extra ==" not in r}
    assert "urllib3" in needed and "torchx" not in launch
    assert launch == needed - core - {"urllib3"}
    makefile = (REPO / "Makefile").read_text()
    assert '-e ".[dev,launch]"' in makefile and "--no-deps -c constraints.txt torchx" in makefile


def test_webdataset_is_no_dependency_and_no_module_imports_it():
    import ast

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    assert "webdataset" not in {_requirement_name(r) for r in requirements}
    for path in [*(REPO / "src").rglob("*.py"), *(REPO / "components").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] == "webdataset"], path
