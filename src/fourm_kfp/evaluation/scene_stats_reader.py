"""Per-scene statistics read back from their JSON (``stats.to_json()``): the model gate reads a champion's saved
scene statistics so.

The JSON names its family by ``kind``; this table maps each kind to the family's metrics of the summed columns
(:class:`~.scene_stats.SummedStats`), or to :class:`~.detection_metrics.DetectionStats`. The kinds are part of
saved evaluations: a new family adds a kind here, and a kind is never renamed.
"""

from __future__ import annotations

from typing import Any, Mapping

from fourm_kfp.evaluation.caption_metrics import caption_finish
from fourm_kfp.evaluation.dense_metrics import depth_finish, features_finish, normal_finish, semseg_finish
from fourm_kfp.evaluation.detection_metrics import DetectionStats
from fourm_kfp.evaluation.label_metrics import edges_finish, metadata_finish, palette_finish
from fourm_kfp.evaluation.masked_modeling_stats import masked_finish
from fourm_kfp.evaluation.micro_f1 import f1_precision_recall_finish
from fourm_kfp.evaluation.scene_stats import Finish, SceneStats, SummedStats

#: The metrics of each kind of summed statistics.
FINISH_BY_KIND: dict[str, Finish] = {
    "depth": depth_finish, "normal": normal_finish, "semseg": semseg_finish, "f1": caption_finish,
    "set_f1": f1_precision_recall_finish, "masked": masked_finish, "edges": edges_finish,
    "palette": palette_finish, "metadata": metadata_finish, "features": features_finish}


def read_scene_stats(doc: Mapping[str, Any]) -> SceneStats:
    """The statistics ``doc`` (``stats.to_json()``) was written from."""
    if doc["kind"] == DetectionStats.kind:
        return DetectionStats.read(doc)
    return SummedStats.read(doc, FINISH_BY_KIND[doc["kind"]])
