"""Adding a stage. Its cluster side needs its entry in the stage table and nothing beside it: where its pods run (CPU
and memory), whether it may run as a cluster job and with which defaults, its job's name and render all read the
entry (before, the pods' resources and the job stages were two more tables keyed by stage name, and a new stage
failed with a KeyError in the placement step). The whole stage is its body, that entry, its KFP component, its config
section and its line in the pipeline: added in those places of a copy of the package, it runs in the pipeline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: A scratch stage as a newcomer would add it: a table entry (its body is never called here).
NEW_STAGE = """
import json
from fourm_kfp import stages
from fourm_kfp.contract.spec import StageSpec

stages.STAGES["distill"] = StageSpec(name="distill", run=lambda ctx: None, config_keys=("train",),
                                     upstream=(stages.PRETOKENIZE, stages.TRAIN_TOKENIZERS),
                                     step_resources=("4", "8Gi"), job_launcher="trainjob")
stages.STAGES["count-scenes"] = StageSpec(name="count-scenes", run=lambda ctx: None, config_keys=("data",),
                                          upstream=(stages.PREPARE_DATA,), step_resources=("2", "3Gi"))

from fourm_kfp.cluster.job_kinds import render_job
from fourm_kfp.cluster.job_spec import JOB_STAGES, JobRequest
from fourm_kfp.launchers.kfp_placement import pod_placement

job = render_job(JobRequest(launcher=JOB_STAGES["distill"].launcher, stage="distill", address="0123abcd",
                            stage_args=["stage", "distill"], image="registry.example/fourm:1"))
print(json.dumps({
    "job_stages": {name: params.launcher for name, params in JOB_STAGES.items()},
    "job": [job["kind"], job["metadata"]["name"]],
    "in_pod": pod_placement("distill", "smoke", [], "nvidia.com/gpu", {}, [], "in-pod"),
    "as_job": pod_placement("distill", "smoke", [], "nvidia.com/gpu", {}, [], "trainjob"),
    "cpu_stage": pod_placement("count-scenes", "smoke", [], "nvidia.com/gpu", {}, []),
}))
"""


def test_a_stage_added_to_the_table_is_placed_and_runs_as_a_job_with_nothing_else_edited():
    proc = subprocess.run([sys.executable, "-c", NEW_STAGE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["job_stages"] == {"train-tokenizers": "in-pod", "pretrain": "pytorchjob", "distill": "trainjob"}
    assert found["job"] == ["TrainJob", "fourm-distill-0123abcd"]
    in_pod, as_job, cpu_stage = found["in_pod"], found["as_job"], found["cpu_stage"]
    assert (in_pod["cpu_limit"], in_pod["memory_limit"], in_pod["accelerator"]) == ("4", "8Gi", "nvidia.com/gpu")
    assert (as_job["cpu_limit"], as_job["memory_limit"], as_job["accelerator"]) == ("1", "2Gi", "")  # a launcher
    assert (cpu_stage["cpu_limit"], cpu_stage["memory_limit"]) == ("2", "3Gi")


# --- A whole new stage, as the stage table's docstring lists its parts, run by the pipeline ---------------------------

#: The body (``stages/count_scenes.py``): how many scenes each split holds and their mean rgb, from the dataset.
BODY = '''"""The count-scenes stage: how many scenes each split of the dataset holds, and their mean rgb value."""

import json

import numpy as np

from fourm_kfp.contract.spec import StageResult
from fourm_kfp.data.shard_stream import iter_split


def run(ctx):
    counts = {}
    for split in ctx.config.count_scenes.splits:
        means = [float(np.asarray(sample["rgb"], dtype=np.float64).mean())
                 for _, sample in iter_split(ctx.dataset, split, ["rgb"])]
        counts[split] = {"scenes": len(means), "mean_rgb": round(sum(means) / max(len(means), 1), 6)}
    ctx.output.put_bytes("scene_counts.json", json.dumps(counts, indent=2, sort_keys=True).encode())
    return StageResult(counts={split: c["scenes"] for split, c in counts.items()},
                       metrics={f"{split}.scenes": float(c["scenes"]) for split, c in counts.items()})
'''
#: Its entry in the stage table, before the pipeline's order (which it joins last).
ENTRY = '''COUNT_SCENES = StageSpec(name="count-scenes", run=_body("count_scenes"), config_keys=("count_scenes",),
                         upstream=DATASET, step_resources=("1", "2Gi"), wants_accelerator=lambda config: False)

'''
#: Its config section: the schema's dataclass (the preset's ``count_scenes.yaml`` may be absent: the defaults).
SECTION = '''@dataclass(frozen=True)
class CountScenesConfig:
    """The count-scenes stage."""

    splits: tuple[str, ...] = option(("train", "val"), "the splits to count")


'''
#: Its KFP component (``components/count_scenes.py``).
COMPONENT = '''"""The count-scenes component."""

from typing import NamedTuple

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def count_scenes(preset: str, config_overrides: list, store_uri: str, s3_endpoint: str, mlflow_tracking_uri: str,
                 parent_run_id: str, force: bool, dataset: str
                 ) -> NamedTuple("Outputs", [("output_uri", str), ("result", str)]):
    """Count the dataset's scenes; outputs the committed output's URI and the stage outcome."""
    import json
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_dataset import dataset_uris
    from fourm_kfp.launchers.kfp_steps import run_stage_component

    outcome = run_stage_component("count-scenes", preset, config_overrides, store_uri, s3_endpoint,
                                  mlflow_tracking_uri, parent_run_id, force, input_uris=dataset_uris(dataset))
    return namedtuple("Outputs", ["output_uri", "result"])(outcome.output_uri, json.dumps(outcome.to_dict()))
'''
#: Its line in the pipeline (after evaluate's), with the import and the ``<stage>_force`` parameter every stage has.
PIPELINE_LINE = ('        _placed(cluster.env(count_scenes(force=count_scenes_force, dataset=dataset, **shared)),\n'
                 '                placement("count-scenes", "cpu")).set_display_name("count-scenes")\n')


def _edit(path: Path, anchor: str, new: str, before: bool = False) -> None:
    """Put ``new`` after ``anchor`` (or ``before`` it), which must occur once in ``path`` (else the test names the
    anchor that moved)."""
    text = path.read_text()
    assert text.count(anchor) == 1, f"{path.name}: {anchor!r} is not there once any more: update this test"
    path.write_text(text.replace(anchor, new + anchor if before else anchor + new))


def _package_with_a_new_stage(root: Path) -> Path:
    """A copy of the package, laid out as installed (components, pipelines and manifests inside it), with the
    count-scenes stage added in its five places; returns the folder to put on ``PYTHONPATH``."""
    package = root / "fourm_kfp"
    shutil.copytree(REPO / "src" / "fourm_kfp", package, ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("components", "pipelines", "manifests"):
        shutil.copytree(REPO / folder, package / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "stages" / "count_scenes.py").write_text(BODY)
    (package / "components" / "count_scenes.py").write_text(COMPONENT)
    table = package / "stages" / "__init__.py"
    _edit(table, "    run_records=(GATE_FILE, \"reports/model_gate.md\"),\n)\n\n", ENTRY)
    _edit(table, "PRETRAIN, EVALUATE", ", COUNT_SCENES")
    config = package / "config" / "fourm_config.py"
    _edit(config, "SECTIONS: dict[str, type] = {\n", SECTION, before=True)
    _edit(config, '    "evaluate": EvaluateConfig,\n', '    "count_scenes": CountScenesConfig,\n')
    _edit(config, "    evaluate: EvaluateConfig\n", "    count_scenes: CountScenesConfig\n")
    pipeline = package / "pipelines" / "fourm_pretrain.py"
    _edit(pipeline, "from fourm_kfp.components.evaluate import evaluate\n",
          "from fourm_kfp.components.count_scenes import count_scenes\n")
    _edit(pipeline, "    evaluate_force: bool = False,\n", "    count_scenes_force: bool = False,\n")
    _edit(pipeline, '_placed(evaluation, placement("evaluate", pretrain_accelerator)).set_display_name("evaluate")\n',
          PIPELINE_LINE)
    return root


@pytest.mark.slow
def test_a_new_stage_is_a_body_a_table_entry_a_component_a_config_section_and_a_pipeline_line(fresh_smoke_run,
                                                                                               tmp_path):
    """The count-scenes stage added to a copy of the package in the five places the stage table's docstring names,
    and nowhere else: the CLI knows it, its config section loads from a preset without its file, and
    ``fourm-kfp run`` on a copy of the shared smoke run reuses its five stages and computes the new one in the
    pipeline (kfp.local), from the dataset it declares, with its section's values (set on the command line) in its
    manifest."""
    site = _package_with_a_new_stage(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    root = tmp_path / "run"
    shutil.copytree(fresh_smoke_run["root"], root, ignore=shutil.ignore_patterns("summary-*.json"))
    cli = [sys.executable, "-m", "fourm_kfp.cli"]

    usage = subprocess.run([*cli, "stage", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert "count-scenes" in usage.stdout, usage.stdout + usage.stderr

    summary_path = tmp_path / "summary.json"
    proc = subprocess.run([*cli, "run", "--preset", "smoke", "--root", str(root), "--summary", str(summary_path),
                           "--set", "count_scenes.splits=[val, train]"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    stages = {s["name"]: s for s in json.loads(summary_path.read_text())["stages"]}
    before = {s["name"]: s["output_uri"].rsplit("/", 1)[-1] for s in fresh_smoke_run["stages"]}
    # in the order they started (count-scenes needs only the dataset); the smoke preset's label stage is off
    assert sorted(stages) == sorted([*before, "count-scenes"])
    assert {name: s["status"] for name, s in stages.items()} == {**dict.fromkeys(before, "skipped"),
                                                                 "count-scenes": "ran"}
    assert all(stages[name]["output_uri"].endswith(address) for name, address in before.items())

    output = Path(stages["count-scenes"]["output_uri"])
    counts = json.loads((output / "scene_counts.json").read_text())
    data = json.loads((Path(stages["prepare-data"]["output_uri"]) / "_MANIFEST.json").read_text())["counts"]
    assert {split: c["scenes"] for split, c in counts.items()} == {
        split: data["splits"][split]["samples"] for split in ("train", "val")}
    assert 0.0 < counts["val"]["mean_rgb"] != counts["train"]["mean_rgb"]
    manifest = json.loads((output / "_MANIFEST.json").read_text())
    assert manifest["config"] == {"count_scenes": {"splits": ["val", "train"]}}
    assert [i["name"] for i in manifest["inputs"]] == ["prepare-data"]
