"""The steps that shape the others: a fan-out stage's items (its ``dsl.ParallelFor``; a forced stage is cleared
there, once) and where a placed step's pod runs (accelerator, node selector, tolerations, CPU and memory), both
answered at run time from the config."""

from __future__ import annotations

from typing import Sequence

from fourm_kfp.cluster.job_spec import GPU_TOLERATION, IN_POD, check_launcher, param_prefix
from fourm_kfp.config.loader import load_config
from fourm_kfp.launchers.stage import RunContext, clear_stage_output

def fan_out_items(stage: str, width: int, preset: str, config_overrides: Sequence[str], store_uri: str,
                  s3_endpoint: str, force: bool, carried: dict) -> list[dict]:
    """The items of a fan-out stage's ``dsl.ParallelFor``: one per part, each carrying ``carried`` (kfp.local
    resolves upstream outputs inside a loop of width > 1 to the loop item, so they travel in it).

    ``force`` (``<stage>_force``) clears the stage's output here, once, before any worker starts: each worker then
    finds nothing committed and computes its own part, and the collect step commits what they wrote, as in a first
    run at that width (the collect step itself never forces: it would recompute every part in one process)."""
    if width < 1:
        raise ValueError(f"{param_prefix(stage)}_width must be >= 1, got {width}")
    load_config(preset, overrides=list(config_overrides))  # a bad config fails here, before the workers
    if force:
        cleared = clear_stage_output(stage, RunContext(preset, config_overrides, store_uri, s3_endpoint))
        print(f"{param_prefix(stage)}_force: cleared {cleared} objects of {stage}'s output; its {width} workers "
              "recompute it", flush=True)
    return [{"part": i, **carried} for i in range(width)]


#: CPU and memory limits of a job stage's step when it only launches and follows its job (``<stage>_launcher`` a job
#: kind); a step that works itself has its stage's (``StageSpec.step_resources``).
LAUNCHER_RESOURCES = ("1", "2Gi")


def pod_placement(stage: str, preset: str, config_overrides: Sequence[str], accelerator: str,
                  gpu_node_selector: dict, gpu_tolerations: list, launcher: str = IN_POD) -> dict:
    """Where a step of ``stage`` runs, as values the KFP backend resolves into its pod at run time: ``accelerator``
    (the resource to request one of, "" = none), ``node_selector``, ``tolerations``, ``cpu_limit`` and
    ``memory_limit``.

    One step serves the CPU and the GPU case (no ``dsl.If`` branches: before KFP 2.17 a branch holding a loop never
    completes and its ``dsl.OneOf`` join fails). It requests the run's ``accelerator`` (the ``<stage>_accelerator``
    or ``pretrain_accelerator`` parameter, "cpu" = none) when its work wants one: a label worker only for a teacher
    network (``StageSpec.wants_accelerator``), a job stage only when it trains in its own pod (as a job's launcher it
    is a light CPU pod). A pod with an accelerator gets its taint's toleration, ``gpu_tolerations`` and
    ``gpu_node_selector``; one without gets none of them, so it never lands on a GPU node."""
    from fourm_kfp.stages import get_stage

    spec, config = get_stage(stage), load_config(preset, overrides=list(config_overrides))
    launches_job = check_launcher(launcher, stage) != IN_POD
    wants = not launches_job and (spec.wants_accelerator is None or (spec.is_enabled(config)
                                                                     and spec.wants_accelerator(config)))
    resource = "" if accelerator in ("", "cpu") or not wants else accelerator
    cpu, memory = LAUNCHER_RESOURCES if launches_job else spec.step_resources
    return {"accelerator": resource,
            "node_selector": dict(gpu_node_selector) if resource else {},
            "tolerations": [{**GPU_TOLERATION, "key": resource}, *gpu_tolerations] if resource else [],
            "cpu_limit": cpu, "memory_limit": memory}
