"""Boxes from transformers' object-detection networks (the DETR family, RT-DETR, ...), in 4M's det format.

Config: ``name: hf_det``, ``weights``: the model folder, ``params``: ``threshold`` (default 0.6, 4M-21's score
threshold for its ViTDet boxes), ``max_boxes`` (default 64: the highest-scoring ones, ties in the model's order),
``bf16`` (default true). Boxes come from the processor's ``post_process_object_detection`` at the photo's size,
binned as :func:`fourm_kfp.data.modalities.format_det` bins them, in order of score. A class name is one word of the
det text, so the model's names are written with ``_`` for spaces ("traffic light" -> "traffic_light"); that list
is the det vocabulary the dataset records. A photo with no box above the threshold has no det label (None).

COCO detectors in DETR's layout (DETR, Conditional and Deformable DETR, YOLOS, ... as published) keep COCO's 91
category ids, 11 of which no class uses: their ``id2label`` names them :data:`PLACEHOLDER_NAME`. Those ids are no
class: they are not in the vocabulary, and a box of one is never written. Any other name two ids share (once
written as one word) is refused when the labeler is built, naming the names and the folder.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, ClassVar, Mapping

import numpy as np

from fourm_kfp.data.modalities import format_det
from fourm_kfp.labelers.base import LabelBatch, LabelerError, LabelerSetup, check_labels
from fourm_kfp.labelers.teachers.loading import TransformersTeacher, auto_model_types, host
from fourm_kfp.labelers.teachers.segmentation import vocabulary


#: the ``id2label`` name of an id no class uses, in DETR's 91-id COCO layout
PLACEHOLDER_NAME = "N/A"


def det_name(name: str) -> str:
    """A class name as one word of the det text."""
    return "_".join(name.split())


def det_names_by_id(names: tuple[str, ...], where: str) -> tuple[str | None, ...]:
    """The det word of each class id (None for a :data:`PLACEHOLDER_NAME` id); ``names`` is the model's id2label in
    id order. Two ids of one word are refused, naming them."""
    words = tuple(None if name == PLACEHOLDER_NAME else det_name(name) for name in names)
    ids_of: dict[str, list[int]] = defaultdict(list)
    for class_id, word in enumerate(words):
        if word is not None:
            ids_of[word].append(class_id)
    shared = {word: ids for word, ids in ids_of.items() if len(ids) > 1}
    if shared:
        listed = "; ".join(f"{word!r} (ids {', '.join(f'{i} {names[i]!r}' for i in ids)})"
                           for word, ids in sorted(shared.items()))
        raise LabelerError(f"{where}: the class names of its id2label are not distinct once written as one word "
                           f"each: {listed}; only {PLACEHOLDER_NAME!r} (an id no class uses) may repeat")
    return words


class DetectionTeacher(TransformersTeacher):
    name: ClassVar[str] = "hf_det"
    #: 2: "N/A" placeholder ids (DETR's 91-id COCO layout) are no class and never written (a folder with one "N/A" id
    #: wrote "N/A" boxes before)
    version: ClassVar[str] = "2"
    modality = "det"
    model_class: ClassVar[str] = "AutoModelForObjectDetection"
    reads_models: ClassVar[str] = "object-detection models"
    defaults: ClassVar[Mapping[str, Any]] = {"threshold": 0.6, "max_boxes": 64, "bf16": True}

    def __init__(self, setup: LabelerSetup) -> None:
        super().__init__(setup)
        self.check_number("threshold", 0.0, 1.0)
        self.check_number("max_boxes", 1, integer=True)
        where = f"labeler {self.name!r}: {self.folder}"
        self._names_by_id = det_names_by_id(vocabulary(self.config, where), where)
        self._classes = tuple(word for word in self._names_by_id if word is not None)

    def accepted_model_types(self) -> frozenset[str]:
        return auto_model_types("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES")

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
            order = [i for i in np.argsort(-found["scores"], kind="stable")
                     if self._names_by_id[int(found["labels"][i])] is not None][: int(self.params["max_boxes"])]
            height, width = image.shape[:2]
            boxes = [tuple(float(v) for v in found["boxes"][i]) for i in order]
            names = [self._names_by_id[int(found["labels"][i])] for i in order]
            values.append(format_det(boxes, names, width, height) or None)
        return check_labels(self, batch, values)
