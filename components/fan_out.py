"""The fan-out steps of every fan-out stage (prepare-data, label, pretokenize): the items its ``dsl.ParallelFor``
iterates over, and (for a stage whose work may want an accelerator: label) the kind of pod its workers get.

Two components, each with one output: kfp.local's orchestrator does not iterate over a named output of a component
with several (kfp 2.17: "Parent pipeline input argument 'pipelinechannel--fan-out-items' not found")."""

from typing import List

from kfp import dsl

from fourm_kfp.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def fan_out(stage: str, width: int, preset: str, config_overrides: list, parent_run_id: str, dataset: str = "",
            tokenizers_uri: str = "") -> List[dict]:
    """One item per part of ``stage``, each carrying what its worker needs from upstream (kfp.local resolves
    upstream outputs inside a loop of width > 1 to the loop item, so they travel in it)."""
    from fourm_kfp.launchers.kfp_runtime import fan_out_items

    carried = {"parent_run_id": parent_run_id, "dataset": dataset, "tokenizers_uri": tokenizers_uri}
    return fan_out_items(stage, width, preset, config_overrides, carried)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def worker_pods(stage: str, preset: str, config_overrides: list, accelerator: str) -> str:
    """``gpu`` when ``stage``'s work wants an accelerator under this config (a teacher labeler) and the run's
    ``accelerator`` is not ``cpu``, else ``cpu``."""
    from fourm_kfp.launchers.kfp_runtime import worker_pods as kind

    return kind(stage, preset, config_overrides, accelerator)
