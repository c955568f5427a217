"""The one list of the job parameters (docs/cluster.md, "The job parameters") names every pipeline parameter that
sizes or places a job, a stage's (``<stage>_<field>``) or the run's; the README and manifests/README.md link to it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
JOB_STAGES = ("pretrain", "train_tokenizers")
#: pipeline parameters that are not a job's: what to run and where to record it, and each stage's own controls
GENERAL = {"preset", "config_overrides", "store_uri", "s3_endpoint", "mlflow_tracking_uri", "mlflow_parent_run_id",
           "run_label"}
STAGE_CONTROLS = ("_force", "_width", "_config_overrides")


def _pipeline_parameters() -> set[str]:
    spec = next(yaml.safe_load_all((REPO / "pipelines" / "fourm_pretrain.yaml").read_text()))
    return set(spec["root"]["inputDefinitions"]["parameters"])


def _documented() -> set[str]:
    text = (REPO / "docs" / "cluster.md").read_text()
    section = text.split("### The job parameters\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| ([^|]+) \|", section, flags=re.MULTILINE)
    return {name for row in rows for name in re.findall(r"`([<>\w]+)`", row)}


def test_every_job_parameter_of_the_pipeline_is_in_the_list():
    documented = _documented()
    missing = []
    for name in sorted(_pipeline_parameters() - GENERAL):
        if name.endswith(STAGE_CONTROLS):
            continue
        stage = next((s for s in JOB_STAGES if name.startswith(f"{s}_")), None)
        listed = f"<stage>_{name[len(stage) + 1:]}" if stage else name
        if listed not in documented:
            missing.append(name)
    assert not missing, f"job parameters of the pipeline missing from docs/cluster.md's list: {missing}"


def test_the_list_names_no_parameter_the_pipeline_lacks():
    parameters = _pipeline_parameters()
    stale = sorted(name for name in _documented() if not any(
        name.replace("<stage>", stage) in parameters for stage in JOB_STAGES))
    assert not stale, stale


def test_the_readme_and_the_cluster_setup_link_to_the_list():
    for page in ("README.md", "manifests/README.md"):
        assert "cluster.md#the-job-parameters" in (REPO / page).read_text(), page
