"""A new stage needs its entry in the stage table and nothing beside it: where its pods run (CPU and memory), whether
it may run as a cluster job and with which defaults, its job's name and render all read the entry (before, the pods'
resources and the job stages were two more tables keyed by stage name, and a new stage failed with a KeyError in
the placement step)."""

from __future__ import annotations

import json
import subprocess
import sys

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
