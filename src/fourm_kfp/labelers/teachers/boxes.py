"""Boxes from transformers' object-detection networks (the DETR family, RT-DETR, ...), in 4M's det format.

Config: ``name: hf_det``, ``weights``: the model folder, ``params``: ``threshold`` (default 0.6, 4M-21's score
threshold for its ViTDet boxes), ``max_boxes`` (default 64: the highest-scoring ones, ties in the model's order),
``bf16`` (default true). Boxes come from the processor's ``post_process_object_detection`` at the photo's size,
binned as :func:`fourm_kfp.data.modalities.format_det` bins them, in order of score. A class name is one word of the
det text, so the model's names are written with ``_`` for spaces ("traffic light" -> "traffic_light"); that list
is the det vocabulary the dataset records. A photo with no box above the threshold has no det label (None).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.data.modalities import format_det
from fourm_kfp.labelers.base import LabelBatch, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher, host
from fourm_kfp.labelers.teachers.segmentation import vocabulary


def det_name(name: str) -> str:
    """A class name as one word of the det text."""
    return "_".join(name.split())


class DetectionTeacher(TransformersTeacher):
    name: ClassVar[str] = "hf_det"
    version: ClassVar[str] = "1"
    modality = "det"
    model_class: ClassVar[str] = "AutoModelForObjectDetection"
    defaults: ClassVar[Mapping[str, Any]] = {"threshold": 0.6, "max_boxes": 64, "bf16": True}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        self.check_number("threshold", 0.0, 1.0)
        self.check_number("max_boxes", 1, integer=True)
        self._classes = tuple(det_name(n) for n in vocabulary(self.config, f"labeler {self.name!r}"))
        if len(set(self._classes)) != len(self._classes):
            raise LabelerError(f"labeler {self.name!r}: the model's class names are not distinct once written as one "
                               "word each")

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    def predict(self, batch: LabelBatch) -> list[dict[str, np.ndarray]]:
        """The processor's detections of each photo above the threshold: ``boxes`` (xmin, ymin, xmax, ymax in
        pixels of the photo), ``labels`` (class ids), ``scores``."""
        outputs = self.forward(batch)
        for name in ("logits", "pred_boxes"):
            setattr(outputs, name, getattr(outputs, name).float())
        found = self.processor.post_process_object_detection(outputs, threshold=float(self.params["threshold"]),
                                                             target_sizes=self.target_sizes(batch))
        keys = ("boxes", "labels", "scores")
        columns = {key: host([item[key] for item in found]) for key in keys}  # one transfer per column
        return [{key: columns[key][i] for key in keys} for i in range(len(found))]

    def label(self, batch: LabelBatch) -> list[Any]:
        values = []
        for image, found in zip(batch.images, self.predict(batch)):
            order = np.argsort(-found["scores"], kind="stable")[: int(self.params["max_boxes"])]
            height, width = image.shape[:2]
            boxes = [tuple(float(v) for v in found["boxes"][i]) for i in order]
            names = [self._classes[int(found["labels"][i])] for i in order]
            values.append(format_det(boxes, names, width, height) or None)
        return check_labels(self, batch, values)
