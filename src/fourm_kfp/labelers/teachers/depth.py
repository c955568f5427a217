"""Depth from transformers' depth-estimation networks (DPT, hybrid DPT, GLPN, Depth Anything v1 and v2, ...).

Config (``label.labelers[]``): ``name: hf_depth``, ``weights``: the model folder, ``params``:

* ``depth`` (required): ``relative`` or ``metric``, as the model was trained: a metric model gives metres, which are
  stored as they are and checked against ``label.max_depth_m``; a relative model's values have no unit;
* ``inverse`` (default false): the model predicts inverse depth (disparity), as MiDaS-trained DPTs and the relative
  Depth Anything models do; it is turned into depth (``1 / d``, with disparities below 1/1000 of the image's largest
  taken as that floor, so the far background is at most 1000 times the nearest depth);
* ``bf16`` (default true): bf16 autocast on a GPU.

A relative depth is then scaled per image so that its largest value is :data:`RELATIVE_DEPTH_TOP` (it is stored in
millimetres in a 16-bit PNG, so the scale keeps about four significant digits), and the dataset records it as
relative: the depth tokenizer standardises it per image, as 4M does its Omnidata depth. Pixels the model gives no
positive depth are invalid (0). NaN stays NaN, so the data gate fails a broken teacher naming it.

ZoeDepth and DepthPro are refused when the labeler is built: their image processors need torchvision, which the
teachers extra and the images do not install (:func:`~fourm_kfp.labelers.teachers.loading.needs_torchvision`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.labelers.base import LabelBatch, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher, auto_model_types, host

#: The largest value of a relative depth map once scaled (below the 65.535 a shard's millimetre PNG holds).
RELATIVE_DEPTH_TOP = 60.0
#: Inverse depth below this fraction of the image's largest is taken as it (the farthest depth is 1000x the nearest).
MIN_DISPARITY_FRACTION = 1e-3


def depth_from_prediction(prediction: np.ndarray, relative: bool, inverse: bool) -> np.ndarray:
    """The stored depth of one post-processed prediction (see the module docstring)."""
    values = np.asarray(prediction, np.float32)
    if inverse:
        top = np.nanmax(values) if values.size else 0.0
        floor = max(float(top) * MIN_DISPARITY_FRACTION, np.finfo(np.float32).tiny)
        values = np.where(values > 0, 1.0 / np.maximum(values, floor), 0.0).astype(np.float32)
    values = np.where(values > 0, values, np.where(np.isnan(values), values, 0.0)).astype(np.float32)
    if relative:
        top = np.nanmax(values) if values.size else 0.0
        if top > 0:
            values = values * np.float32(RELATIVE_DEPTH_TOP / top)
    return values


class DepthTeacher(TransformersTeacher):
    name: ClassVar[str] = "hf_depth"
    version: ClassVar[str] = "1"
    modality = "depth"
    model_class: ClassVar[str] = "AutoModelForDepthEstimation"
    reads_models: ClassVar[str] = "depth-estimation models"
    defaults: ClassVar[Mapping[str, Any]] = {"depth": None, "inverse": False, "bf16": True}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        if self.params["depth"] not in ("relative", "metric"):
            raise LabelerError(f"labeler {self.name!r}: param 'depth' must say what the model predicts, relative or "
                               f"metric, got {self.params['depth']!r}")
        if not isinstance(self.params["inverse"], bool):
            raise LabelerError(f"labeler {self.name!r}: param 'inverse' must be true or false")
        self.relative_depth = self.params["depth"] == "relative"

    def accepted_model_types(self) -> frozenset[str]:
        return auto_model_types("MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES")

    def predict(self, batch: LabelBatch) -> list[np.ndarray]:
        """The processor's post-processed depth of each photo, at the photo's size, float32 ``[H, W]``."""
        outputs = self.forward(batch)
        outputs.predicted_depth = outputs.predicted_depth.float()
        found = self.processor.post_process_depth_estimation(outputs, target_sizes=self.target_sizes(batch))
        return host([item["predicted_depth"] for item in found])

    def label(self, batch: LabelBatch) -> list[Any]:
        values = [depth_from_prediction(p, self.relative_depth, self.params["inverse"]) for p in self.predict(batch)]
        return check_labels(self, batch, values)
