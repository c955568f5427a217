"""The stage contract: stage specs, content addressing, the guarded config view, manifests, lineage, the runner
and the planner. This subpackage imports no stage; stages import it."""

from fourm_kfp.contract.context import StageContext, StageInput
from fourm_kfp.contract.runner import StageOutcome, open_inputs, output_store, run_stage, run_stage_part
from fourm_kfp.contract.spec import ExternalSource, StageResult, StageSpec

__all__ = ["ExternalSource", "StageContext", "StageInput", "StageOutcome", "StageResult", "StageSpec",
           "open_inputs", "output_store", "run_stage", "run_stage_part"]
