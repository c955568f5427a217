"""The steps that shape the others: the items a fan-out stage's ``dsl.ParallelFor`` iterates over (prepare-data,
label, pretokenize; a forced stage's output is cleared there, once, before its workers start), and where a step's pod
runs (:func:`pod_placement`: accelerator, node selector, tolerations, CPU and memory, resolved by the backend at run
time, so one step serves the CPU and the GPU case).

``fan_out`` has one output: kfp.local's orchestrator does not iterate over a named output of a component with several
(kfp 2.17: "Parent pipeline input argument 'pipelinechannel--fan-out-items' not found")."""

from typing import List, NamedTuple

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def fan_out(stage: str, width: int, preset: str, config_overrides: list, store_uri: str, s3_endpoint: str,
            force: bool, parent_run_id: str, dataset: str = "", tokenizers_uri: str = "") -> List[dict]:
    """One item per part of ``stage``, each carrying what its worker needs from upstream (kfp.local resolves
    upstream outputs inside a loop of width > 1 to the loop item, so they travel in it); with ``force``, first
    clears the stage's output once, so that the workers recompute it."""
    from fourm_kfp.launchers.kfp_placement import fan_out_items

    carried = {"parent_run_id": parent_run_id, "dataset": dataset, "tokenizers_uri": tokenizers_uri}
    return fan_out_items(stage, width, preset, config_overrides, store_uri, s3_endpoint, force, carried)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def pod_placement(stage: str, preset: str, config_overrides: list, accelerator: str, gpu_node_selector: dict,
                  gpu_tolerations: list, launcher: str = "in-pod") -> NamedTuple(
        "Outputs", [("accelerator", str), ("node_selector", dict), ("tolerations", list), ("cpu_limit", str),
                    ("memory_limit", str)]):
    """Where ``stage``'s step (or workers) run: the accelerator to request ("" = none), node selector, tolerations,
    CPU and memory limits, which the backend resolves into the pod at run time."""
    from collections import namedtuple

    from fourm_kfp.launchers.kfp_placement import pod_placement as placement

    values = placement(stage, preset, config_overrides, accelerator, gpu_node_selector, gpu_tolerations, launcher)
    return namedtuple("Outputs", list(values))(**values)
